"""Shared kernel quotas of root (issue 29): a few sandboxes' watch streams must not use up the
inotify watches of root, which every root process of the host shares.

A real daemon as root (real isolation, and ``--isolation=none``, which gives sandboxes uids of
the pool too), three sandboxes each with a tree of directories and a recursive watch stream on
it; then each sandbox makes many more directories in its tree, which the daemon's watches
follow. To make the attack quick, ``fs.inotify.max_user_watches`` is lowered for the test to
what root held before plus :data:`HEADROOM`: more than one sandbox's watches, fewer than all
of theirs (restored in a ``finally``, and by a watchdog of its own if the test is killed). With
the watches charged to each sandbox's uid, every stream starts and follows its whole tree, and
a watch of the test's own (root's) still succeeds; charged to root (the old code), the
sandboxes' watches fill root's limit to the brim and the test's own ``inotify_add_watch`` is
refused with ``ENOSPC``.

A daemon started as a user cannot charge another uid: every sandbox's watches are that user's,
and the daemon keeps them within a budget under the user's limits (a quarter of them left to the
user's other processes, a quarter of the rest at most per sandbox). With the limit lowered to
:data:`USER_LIMIT` before it starts, the sandboxes' trees outgrow their shares, and a process of
the daemon's user still adds a watch; without the budget, it is refused with ``ENOSPC``.
"""

import contextlib
import errno
import http.client
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.core.watch.inotify import Inotify
from tests.support.daemon import Daemon, reachable_root, start_daemon, stop_daemon
from tests.support.uids import uid_block

pytestmark = pytest.mark.kernel

SANDBOXES = 3
DIRS = 100
"""Directories of each sandbox's tree when its watch starts (it takes one more, for the tree)."""
GROWN = 300
"""Directories each sandbox then makes in a new one of its tree (followed: one more watch)."""
WATCHES = DIRS + 1 + GROWN + 1
"""What each sandbox's watch holds once it followed its whole tree."""
HEADROOM = 600
"""Watches root may take beyond what it held when the test began: more than one sandbox's
tree, fewer than all of theirs."""
USER_LIMIT = 800
"""The daemon's user's watches in the second test: a budget of 600, 150 per sandbox."""
SHARE = 150
LIMIT = Path("/proc/sys/fs/inotify/max_user_watches")
WATCHDOG_SECONDS = 180
"""When the watchdog puts the limit back if the test could not (killed meanwhile)."""


def root_watches() -> int:
    """The inotify watches that root's processes hold now (each process's inotify descriptors'
    ``inotify wd:`` lines)."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            status = (proc / "status").read_text().splitlines()
            euid = next(line.split()[2] for line in status if line.startswith("Uid:"))
            if euid == "0":
                total += watches_of(proc)
    return total


def watches_of(proc: Path) -> int:
    """The inotify watches of the process at ``proc`` (``/proc/PID``)."""
    total = 0
    for fd in (proc / "fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd) == "anon_inode:inotify":
                info = (proc / "fdinfo" / fd.name).read_text().splitlines()
                total += sum(line.startswith("inotify wd:") for line in info)
    return total


@contextlib.contextmanager
def watch_limit(limit: int) -> Iterator[None]:
    """``fs.inotify.max_user_watches`` at ``limit`` meanwhile; put back after, whatever
    happens (a watchdog in a session of its own does it if this process is killed)."""
    before = LIMIT.read_text().strip()
    watchdog = subprocess.Popen(
        ["sh", "-c", f"sleep {WATCHDOG_SECONDS}; echo {before} > {LIMIT}"],
        start_new_session=True,
    )
    try:
        LIMIT.write_text(f"{limit}\n")
        yield
    finally:
        LIMIT.write_text(f"{before}\n")
        watchdog.kill()
        watchdog.wait()


def root_can_watch(directory: Path) -> OSError | None:
    """Whether this (root) process can still add an inotify watch: ``None``, or the error."""
    ino = Inotify()
    fd = ino.open()
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ino.watch_dir(fd, dir_fd)
    except OSError as e:
        return e
    finally:
        os.close(dir_fd)
        os.close(fd)
    return None


def make_dirs(daemon: Daemon, rid: str, script: str) -> None:
    status, body = daemon.call("POST", f"/sandboxes/{rid}/exec", {"cmd": ["sh", "-c", script]})
    assert status == 200, body
    frames = [json.loads(line) for line in body.splitlines()]
    assert frames[-1].get("exit") == 0, frames


def settled_watches(daemon: Daemon, expected: int) -> int:
    """The watches the daemon holds once it holds ``expected``, or once their number stopped
    changing (a few seconds), at most half a minute on."""
    proc = Path(f"/proc/{daemon.process.pid}")
    deadline = time.monotonic() + 30
    held, since = watches_of(proc), time.monotonic()
    while held != expected and time.monotonic() < min(deadline, since + 3):
        time.sleep(0.2)
        now = watches_of(proc)
        if now != held:
            held, since = now, time.monotonic()
    return held


def open_watch(daemon: Daemon, rid: str) -> tuple[int, http.client.HTTPConnection]:
    """A recursive watch stream on the sandbox's tree: its status, and (200) its connection,
    open once the first frame came (the watches are then in place)."""
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    connection.request("GET", f"/sandboxes/{rid}/watch?root=/tree")
    response = connection.getresponse()
    if response.status == 200:
        assert json.loads(response.readline()) == {}
    return response.status, connection


def sandboxes_with_trees(daemon: Daemon) -> list[str]:
    """:data:`SANDBOXES` new sandboxes, each with a tree of :data:`DIRS` directories."""
    rids = [daemon.create() for _ in range(SANDBOXES)]
    for rid in rids:
        make_dirs(daemon, rid, f"mkdir tree && cd tree && mkdir $(seq -f d%g {DIRS})")
    return rids


def watch_and_grow(
    daemon: Daemon, rids: list[str], streams: list[http.client.HTTPConnection]
) -> list[int]:
    """A watch stream on each sandbox's tree (its connection added to ``streams``), then
    :data:`GROWN` more directories in each tree; the streams' statuses."""
    statuses = []
    for rid in rids:
        status, connection = open_watch(daemon, rid)
        statuses.append(status)
        streams.append(connection)
    for rid in rids:
        make_dirs(daemon, rid, f"mkdir tree/more && cd tree/more && mkdir $(seq {GROWN})")
    return statuses


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_sandboxes_watches_leave_root_its_own(tmp_path: Path, isolation: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("the daemon is root's only as root")
    low, high = uid_block()
    try:
        daemon = start_daemon(
            tmp_path, f"--isolation={isolation}", f"--uid-min={low}", f"--uid-max={high}"
        )
    except AssertionError as e:
        pytest.skip(f"the daemon cannot isolate here: {str(e).strip().splitlines()[-1]}")
    streams: list[http.client.HTTPConnection] = []
    try:
        rids = sandboxes_with_trees(daemon)
        with watch_limit(root_watches() + HEADROOM):
            statuses = watch_and_grow(daemon, rids, streams)
            held = settled_watches(daemon, SANDBOXES * WATCHES)
            refused = root_can_watch(tmp_path)
        print(f"\nwatch streams {statuses}, the daemon holds {held} watches; root: {refused}")
        assert refused is None or refused.errno != errno.ENOSPC, "root's watches are used up"
        assert refused is None, refused
        assert statuses == [200] * SANDBOXES
        assert held == SANDBOXES * WATCHES
    finally:
        for connection in streams:
            connection.close()
        stop_daemon(daemon)


def user_can_watch(uid: int, directory: Path) -> int:
    """Whether a process of ``uid`` can add an inotify watch on ``directory``: ``0``, or the
    ``errno`` it was refused with (a child that changes its uid and tries)."""
    ino = Inotify()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, which exits at once
        code = 1
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            ino.watch_dir(ino.open(), dir_fd)
            code = 0
        except OSError as e:
            code = e.errno or 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_daemon_started_as_a_user_leaves_that_user_its_own(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the test starts the daemon as another user")
    user, _ = uid_block()
    root = reachable_root(tmp_path)
    os.chown(root, user, user)
    streams: list[http.client.HTTPConnection] = []
    with watch_limit(USER_LIMIT):
        drop = ("setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--")
        daemon = start_daemon(tmp_path, "--isolation=none", wrapper=drop)
        try:
            statuses = watch_and_grow(daemon, sandboxes_with_trees(daemon), streams)
            held = settled_watches(daemon, SANDBOXES * SHARE)
            refused = user_can_watch(user, root)
            print(f"\nas uid {user}: streams {statuses}, the daemon holds {held}; user: {refused}")
            assert refused != errno.ENOSPC, "the user's watches are used up"
            assert refused == 0, os.strerror(refused)
            assert statuses == [200] * SANDBOXES
            # Each followed its tree until its share was taken (a walk cut short keeps the
            # room it was given: the budget errs on the side of the user).
            assert SANDBOXES * (DIRS + 1) < held <= SANDBOXES * SHARE
        finally:
            for connection in streams:
                connection.close()
            stop_daemon(daemon)
