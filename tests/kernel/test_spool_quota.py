"""Upload bodies are charged to their sandbox's disk limit while they arrive, on both fronts.

As root, on a loop-mounted state root with ``SANDBOXD_DISK_MAX`` (btrfs, or ext4 with project
quotas: :mod:`tests.kernel.disk_fs`), under the real isolation. The attack: a sandbox's caller
uploads a body several times its quota, slowly, through the E2B front (envd's ``/files``) or
the native API (``PUT /sandboxes/{rid}/file``). While it arrives, the filesystem's free space
is measured: the daemon spools the body inside the sandbox's own directory (its subvolume, its
project), so at most the quota is taken from it, and the neighbour still uploads within its
own quota. The upload ends with the answer a full disk gives (``507``: the E2B SDK's
``NotEnoughSpaceException``). With the body spooled in the state root's shared directory
instead, the same attack takes ~all it sends from the filesystem (the proof that the test can
fail).
"""

import http.client
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.kernel.disk_fs import loop_filesystem, root_on
from tests.kernel.test_disk_project_quota import project_quota_problem
from tests.support.daemon import SLOW, Daemon, free_port, start_daemon, stop_daemon

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="loop mounts and real isolation need root"),
]

FILESYSTEMS = pytest.mark.parametrize("kind", ["btrfs", "ext4"])
"""btrfs (simple quotas: this host, not the VM's 6.1 kernel) and ext4 (project quotas: the VM's
kernel, not this host's, see ``tests/kernel/test_disk_project_quota.py``)."""

MiB = 1 << 20
LIMIT = 32 * MiB
BODY = 128 * MiB
"""The attacker's body: four times its quota."""
MEASURED_AT = 96 * MiB
"""Bytes sent when the free space is measured (three times the quota)."""
SLACK = 12 * MiB
"""What the filesystem may lose beyond the quota meanwhile (metadata, the neighbour's probe)."""
NEIGHBOUR = 8 * MiB
TOKEN = "spool-quota-token"


def free_bytes(mount: Path) -> int:
    """The filesystem's free bytes, once what is written is committed (btrfs counts data at
    its transaction's commit)."""
    subprocess.run(["sync", "-f", str(mount)], check=True, timeout=60)
    st = os.statvfs(mount)
    return st.f_bavail * st.f_frsize


@contextmanager
def daemon_on(kind: str, tmp_path: Path, e2b_port: int) -> Iterator[tuple[Daemon, Path]]:
    """A daemon with the E2B front, each sandbox limited to :data:`LIMIT` bytes, its state root
    a fresh 256 MiB filesystem of ``kind`` (btrfs, or ext4 with project quotas)."""
    if kind == "btrfs" and (os.environ.get("SANDBOXD_VM") == "1" or not shutil.which("mkfs.btrfs")):
        pytest.skip("btrfs simple quotas: on the host (Linux 6.7+, btrfs-progs)")
    problem = project_quota_problem(kind) if kind != "btrfs" else None
    if problem is not None:
        pytest.skip(f"no {kind} project quotas here (the VM's kernel has them): {problem}")
    with loop_filesystem(kind, 256) as mount:
        root_on(tmp_path, mount)
        token = tmp_path / "token"
        token.write_text(TOKEN)
        token.chmod(0o600)
        base = 380_000 + (abs(hash(str(tmp_path))) % 2000) * 16
        daemon = start_daemon(
            tmp_path,
            f"--e2b-listen=tcp:{e2b_port}:interface=127.0.0.1",
            f"--token-file={token}",
            f"--uid-min={base}",
            f"--uid-max={base + 15}",
            "--memory-max=256M",
            f"--disk-max={LIMIT}",
        )
        try:
            yield daemon, mount
        finally:
            stop_daemon(daemon)


def e2b_sandbox(port: int) -> tuple[str, str]:
    """A sandbox made on the E2B front's control plane: its id and access token."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        body = json.dumps({"templateID": "base", "timeout": 300})
        headers = {"X-API-Key": TOKEN, "Content-Type": "application/json"}
        connection.request("POST", "/sandboxes", body, headers)
        answer = connection.getresponse()
        created = json.loads(answer.read())
        assert answer.status == 201, created
    finally:
        connection.close()
    return created["sandboxID"], created["envdAccessToken"]


class SlowUpload:
    """A body of ``length`` bytes sent a MiB at a time on a connection of its own."""

    def __init__(self, port: int, method: str, path: str, headers: dict[str, str], length: int):
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.connection.putrequest(method, path)
        for name, value in {**headers, "Content-Length": str(length)}.items():
            self.connection.putheader(name, value)
        self.connection.endheaders()
        self.sent = 0
        self.length = length

    def send_until(self, bytes_sent: int) -> None:
        chunk = b"s" * MiB
        while self.sent < min(bytes_sent, self.length):
            self.connection.send(chunk)
            self.sent += len(chunk)

    def answer(self) -> tuple[int, bytes]:
        self.send_until(self.length)
        try:
            response = self.connection.getresponse()
            return response.status, response.read()
        finally:
            self.connection.close()


def e2b_upload(port: int, sandbox: tuple[str, str], path: str, length: int) -> SlowUpload:
    headers = {
        "E2b-Sandbox-Id": sandbox[0],
        "X-Access-Token": sandbox[1],
        "Content-Type": "application/octet-stream",
    }
    return SlowUpload(port, "POST", f"/files?path={path}", headers, length)


def native_upload(daemon: Daemon, rid: str, path: str, length: int) -> SlowUpload:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return SlowUpload(daemon.port, "PUT", f"/sandboxes/{rid}/file?path={path}", headers, length)


CHARGED_AT = 16 * MiB
"""Bytes sent when the sandbox's own usage is measured (half its quota)."""


def charged(daemon: Daemon, rid: str, mount: Path) -> int:
    """The bytes the kernel charges to the sandbox ``rid`` now (its qgroup's)."""
    free_bytes(mount)  # committed: counted
    status, body = native_call(daemon, "GET", f"/sandboxes/{rid}/stats")
    assert status == 200, body
    return int(json.loads(body)["disk_bytes"])


def charged_at_least(daemon: Daemon, rid: str, mount: Path, least: int) -> int:
    """The sandbox's usage once it reaches ``least`` bytes (what the daemon read is written
    meanwhile), or as it stands after 30 s."""
    deadline = time.monotonic() + 30 * SLOW
    while (usage := charged(daemon, rid, mount)) < least and time.monotonic() < deadline:
        time.sleep(0.2)
    return usage


def midway(upload: SlowUpload, daemon: Daemon, rid: str, mount: Path, before: int) -> int:
    """Send half the quota: it is charged to the sandbox ``rid``; then the body up to
    :data:`MEASURED_AT`, and let the daemon write what it received: the bytes the filesystem
    lost since ``before``."""
    upload.send_until(CHARGED_AT)
    usage = charged_at_least(daemon, rid, mount, CHARGED_AT // 2)
    assert usage >= CHARGED_AT // 2, f"{usage / MiB:.1f} MiB charged to the sandbox"
    upload.send_until(MEASURED_AT)
    time.sleep(1.0 * SLOW)  # what the daemon read (socket buffers, a write in flight) is written
    lost = before - free_bytes(mount)
    print(f"{upload.sent / MiB:.0f} MiB sent, {lost / MiB:.1f} MiB of the state root taken")
    return lost


@FILESYSTEMS
def test_an_e2b_upload_over_the_quota_takes_nothing_beyond_it(tmp_path: Path, kind: str) -> None:
    port = free_port()
    with daemon_on(kind, tmp_path, port) as (daemon, mount):
        attacker, neighbour = e2b_sandbox(port), e2b_sandbox(port)
        before = free_bytes(mount)
        attack = e2b_upload(port, attacker, "/home/user/big", BODY)
        lost = midway(attack, daemon, attacker[0], mount, before)
        assert lost < LIMIT + SLACK, f"{lost / MiB:.0f} MiB of the state root taken"
        status, body = e2b_upload(port, neighbour, "/home/user/ok", NEIGHBOUR).answer()
        assert status == 200, body
        status, body = attack.answer()
        assert status == 507, body  # the E2B SDK's NotEnoughSpaceException
        assert json.loads(body)["code"] == 507


@FILESYSTEMS
def test_a_native_upload_over_the_quota_takes_nothing_beyond_it(tmp_path: Path, kind: str) -> None:
    with daemon_on(kind, tmp_path, free_port()) as (daemon, mount):
        attacker, neighbour = daemon_create(daemon), daemon_create(daemon)
        before = free_bytes(mount)
        attack = native_upload(daemon, attacker, "big", BODY)
        lost = midway(attack, daemon, attacker, mount, before)
        assert lost < LIMIT + SLACK, f"{lost / MiB:.0f} MiB of the state root taken"
        status, body = native_upload(daemon, neighbour, "ok", NEIGHBOUR).answer()
        assert status == 204, body
        status, body = attack.answer()
        assert status == 507, body
        assert json.loads(body)["error"] == "InsufficientStorage"


def native_call(
    daemon: Daemon, method: str, path: str, body: str | None = None
) -> tuple[int, bytes]:
    """A call of the native API with the token: its status and body."""
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    try:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        connection.request(method, path, body, headers)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def daemon_create(daemon: Daemon) -> str:
    status, body = native_call(daemon, "POST", "/sandboxes", "{}")
    assert status == 200, body
    return str(json.loads(body)["remote_id"])


@FILESYSTEMS
def test_a_sandbox_killed_while_a_body_arrives_is_removed_and_the_upload_cut(
    tmp_path: Path, kind: str
) -> None:
    with daemon_on(kind, tmp_path, free_port()) as (daemon, mount):
        rid = daemon_create(daemon)
        upload = native_upload(daemon, rid, "big", LIMIT // 2)
        upload.send_until(CHARGED_AT // 2)
        assert charged_at_least(daemon, rid, mount, CHARGED_AT // 4) >= CHARGED_AT // 4
        status, body = native_call(daemon, "DELETE", f"/sandboxes/{rid}")
        assert status == 204, body
        assert not (mount / rid).exists()
        with pytest.raises(OSError):  # its connection was closed with the sandbox
            upload.answer()


@FILESYSTEMS
def test_a_native_upload_of_most_of_the_quota_is_linked_not_charged_twice(
    tmp_path: Path, kind: str
) -> None:
    """The spool is in the sandbox's subvolume or project: linked into the workspace, so an
    upload of three quarters of the quota fits (copied, it would take one and a half)."""
    with daemon_on(kind, tmp_path, free_port()) as (daemon, _):
        rid = daemon_create(daemon)
        status, body = native_upload(daemon, rid, "most", LIMIT * 3 // 4).answer()
        assert status == 204, body
