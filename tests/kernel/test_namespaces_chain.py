"""Both ways of making and entering a sandbox's namespaces, for real as root: the exec helper's
``namespaces``/``enter`` modes and the shell chain's ``unshare(1)``/``nsenter`` (used where the
helper was not built). Each must give the same private places, loopback and IPC namespace, and
leave nothing once removed."""

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.isolation.base import Identity
from sandboxd.isolation.exec.helper import HELPER
from sandboxd.isolation.namespaces.mounts import MountCalls, is_mount_point
from sandboxd.isolation.namespaces.pins import Namespaces, home_coverable
from sandboxd.isolation.namespaces.server import NamespaceServer
from sandboxd.isolation.network.modes import NoNetwork
from tests.kernel.kernel_ns import (
    CREATORS,
    RID,
    SHARED,
    every_layer,
    make_creator,
    run_in,
    shared_root,
)

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="namespaces need root"),
]


@pytest.fixture
def root() -> Iterator[Path]:
    """A state root under /tmp (so the kept directory is bound back, as in the test set-ups)."""
    with shared_root("chain-") as path:
        yield path


def pins_of(ns: Namespaces, *more: str) -> list[str]:
    """The files of a sandbox's pins directory: a pin per layer (``pid``'s init's pid too)."""
    pid = ["init", "pid"] if "pid" in ns.kinds else []
    return sorted(["ipc", "mnt", "net", *pid, *more])


@pytest.mark.parametrize("which", CREATORS)
def test_made_entered_and_removed(root: Path, which: str) -> None:
    ns = every_layer(root, which)
    assert ns.keep == [str(SHARED)]
    ns.prepare()
    try:
        assert is_mount_point(ns.nsroot)
        tmp, workspace = root / RID / "tmp", root / RID / "workspace"
        tmp.mkdir(parents=True)
        workspace.mkdir()
        (workspace / "mine.txt").write_text("in the workspace")
        ns.create(RID, str(tmp), str(workspace), NoNetwork())
        assert sorted(os.listdir(root / ".ns" / RID)) == pins_of(ns)
        script = (
            "readlink /proc/self/ns/ipc; echo inside > /tmp/mine; ls /dev/shm | wc -l;"
            f" ip -o link | cut -d: -f2; test -d {root} && echo kept;"
            " ls -A /home | tr '\\n' ,; echo; cat /home/user/mine.txt | tr ' ' _"
        )
        ipc, shm, link, kept, *home = run_in(ns, RID, which, script).split()
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


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


@pytest.mark.parametrize("which", CREATORS)
def test_the_hosts_later_mounts_reach_every_sandbox_and_none_goes_back(
    root: Path, which: str
) -> None:
    """A sandbox's mounts are slaves of the host's: what the host mounts in a shared place
    later reaches the sandboxes made before and after it (the helper's server makes each from
    its template, made before), and what is mounted in a sandbox stays there: neither the host
    nor another sandbox sees it."""
    place = root / "place"
    place.mkdir()
    mount("-t", "tmpfs", "-o", "size=1m,mode=0755", "place", str(place))
    try:
        mount("--make-shared", str(place))
        ns = every_layer(root, which)
        ns.prepare()
        before, after = RID, "fedcba9876543210"
        try:
            for rid in (before, after):
                for name in ("tmp", "workspace"):
                    (root / rid / name).mkdir(parents=True)
            ns.create(
                before, str(root / before / "tmp"), str(root / before / "workspace"), NoNetwork()
            )
            (place / "later").mkdir()
            mount("-t", "tmpfs", "-o", "size=1m", "later", str(place / "later"))
            (place / "later" / "seen").write_text("from the host")
            ns.create(
                after, str(root / after / "tmp"), str(root / after / "workspace"), NoNetwork()
            )
            for rid in (before, after):
                inside = place / f"inside-{rid}"
                script = (
                    f"cat {place}/later/seen; mkdir {inside};"
                    f" mount -t tmpfs -o size=1m inside {inside}; touch {inside}/mine"
                )
                assert run_in(ns, rid, which, script) == "from the host"
                assert os.listdir(inside) == [], "a sandbox's mount reached the host"
            seen = run_in(ns, after, which, f"ls -A {place}/inside-{before}")
            assert seen == "", "a sandbox's mount reached another sandbox"
        finally:
            ns.remove(before)
            ns.remove(after)
            ns.close()
    finally:
        subprocess.run(["umount", "-R", "-l", str(place)], check=False, timeout=30)


@pytest.mark.parametrize("which", CREATORS)
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


@pytest.mark.parametrize("which", CREATORS)
def test_the_sandbox_uid_has_a_name_inside_and_the_host_no_change(root: Path, which: str) -> None:
    ns = every_layer(root, which)
    ns.prepare()
    host_passwd, host_group = Path("/etc/passwd").read_bytes(), Path("/etc/group").read_bytes()
    try:
        tmp, workspace = root / RID / "tmp", root / RID / "workspace"
        tmp.mkdir(parents=True)
        workspace.mkdir()
        identity = Identity(612345, 612346)
        ns.create(RID, str(tmp), str(workspace), NoNetwork(), (identity, "/the/home"))
        assert sorted(os.listdir(root / ".ns" / RID)) == pins_of(ns, "group", "passwd")
        script = "getent passwd user; getent group user; getent passwd root | cut -d: -f1"
        inside = run_in(ns, RID, which, script).split()
        assert inside == [
            "user:x:612345:612346:user:/the/home:/bin/sh",
            "user:x:612346:",
            "root",
        ]
        assert Path("/etc/passwd").read_bytes() == host_passwd
        assert Path("/etc/group").read_bytes() == host_group
        ns.remove(RID)
        assert not (root / ".ns" / RID).exists()
    finally:
        ns.remove(RID)
        ns.close()
