"""The runner of a build's ``RUN`` (``sandboxd/core/templates/build_runner.py``, docs/
extensions.rst, "Building a template") as its own program, run as root on a root made in the
test: the command's exit status and output come back, in its user namespace as uid 0."""

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from sandboxd.core.templates import build_runner
from tests.templates.rootfs import rootfs


def test_a_status_is_the_exit_code_or_128_and_the_signal() -> None:
    assert build_runner.status(3 << 8) == 3
    assert build_runner.status(9) == 137


def test_a_failed_call_raises_naming_it() -> None:
    with pytest.raises(OSError) as failed:
        build_runner.check(-1, "mount x")
    assert str(failed.value.strerror).startswith("mount x: ")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("the runner maps the host's ids: it needs root")
    with tarfile.open(fileobj=io.BytesIO(rootfs())) as tar:
        tar.extractall(tmp_path / "rootfs", filter="fully_trusted")
    return tmp_path / "rootfs"


def runner(root: Path, network: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """The runner as the builder starts it, but without ``-I`` (coverage follows it)."""
    command = [sys.executable, build_runner.__file__, str(root), network, "/work", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("network", ["none", "host"])
def test_a_command_runs_as_root_in_the_root_and_its_status_returns(
    root: Path, network: str
) -> None:
    done = runner(root, network, "/bin/sh", "-c", "id -u; pwd; cat /etc/os-release; exit 4")
    assert done.returncode == 4, done.stderr
    assert done.stdout.splitlines()[:2] == ["0", "/work"]
    assert "made-in-test" in done.stdout
    assert (root / "work").is_dir()  # the workdir, made inside the root


def test_a_missing_program_is_127_naming_it(root: Path) -> None:
    done = runner(root, "none", "/no/such")
    assert done.returncode == 127
    assert "sandboxd: cannot run ['/no/such']" in done.stderr


def test_each_leading_join_is_written_then_the_arguments_follow(tmp_path: Path) -> None:
    """``--join=FILE`` (a cgroup's ``tasks`` for the builder; here plain files) gets ``0``;
    a ``--join=`` among the command's own arguments is the command's."""
    one, two = tmp_path / "one", tmp_path / "two"
    arguments = [f"--join={one}", f"--join={two}", "/root", "none", "/", "echo", "--join=x"]
    assert build_runner.join_cgroup(arguments) == ["/root", "none", "/", "echo", "--join=x"]
    assert (one.read_text(), two.read_text()) == ("0", "0")
    assert build_runner.join_cgroup([]) == []


def test_the_runner_joins_a_cgroup_before_its_command_starts(root: Path, tmp_path: Path) -> None:
    """A real cgroup v1 ``pids`` cgroup: the command (in its own PID namespace) is in it."""
    pids = Path("/sys/fs/cgroup/pids")
    if not pids.is_dir():
        pytest.skip("a cgroup v1 pids hierarchy (the host's)")
    group = pids / f"sandboxd-test-runner-{os.getpid()}"
    group.mkdir()
    try:
        command = [sys.executable, build_runner.__file__, f"--join={group}/tasks"]
        command += [str(root), "none", "/", "/bin/cat", "/proc/self/cgroup"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert f"pids:/{group.name}\n" in done.stdout
    finally:
        group.rmdir()


def test_a_host_command_mounts_only_in_a_namespace_of_its_own(tmp_path: Path) -> None:
    """``--host`` (``mmdebstrap``'s way): what the command mounts is gone with it, never a
    mount of the host's (nor left for the build's removal to walk into); a missing program
    is 127 naming it."""
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    target = tmp_path / "mounted"
    target.mkdir()
    script = f"mount -t tmpfs none {target} && touch {target}/inside && ls {target}"
    command = [sys.executable, build_runner.__file__, "--host", "sh", "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    try:
        assert (done.returncode, done.stdout) == (0, "inside\n"), done.stderr
        assert not os.path.ismount(target) and os.listdir(target) == []
    finally:
        if os.path.ismount(target):  # the protection failed: the test takes it down
            subprocess.run(["umount", str(target)], check=False)
    command = [sys.executable, build_runner.__file__, "--host", "/no/such"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 127
    assert "sandboxd: cannot run ['/no/such']" in done.stderr


ORPHANED_MAKER = """
import os, sys
from sandboxd.core.templates import build_runner
ready, go = os.pipe()
os.write(go, b"x")  # its id maps are written
build_runner.command(sys.argv[1], "none", "/", ["/bin/mkdir", "/ran"], ready, 1)
"""
"""The namespaces' maker told that its outer process is pid 1: not its parent, so that
process is gone, as when the daemon is killed between the maker's fork and its
``PR_SET_PDEATHSIG``."""


def test_a_maker_whose_outer_process_is_gone_starts_nothing(root: Path) -> None:
    """The maker follows its parent's death only from its ``prctl`` on: one whose parent
    died before starts no command (137), else the command would outlive its daemon. In a
    mount namespace of its own, so that a maker that goes on changes no mount of the host."""
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            sys.executable,
            "-c",
            ORPHANED_MAKER,
            str(root),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(build_runner.__file__).parents[3])},
    )
    assert done.returncode == 137, done
    assert not (root / "ran").exists()
