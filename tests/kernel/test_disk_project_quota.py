"""ext4 and XFS project quotas for real, in the VM of ``tests/vm/run.sh`` (Debian's 6.1 kernel;
this host's kernel has no ext4/XFS quotas, where the tests skip).

Each test makes its own loop-mounted filesystem with project quotas enforced as the state root,
and a daemon with ``SANDBOXD_DISK_MAX`` and ``SANDBOXD_FILES_MAX``: a sandbox runs into each
limit (``EDQUOT``), its upload is refused (``507``: the daemon's own writes for it are held to
the limit although ext4 exempts ``CAP_SYS_RESOURCE``), its neighbour writes, uploads and a new
sandbox is made; the same attack with no limit fills the filesystem.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sandboxd.isolation.disk import project_ioctl as q
from tests.kernel.disk_fs import loop_filesystem, root_on, sh, stats, upload
from tests.process.conftest import start_daemon, stop_daemon

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="loop mounts and real isolation need root"),
]

MiB = 1 << 20
LIMIT = 16 * MiB
FILES = 300
FILL = "timeout -s KILL 120 dd if=/dev/zero of={path} bs=1M count={count} 2>&1"
MANY = (
    "mkdir many && cd many || exit 4; i=0; while [ $i -lt 2000 ]; do"
    " echo x > f$i 2>/dev/null || { echo stopped at $i; exit 3; }; i=$((i+1)); done; echo all"
)


def project_quota_problem(kind: str) -> str | None:
    """Why this machine cannot mount ``kind`` with project quotas (``None``: it can)."""
    if shutil.which(f"mkfs.{kind}") is None:
        return f"no mkfs.{kind}"
    try:
        with loop_filesystem(kind, 64 if kind == "ext4" else 320):
            return None
    except subprocess.CalledProcessError as e:
        return f"{' '.join(e.cmd)}: {(e.stderr or b'').decode(errors='replace').strip()}"


@pytest.mark.parametrize("limited", [True, False], ids=["limits", "no-limit"])
@pytest.mark.parametrize("kind", ["ext4", "xfs"])
def test_project_quota_holds_a_sandbox_to_its_limits(
    tmp_path: Path, kind: str, limited: bool
) -> None:
    problem = project_quota_problem(kind)
    if problem is not None:
        pytest.skip(f"no {kind} project quotas here (the VM's kernel has them): {problem}")
    size = 128 if kind == "ext4" else 320  # XFS's smallest filesystem is 300 MiB
    with loop_filesystem(kind, size) as mount:
        root_on(tmp_path, mount)
        base = 500_000 + (abs(hash(str(tmp_path))) % 2000) * 16
        args = [f"--uid-min={base}", f"--uid-max={base + 15}", "--memory-max=256M"]
        if limited:
            args += [f"--disk-max={LIMIT}", f"--files-max={FILES}"]
        daemon = start_daemon(tmp_path, *args)
        try:
            assert ("isolation.disk" in daemon.json("GET", "/healthz")["capabilities"]) is limited
            attacker, neighbour = daemon.create(), daemon.create()
            code, out, _ = sh(daemon, attacker, MANY)
            if limited:
                assert code == 3 and "stopped at" in out, out
                # Its files, "many", and the layout's own 4 inodes: the limit (ready marker unmade).
                assert stats(daemon, attacker)["files"] == FILES + 5
                assert sh(daemon, attacker, "rm -r many")[0] == 0
            code, out, _ = sh(daemon, attacker, FILL.format(path="big", count=size + 16))
            assert code != 0, out
            # XFS answers a full project with ENOSPC (the tree is "a filesystem" to its users).
            refused = "Disk quota exceeded" if limited and kind == "ext4" else "No space left"
            assert refused in out, out
            assert upload(daemon, attacker, "/up", 4 * MiB) == 507
            assert "up" not in sh(daemon, attacker, "ls")[1].split()

            code, out, _ = sh(daemon, neighbour, FILL.format(path="data", count=4))
            status = upload(daemon, neighbour, "/up", 2 * MiB)
            if limited:
                assert code == 0, out
                assert status == 204
                assert daemon.call("POST", "/sandboxes", {})[0] == 200
                usage = stats(daemon, attacker)
                assert usage["disk_limit_bytes"] == LIMIT
                assert usage["files_limit"] == FILES + 5
                assert LIMIT - MiB <= usage["disk_bytes"] <= LIMIT  # type: ignore[operator]
                assert daemon.call("DELETE", f"/sandboxes/{attacker}")[0] == 204
                fresh = daemon.create()
                assert stats(daemon, fresh)["disk_bytes"] < MiB  # type: ignore[operator]
            else:  # the proof: the same attack, without the layer, starves the neighbour
                assert code != 0 and "No space left on device" in out, out
                assert status == 507
            assert daemon.call("GET", "/healthz")[0] == 200
        finally:
            stop_daemon(daemon)


def test_one_limit_leaves_the_other_unlimited() -> None:
    """``SANDBOXD_DISK_MAX`` alone, then ``SANDBOXD_FILES_MAX`` alone: one ``Q_SETQUOTA``
    sets the one limit and clears the other (0: none), as read back from the kernel."""
    problem = project_quota_problem("ext4")
    if problem is not None:
        pytest.skip(f"no ext4 project quotas here (the VM's kernel has them): {problem}")
    project = 4242
    with loop_filesystem("ext4", 64) as mount:
        fd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY)
        try:
            q.set_limits(fd, project, 8 * MiB, None)
            block = q.get_quota(fd, project)
            assert (block.bhardlimit, block.ihardlimit) == (8 * MiB // q.QUOTA_BLOCK, 0)
            q.set_limits(fd, project, None, 100)
            block = q.get_quota(fd, project)
            assert (block.bhardlimit, block.ihardlimit) == (0, 100)
        finally:
            os.close(fd)
