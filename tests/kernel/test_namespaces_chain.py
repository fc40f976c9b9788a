"""Both ways of making and entering a sandbox's namespaces, for real as root: the exec helper's
``namespaces``/``enter`` modes and the shell chain's ``unshare(1)``/``nsenter`` (used where the
helper was not built). Each must give the same private places, loopback and IPC namespace, and
leave nothing once removed."""

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.isolation.helper import HELPER, helper_problem
from sandboxd.isolation.mounts import MountCalls, is_mount_point
from sandboxd.isolation.namespace_server import NamespaceServer
from sandboxd.isolation.namespaces import (
    KINDS,
    PLACES,
    Creator,
    HelperCreator,
    Namespaces,
    home_coverable,
    kept_directories,
)
from sandboxd.isolation.namespaces_shell import ShellCreator, ShellPrograms
from sandboxd.isolation.network import HostNetwork, NetworkPolicy, NoNetwork

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="namespaces need root"),
]

SHARED = Path("/tmp/sandboxd-tests")
RID = "0123456789abcdef"


def creators() -> list[str]:
    return ["helper-server", "helper", "shell"]


def make_creator(which: str) -> Creator:
    if which.startswith("helper"):
        problem = helper_problem(HELPER, as_root=True)
        if problem is not None:
            pytest.skip(problem)
        return HelperCreator(HELPER)
    return ShellCreator(ShellPrograms.find())


@pytest.fixture
def root() -> Iterator[Path]:
    """A state root under /tmp (so the kept directory is bound back, as in the test set-ups)."""
    SHARED.mkdir(mode=0o711, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="chain-", dir=SHARED))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("which", creators())
def test_made_entered_and_removed(root: Path, which: str) -> None:
    creator = make_creator(which)
    policy = NetworkPolicy({"none": NoNetwork(), "host": HostNetwork()}, ("none", "host"), "none")
    ns = Namespaces(
        kinds=frozenset(KINDS),
        nsroot=str(root / ".ns"),
        network=policy,
        creator=creator,
        keep=kept_directories(PLACES, [str(root)]),
        shm_bytes=8 << 20,
        nsenter=shutil.which("nsenter"),
    )
    if which == "helper-server":
        ns.run = NamespaceServer(HELPER)
    assert ns.keep == [str(SHARED)]
    ns.prepare()
    try:
        assert is_mount_point(ns.nsroot)
        tmp, workspace = root / RID / "tmp", root / RID / "workspace"
        tmp.mkdir(parents=True)
        workspace.mkdir()
        (workspace / "mine.txt").write_text("in the workspace")
        ns.create(RID, str(tmp), str(workspace), NoNetwork())
        assert sorted(os.listdir(root / ".ns" / RID)) == ["ipc", "mnt", "net"]
        script = (
            "readlink /proc/self/ns/ipc; echo inside > /tmp/mine; ls /dev/shm | wc -l;"
            f" ip -o link | cut -d: -f2; test -d {root} && echo kept;"
            " ls -A /home | tr '\\n' ,; echo; cat /home/user/mine.txt | tr ' ' _"
        )
        argv = ["/bin/sh", "-c", script]
        if which.startswith("helper"):
            argv = [HELPER, "session", "/", *argv]
        done = subprocess.run(
            ns.enter(RID, argv), capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode == 0, done
        ipc, shm, link, kept, *home = done.stdout.split()
        assert ipc != os.readlink("/proc/self/ns/ipc")
        assert (shm, link, kept) == ("0", "lo", "kept")
        if home_coverable():  # only the workspace in /home; the host's is out of sight
            assert home == ["user,", "in_the_workspace"]
        assert (tmp / "mine").read_text() == "inside\n"
        assert not Path("/tmp/mine").exists()
        ns.remove(RID)
        assert not (root / ".ns" / RID).exists()
        assert RID not in Path("/proc/self/mountinfo").read_text()
    finally:
        ns.remove(RID)
        ns.close()
    assert not is_mount_point(str(root / ".ns"))


@pytest.mark.parametrize("which", creators())
def test_a_kernel_refusal_stops_start_up_naming_the_layer(root: Path, which: str) -> None:
    ns = Namespaces(
        kinds=frozenset({"ipc"}),
        nsroot=str(root / ".ns"),
        creator=make_creator(which),
        run=lambda argv: (125, "sandboxd-exec: unshare i: Operation not permitted"),
    )
    with pytest.raises(Exception, match=r"namespaces ipc:.*Operation not permitted"):
        ns.prepare()
    ns.close()
    assert not (root / ".ns").exists()


def test_unmount_all_of_nothing_mounted(root: Path) -> None:
    MountCalls().unmount_all(str(root))
    assert root.is_dir()


def test_the_server_answers_a_refusal_and_serves_on(root: Path) -> None:
    make_creator("helper")
    server = NamespaceServer(HELPER)
    nsroot = root / ".ns"
    try:
        nsroot.mkdir()
        mounts = MountCalls()
        mounts.bind(str(nsroot), str(nsroot))
        mounts.make_private(str(nsroot))
        tmp = root / "tmp"
        tmp.mkdir()
        # No pins' directory for this sandbox: the pin is refused, the holder let go.
        code, message = server(
            [HELPER, "namespaces", str(nsroot), RID, "i", str(tmp), str(tmp), "1048576"]
        )
        assert code == 125 and f"pin {nsroot}/{RID}/ipc" in message, message
        assert (
            server([HELPER, "namespaces", str(nsroot), RID, "x", str(tmp), str(tmp), "1"])[0] == 0
        )
        (nsroot / RID).mkdir()
        assert server(
            [HELPER, "namespaces", str(nsroot), RID, "im", str(tmp), str(tmp), "1048576"]
        ) == (
            0,
            "",
        )
        assert sorted(os.listdir(nsroot / RID)) == ["ipc", "mnt"]
    finally:
        server.close()
        for name in ("ipc", "mnt"):
            mounts.unmount_all(str(nsroot / RID / name))
        mounts.unmount_all(str(nsroot))
