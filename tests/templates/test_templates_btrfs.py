"""Templates on a btrfs state root, for real (docs/isolation.rst, "A sandbox from a template"):
a real daemon as root with real isolation whose state root is a loop-mounted btrfs (each
sandbox's directory a subvolume of its own, its quota a simple-quota qgroup), where the other
template tests have the host's filesystem (ext4 here). A template built there (``FROM`` one
copies it with ``--reflink``), sandboxes made from it: each one's writes are its own, the
template is unchanged, a fork diverges after its copy. Nothing here depends on the cgroup
version."""

import io
import os
import re
import subprocess
import tarfile
from collections.abc import Iterator

import pytest

from tests.kernel.disk_fs import loop_filesystem, root_on
from tests.kernel.kernel_http import Box, KernelDaemon, isolation_problem
from tests.support.daemon import stop_daemon
from tests.templates.rootfs import rootfs

pytestmark = [pytest.mark.kernel]

BTRFS_SUBVOLUME_INODE = 256
"""The inode number of every btrfs subvolume's top directory."""


@pytest.fixture(scope="module")
def kd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelDaemon]:
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    if tuple(map(int, re.findall(r"\d+", os.uname().release)[:2])) < (6, 7):
        pytest.skip("the btrfs disk driver's simple quotas need Linux 6.7")
    tmp_path = tmp_path_factory.mktemp("templates-btrfs")
    with loop_filesystem("btrfs", 256) as mount:
        root_on(tmp_path, mount)
        daemon = KernelDaemon.start(tmp_path, "--memory-max=128M", "--disk-max=32M")
        try:
            if "templates.run" not in daemon.call("GET", "/healthz").json()["capabilities"]:
                pytest.skip("no overlay on btrfs here (the daemon's log says why)")
            answer = daemon.client.request("PUT", "/templates/busybox", rootfs())
            assert answer.status == 201, answer
            yield daemon
        finally:
            stop_daemon(daemon.daemon)  # its root is the loop filesystem's, taken down after


def create(kd: KernelDaemon, template: str) -> Box:
    answer = kd.call("POST", "/sandboxes", {"template": template})
    assert answer.status == 200, answer
    box = Box(kd, answer.json()["remote_id"])
    kd.rids.append(box.rid)
    return box


def build(kd: KernelDaemon, name: str, dockerfile: bytes) -> list[str]:
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w") as archive:
        member = tarfile.TarInfo("Dockerfile")
        member.size = len(dockerfile)
        archive.addfile(member, io.BytesIO(dockerfile))
    answer = kd.client.request("POST", f"/templates/{name}/build", body.getvalue(), 120)
    assert answer.status == 200, answer
    return answer.body.decode().splitlines()


def test_the_state_root_is_btrfs_and_each_sandbox_a_subvolume(kd: KernelDaemon) -> None:
    kind = subprocess.run(["stat", "-f", "-c", "%T", str(kd.root)], capture_output=True, text=True)
    assert kind.stdout.strip() == "btrfs", kind
    box = create(kd, "busybox")
    try:
        assert box.directory.stat().st_ino == BTRFS_SUBVOLUME_INODE
    finally:
        box.kill()


def test_sandboxes_of_a_built_template_write_their_own_and_a_fork_diverges(
    kd: KernelDaemon,
) -> None:
    frames = build(kd, "built", b"FROM busybox\nRUN echo built > /built\n")
    assert '"end":"built"' in frames[-1], frames[-3:]
    template = kd.root / ".templates/built/rootfs"
    assert (template / "built").read_bytes() == b"built\n"
    first, second = create(kd, "built"), create(kd, "built")
    try:
        first.ok("echo mine > /scratch/note && echo ws > /home/user/w")
        assert first.ok("cat /scratch/note /built /home/user/w") == "mine\nbuilt\nws"
        assert second.ok("cat /built; ls -A /scratch; ls -A /home/user") == "built"
        assert (template / "built").read_bytes() == b"built\n"
        assert not (template / "scratch/note").exists()
        answer = kd.call("POST", first.url("fork"))
        assert answer.status == 200, answer
        fork = Box(kd, answer.json()["remote_id"])
        kd.rids.append(fork.rid)
        try:
            assert fork.ok("cat /scratch/note /built /home/user/w") == "mine\nbuilt\nws"
            fork.ok("echo forked > /scratch/note && rm /home/user/w")
            first.ok("echo later > /home/user/later")
            assert first.ok("cat /scratch/note /home/user/w") == "mine\nws"
            assert fork.run("cat /home/user/later").exit != 0
            assert fork.directory.stat().st_ino == BTRFS_SUBVOLUME_INODE
        finally:
            fork.kill()
    finally:
        first.kill()
        second.kill()
    assert kd.call("DELETE", "/templates/built").status == 204
