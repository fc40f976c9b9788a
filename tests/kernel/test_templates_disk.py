"""A templated sandbox's disk limit counts its own changes to the template's files
(docs/isolation.rst, "A sandbox from a template"): the overlay's upper directory lies in its
disk-limited directory, on a loop-mounted filesystem with project quotas (ext4) or simple
quotas (btrfs), as root with real isolation."""

from pathlib import Path

import pytest

from tests.kernel.disk_fs import loop_filesystem, root_on, stats
from tests.kernel.kernel_http import Box, KernelDaemon, isolation_problem
from tests.kernel.test_disk_project_quota import project_quota_problem
from tests.support.daemon import stop_daemon
from tests.templates.rootfs import rootfs

pytestmark = [pytest.mark.kernel]

MiB = 1 << 20
LIMIT = 16 * MiB
FILL = "head -c {size} /dev/zero > {path}"


@pytest.mark.parametrize("kind", ["ext4", "btrfs"])
def test_changes_to_the_templates_files_are_held_to_the_disk_limit(
    tmp_path: Path, kind: str
) -> None:
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    quota = None if kind == "btrfs" else project_quota_problem(kind)
    if quota is not None:
        pytest.skip(f"no {kind} project quotas here (the VM's kernel has them): {quota}")
    with loop_filesystem(kind, 256) as mount:
        root_on(tmp_path, mount)
        kd = KernelDaemon.start(tmp_path, "--memory-max=128M", f"--disk-max={LIMIT}")
        try:
            if "templates.run" not in kd.call("GET", "/healthz").json()["capabilities"]:
                pytest.skip("no overlay on this filesystem here (the daemon's log says why)")
            assert kd.client.request("PUT", "/templates/busybox", rootfs()).status == 201
            answer = kd.call("POST", "/sandboxes", {"template": "busybox"})
            assert answer.status == 200, answer
            box = Box(kd, answer.json()["remote_id"])
            # The template's own files are not the sandbox's: it starts near empty.
            assert stats(kd.daemon, box.rid)["disk_bytes"] < MiB  # type: ignore[operator]
            over = box.run(FILL.format(size=2 * LIMIT, path="/scratch/big") + "; sync")
            assert b"error" in over.err.lower() or b"quota" in over.err.lower(), over
            written = (box.directory / "root/upper/scratch/big").stat().st_size
            assert written <= LIMIT, written  # held where it is: the upper directory
            used = stats(kd.daemon, box.rid)["disk_bytes"]
            assert used is not None and 8 * MiB < used <= LIMIT + MiB, used
            box.ok("rm /scratch/big; sync")
            box.ok(FILL.format(size=8 * MiB, path="/scratch/again"))  # its room is back
            box.kill()
        finally:
            stop_daemon(kd.daemon)  # its root is the loop filesystem's, taken down after
