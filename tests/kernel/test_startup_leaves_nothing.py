"""A real ``twistd -n sandboxd`` with real isolation that stops at a boot step leaves nothing.

As root (cgroup v1 on the hybrid hosts: five hierarchies, memory, cpu, cpuacct, pids and
freezer; v2 in the VM): each boot step is made to fail in turn, the daemon must exit non-zero
naming the step, and afterwards no cgroup directory of its instance exists in any hierarchy,
its state root (made for the test, absent before) is gone, and no mount under it is left in
``/proc/self/mountinfo``. Its namespaces' pins are mounted in this mount namespace, so this
process sees them.
"""

import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.isolation.naming import instance_name
from tests.kernel.kernel_http import SLOW, cgroup_dirs_named, isolation_problem, uid_block
from tests.support.coverage import coverage_env
from tests.support.daemon import SHARED_ROOTS, daemon_argv, daemon_environ, free_port

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(isolation_problem() is not None, reason=str(isolation_problem())),
]


@pytest.fixture
def root() -> Iterator[Path]:
    """A state root path that does not exist yet, whose parent sandbox uids can pass."""
    SHARED_ROOTS.mkdir(mode=0o711, exist_ok=True)
    parent = Path(tempfile.mkdtemp(prefix="boot-", dir=SHARED_ROOTS))
    parent.chmod(0o711)
    try:
        yield parent / "root"
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(parent)], check=False)


def run_daemon(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    low, high = uid_block()
    argv = daemon_argv(
        "--isolation=auto", f"--uid-min={low}", f"--uid-max={high}", f"--root={root}", *args
    )
    environ = daemon_environ(coverage_env())
    # A start-up to its failing step: a second or two here, minutes in the emulated VM beside
    # the host suite.
    return subprocess.run(argv, capture_output=True, text=True, timeout=120 * SLOW, env=environ)


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` in this mount namespace."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point == str(path) or point.startswith(f"{path}/"):
            found.append(point)
    return found


def assert_nothing_left(root: Path, result: subprocess.CompletedProcess[str], step: str) -> None:
    said = result.stdout + result.stderr
    assert result.returncode != 0, said
    assert f"start-up failed at {step}:" in said, said
    assert cgroup_dirs_named(instance_name(str(root))) == [], said
    assert not root.exists(), sorted(p.name for p in root.iterdir())
    assert mounts_under(root.parent) == []


def test_a_missing_token_file(root: Path) -> None:
    result = run_daemon(root, f"--token-file={root.parent}/no-such-token")
    assert_nothing_left(root, result, "token")
    assert "No such file or directory" in result.stderr


def test_a_token_file_others_can_read(root: Path) -> None:
    token = root.parent / "token"
    token.write_text("secret\n")
    token.chmod(0o644)
    result = run_daemon(root, f"--token-file={token}")
    assert_nothing_left(root, result, "token")
    assert "must grant group and others no access (chmod 600)" in result.stderr


def test_a_port_another_process_listens_on(root: Path) -> None:
    """The last step: isolation, state root, namespaces were all made, recovery ran."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = run_daemon(root, f"--listen=tcp:{port}:interface=127.0.0.1")
    assert result.returncode == 1
    assert_nothing_left(root, result, "listen")
    assert f"127.0.0.1:{port}: Address already in use" in result.stdout
    assert "recovery done" in result.stdout  # it got that far


def test_isolation_refusing_after_its_cgroups_were_made(root: Path) -> None:
    """The network policy is judged once the driver has made its instance cgroups."""
    result = run_daemon(
        root,
        "--namespaces=ipc",
        "--network=none",
        f"--listen=tcp:{free_port()}:interface=127.0.0.1",
    )
    assert_nothing_left(root, result, "isolation")
    assert "SANDBOXD_NETWORK: network mode none is not available here" in result.stderr


@pytest.mark.parametrize(
    ("step", "args"),
    [
        ("disk", ("--disk-max=1G",)),
        ("namespaces", ("--tools-dir=/home/user/tools",)),
        ("archive", ("--archive-root=/etc/passwd/archive",)),
        ("connections", (f"--max-connections={1 << 40}",)),
    ],
)
def test_a_later_step_refusing(root: Path, step: str, args: tuple[str, ...]) -> None:
    if step == "disk" and subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE,OPTIONS", "-T", str(root.parent)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()[:1] == ["btrfs"]:
        pytest.skip("the test roots are on btrfs, which takes disk limits")
    result = run_daemon(root, f"--listen=tcp:{free_port()}:interface=127.0.0.1", *args)
    assert_nothing_left(root, result, step)
