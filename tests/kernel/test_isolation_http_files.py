"""Real-kernel behaviour suite over HTTP, part 3: the file API stays inside the workspace.

Issue 4, point 5: symlinks (to ``/etc/shadow``, ``/etc``, a world-writable directory outside,
another sandbox's workspace), hardlinks, ``..``, absolute paths, and a path component swapped
for a symlink in a tight loop while thousands of downloads and uploads run: no answer ever
carries an outside file's bytes, and nothing outside the workspace changes.

The outside targets a sandbox's uid *could* reach by itself (``/etc/passwd``, a 0777 directory)
matter most: there only the file API's own care (no link followed, ever) keeps them out.
"""

import os
import random
import stat
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandboxd.web.site import SPOOL_MIN
from tests.kernel.kernel_http import (
    IN_VM,
    SLOW,
    Answer,
    Box,
    KernelDaemon,
    Result,
    digest,
    isolation_problem,
    remove,
    scratch_dir,
    tree_snapshot,
    wait_for,
)

WHY_NOT = isolation_problem()
pytestmark = [pytest.mark.kernel, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

SECRET = b"b's secret: never readable by another sandbox\n"
OUTSIDE = b"outside the workspace: never served, never changed\n"
OWN = b"OWN bytes of the sandbox\n"
BIG = OWN * (SPOOL_MIN // len(OWN) + 1)
"""An upload large enough to be spooled on the workspaces' filesystem, then linked into place."""

RACE_REQUESTS = int(os.environ.get("SANDBOXD_TEST_RACE_REQUESTS", "300" if IN_VM else "2000"))
"""Requests of the swap race (fewer in the VM, where everything runs under emulation)."""

HOST_FILES = ("/etc/passwd", "/etc/shadow", "/etc/group")
TRIED_NAMES = {"pwned", "pwned-dir", "own", "made", "new", "new-dir", "stolen", "x"}
"""Names the tests try to create through links to /etc (none may appear there)."""


@pytest.fixture
def outside() -> Iterator[Path]:
    """A world-writable directory outside every workspace, holding a world-writable file."""
    where = scratch_dir(0o777)
    (where / "passwd").write_bytes(OUTSIDE)
    (where / "passwd").chmod(0o666)
    try:
        yield where
    finally:
        remove(where)


@pytest.fixture
def pair(roomy: KernelDaemon) -> Iterator[tuple[Box, Box]]:
    """Sandbox ``a`` (the attacker) and ``b``, which holds ``secret``."""
    a, b = roomy.create(), roomy.create()
    assert b.upload("secret", SECRET).status == 204
    try:
        yield a, b
    finally:
        a.kill()
        b.kill()


def host_state(outside: Path, other: Box) -> dict[str, object]:
    """What no call on sandbox ``a`` may change."""
    return {
        "host": {path: digest(path) for path in HOST_FILES},
        "etc": sorted(set(os.listdir("/etc")) & TRIED_NAMES),
        "outside": tree_snapshot(outside),
        "other": tree_snapshot(other.workspace),
    }


def refused(answer: Answer) -> bool:
    return 400 <= answer.status < 500


def never_outside(answer: Answer) -> None:
    for path in HOST_FILES:
        first_line = Path(path).read_bytes().split(b"\n", 1)[0]
        assert first_line not in answer.body, (path, answer)
    assert OUTSIDE not in answer.body and SECRET not in answer.body, answer


def test_symlinks_to_outside_never_leak_nor_touch_their_target(
    pair: tuple[Box, Box], outside: Path
) -> None:
    a, b = pair
    links = {
        "shadow": "/etc/shadow",
        "passwd": "/etc/passwd",
        "etc": "/etc",
        "theirs": str(b.workspace / "secret"),
        "their_ws": str(b.workspace),
        "out": str(outside),
        "out_file": str(outside / "passwd"),
        "real/deep": str(outside),
    }
    made = "mkdir real && echo own > real/own && " + " && ".join(
        f"ln -s {target} {name}" for name, target in links.items()
    )
    assert a.run(made).exit == 0
    before = host_state(outside, b)

    reads = ["shadow", "passwd", "theirs", "out_file", "etc/passwd", "etc/shadow"]
    reads += ["their_ws/secret", "out/passwd", "real/deep/passwd"]
    for path in reads:
        answer = a.download(path)
        assert refused(answer), (path, answer)
        never_outside(answer)
        assert a.size(path).json() == {"size": None}, path
        assert a.exists(path).json() == {"exists": False}, path
    for root in ("etc", "their_ws", "out", "real/deep", "shadow"):
        assert a.walk(root).json() == {"entries": []}, root
    walked = a.walk("/").json()["entries"]
    assert [e["path"] for e in walked] == ["/real/own"], walked
    assert a.kd.call("GET", a.url("disk-usage")).json() == {"bytes": 4}

    for path in ("etc/pwned", "their_ws/secret", "their_ws/new", "out/passwd", "out/new"):
        assert refused(a.upload(path, b"pwned")), path
        assert refused(a.mkdir(path + "-dir")), path
    for path in ("etc/passwd", "their_ws/secret", "out/passwd", "real/deep/passwd"):
        assert refused(a.delete(path)), path
    for path in ("etc", "their_ws", "out", "real/deep"):
        assert a.rmdir(path).status == 400, path  # a link is not a directory
    moves = [
        ("their_ws/secret", "stolen"),
        ("out/passwd", "stolen"),
        ("etc/passwd", "stolen"),
        ("real/own", "out/own"),
        ("real/own", "their_ws/own"),
        ("real/own", "etc/own"),
    ]
    for src, dst in moves:
        assert refused(a.rename(src, dst)), (src, dst)
    assert host_state(outside, b) == before

    # What the API may do with a link is what it does to a file: to the link itself.
    assert a.upload("shadow", OWN).status == 204  # replaces the link with a file
    assert a.upload("out_file", OWN).status == 204
    assert a.delete("theirs").status == 204  # removes the link
    assert a.rename("passwd", "moved").status == 204  # moves the link
    assert a.rmdir("real").status == 204  # removes real/deep, the link, not what it points to
    assert a.rename("moved", "etc").status == 204  # a link replaces a link
    for name in ("shadow", "out_file"):
        kept = a.workspace / name
        assert not kept.is_symlink() and kept.read_bytes() == OWN
        assert a.download(name).body == OWN
    assert os.readlink(a.workspace / "etc") == "/etc/passwd"
    assert not (a.workspace / "theirs").exists() and not (a.workspace / "real").exists()
    assert host_state(outside, b) == before


def test_large_uploads_are_the_sandboxs_own_files_and_stay_inside(
    pair: tuple[Box, Box], outside: Path
) -> None:
    """A body spooled by the daemon (root) is handed to the sandbox's uid and linked into
    place with the sandbox's own credentials: the same rules as a small upload."""
    a, b = pair
    links = f"ln -s /etc etc && ln -s {b.workspace} their_ws && ln -s {outside} out"
    assert a.run(f"mkdir real && ln -s /etc/passwd passwd && {links}").exit == 0
    state_root = sorted(os.listdir(a.kd.root))
    before = host_state(outside, b)
    for path in ("etc/pwned", "their_ws/new", "their_ws/secret", "out/new", "out/passwd"):
        answer = a.upload(path, BIG)
        assert refused(answer), (path, answer)
    assert host_state(outside, b) == before
    assert a.upload("real/big", BIG).status == 204
    assert a.upload("passwd", BIG).status == 204  # replaces the link, not /etc/passwd
    uid, gid = a.uid(), int(a.ok("id -g"))
    for name in ("real/big", "passwd"):
        st = (a.workspace / name).lstat()
        assert stat.S_ISREG(st.st_mode), name
        assert (st.st_uid, st.st_gid, st.st_nlink) == (uid, gid, 1), name
        assert a.download(name).body == BIG
    assert a.ok("echo more >> real/big && echo ok") == "ok"  # its own file: writable
    assert sorted(os.listdir(a.kd.root)) == state_root  # no spool left behind
    assert sorted(os.listdir(a.workspace / "real")) == ["big"]
    assert host_state(outside, b) == before


def test_hardlinks_to_outside_files_are_refused(
    pair: tuple[Box, Box], outside: Path, roomy: KernelDaemon
) -> None:
    a, b = pair
    readable = outside / "readable"  # root's, 0644, on the workspace's filesystem
    readable.write_bytes(OUTSIDE)
    readable.chmod(0o644)
    private = outside / "private"
    private.write_bytes(OUTSIDE)
    private.chmod(0o600)

    # The sandbox itself may not link what it does not own where protected_hardlinks is on;
    # where it is off (the VM), it may, and the file API must refuse the link all the same.
    protected = Path("/proc/sys/fs/protected_hardlinks").read_text().strip() == "1"
    attempt = a.run(f"ln {readable} by_sandbox")
    assert (attempt.exit != 0) == protected, attempt
    if attempt.exit != 0:
        os.link(readable, a.workspace / "by_sandbox")
    assert a.run(f"ln {b.workspace}/secret theirs").exit != 0, "cannot even reach it"
    assert a.run("ln /etc/shadow shadow").exit != 0
    # Links only root could make (a restore from a tampered archive, an operator's mistake).
    os.link(private, a.workspace / "private")
    os.link(b.workspace / "secret", a.workspace / "theirs")
    before = host_state(outside, b)

    for path in ("by_sandbox", "private", "theirs"):
        answer = a.download(path)
        assert refused(answer), (path, answer)
        never_outside(answer)
    # Its own files may have as many links as it likes.
    assert a.ok("echo mine > mine && ln mine mine2 && echo ok") == "ok"
    assert a.download("mine2") == Answer(200, b"mine\n")
    assert host_state(outside, b) == before

    # Replacing or deleting a link never touches the file it shares.
    assert a.upload("by_sandbox", OWN).status == 204
    assert a.delete("private").status == 204
    assert a.rename("mine", "theirs").status == 204
    assert readable.read_bytes() == private.read_bytes() == OUTSIDE
    assert (readable.stat().st_nlink, private.stat().st_nlink) == (1, 1)
    assert (b.workspace / "secret").read_bytes() == SECRET
    assert (b.workspace / "secret").stat().st_nlink == 1
    assert a.download("by_sandbox").body == OWN
    assert host_state(outside, b) == before


def test_dotdot_is_refused_and_absolute_paths_stay_in_the_workspace(
    pair: tuple[Box, Box], outside: Path
) -> None:
    a, b = pair
    before = host_state(outside, b)
    escapes = [
        "..",
        "../x",
        f"../{b.rid}/workspace/secret",
        f"../../{b.rid}/workspace/secret",
        "../../../../../../etc/passwd",
        "a/../../etc/passwd",
        "/../etc/shadow",
        "./../.ready",
        "a/b/../../..",
    ]
    for path in escapes:
        for answer in (
            a.download(path),
            a.upload(path, b"pwned"),
            a.delete(path),
            a.rmdir(path),
            a.mkdir(path),
            a.exists(path),
            a.size(path),
            a.walk(path),
            a.rename(path, "x"),
            a.rename("x", path),
        ):
            assert answer.status == 400, (path, answer)
            assert answer.json()["error"] == "BadRequest", (path, answer)
            never_outside(answer)
    # Wire contract v1: a leading "/" is the workspace root, never the host's.
    for path in ("/etc/passwd", "/etc/shadow", str(b.workspace / "secret")):
        answer = a.download(path)
        assert answer.status == 404, (path, answer)
        never_outside(answer)
        assert a.exists(path).json() == {"exists": False}
    assert a.upload("/etc/passwd", OWN).status == 204
    assert (a.workspace / "etc" / "passwd").read_bytes() == OWN
    assert a.download("/etc/passwd").body == OWN
    assert a.delete("/etc/passwd").status == 204
    assert host_state(outside, b) == before


SWAPPER = """\
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
try:
    renameat2 = libc.renameat2
except AttributeError:  # a C library without the wrapper: the raw x86-64 system call
    renameat2 = lambda *a: libc.syscall(316, *a)
end = time.monotonic() + float(sys.argv[1])
swaps = 0
while time.monotonic() < end and not os.path.exists("stop"):
    for link in (b"to_etc", b"to_outside"):
        # "d" becomes the link, then the real directory again: always there, never the same.
        if renameat2(AT_FDCWD, b"d", AT_FDCWD, link, RENAME_EXCHANGE) == 0:
            swaps += 1
        if renameat2(AT_FDCWD, b"d", AT_FDCWD, link, RENAME_EXCHANGE) == 0:
            swaps += 1
print(swaps)
"""


def test_a_component_swapped_for_a_symlink_in_a_tight_loop_never_escapes(
    pair: tuple[Box, Box], outside: Path
) -> None:
    a, b = pair
    setup = f"mkdir d && cp /dev/null d/passwd && ln -s /etc to_etc && ln -s {outside} to_outside"
    assert a.run(setup).exit == 0
    assert a.upload("d/passwd", OWN).status == 204
    before = host_state(outside, b)

    swapper_done: list[Result | BaseException] = []

    def swap() -> None:
        try:
            cmd = ["timeout", "-s", "KILL", "300", "python3", "-c", SWAPPER, "240"]
            swapper_done.append(a.exec(cmd, timeout=300))
        except BaseException as e:
            swapper_done.append(e)

    swapper = threading.Thread(target=swap)
    swapper.start()
    # Swapping has begun once "d" has been seen as a link.
    assert wait_for(lambda: (a.workspace / "d").is_symlink() or not swapper.is_alive(), 60 * SLOW)

    rng = random.Random(4)
    plan = [rng.choice("GGGGPPPPLSEMW") for _ in range(RACE_REQUESTS)]

    def one(kind: str) -> tuple[str, int]:
        if kind == "G":
            answer = a.download("d/passwd")
            assert answer.status != 200 or answer.body.startswith(b"OWN"), answer
        elif kind == "P":
            answer = a.upload("d/passwd", OWN)
        elif kind == "L":
            answer = a.upload("d/passwd", BIG)
        elif kind == "S":
            answer = a.size("d/passwd")
            assert answer.status != 200 or answer.json()["size"] in (None, len(OWN), len(BIG))
        elif kind == "E":
            answer = a.exists("d/passwd")
        elif kind == "M":
            answer = a.mkdir("d/made")
            if answer.status == 204:
                answer = a.rmdir("d/made")
        else:
            answer = a.walk("d")
            if answer.status == 200:
                for entry in answer.json()["entries"]:
                    assert entry["path"].startswith("/d/")
                    assert entry["size"] in (0, len(OWN), len(BIG))
        never_outside(answer)
        assert answer.status < 300 or refused(answer), (kind, answer)
        return kind, answer.status

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            outcomes = Counter(pool.map(one, plan))
    finally:
        stopped = a.upload("stop", b"")
        swapper.join(120)
    assert stopped.status == 204
    assert not swapper.is_alive()
    result = swapper_done[0]
    assert isinstance(result, Result) and result.exit == 0, result
    swaps = int(result.text)
    print(f"swap race: {RACE_REQUESTS} requests against {swaps} swaps: {dict(outcomes)}")
    assert swaps >= 20, "the component really was swapped while the calls ran"
    assert outcomes[("G", 200)] > 0, "some downloads did find the sandbox's own file"
    assert host_state(outside, b) == before
    assert (a.workspace / "d").is_dir() and not (a.workspace / "d").is_symlink()
    assert (a.workspace / "d" / "passwd").read_bytes() in (OWN, BIG)
