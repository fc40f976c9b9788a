"""Helpers and fixtures of the archive tests: real rsync, real directories, the real reactor.

As root, the workspace end of every copy runs as a real foreign uid through the daemon's chain
for its own work as a sandbox (the exec helper with ``--no-ptrace``, else the shell chain's
``setpriv``), the way the daemon runs it for an isolated sandbox; as a normal user it runs as
that user (a new session, as in ``--isolation=none``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.python.threadpool import ThreadPool

from sandboxd.core.archive.rsync import WorkspaceEnd
from sandboxd.core.archive.store import Archive, build_archive
from sandboxd.core.layout import Layout
from sandboxd.isolation.base import Identity, Wrap
from sandboxd.isolation.exec.helper import HELPER, HelperWrapper
from sandboxd.isolation.exec.wrapper import Programs, Wrapper
from sandboxd.isolation.none import find_program, session_wrapper

ROOT = os.geteuid() == 0
SANDBOX_UID = 236200
"""A uid/gid no other test uses (only when running as root)."""

as_root = pytest.mark.skipif(not ROOT, reason="needs root to run the copy as a foreign uid")


def reactor() -> Any:
    from twisted.internet import reactor

    return reactor


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A fresh directory a sandbox uid can pass through (0711, like the daemon's root)."""
    path = Path(tempfile.mkdtemp(prefix="sandboxd-archive-", dir="/tmp"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pool() -> Iterator[ThreadPool]:
    threads = ThreadPool(minthreads=0, maxthreads=2, name="archive-tests")
    threads.start()
    try:
        yield threads
    finally:
        threads.stop()


@pytest.fixture
def archive(scratch: Path, pool: ThreadPool) -> Archive:
    return build_archive(str(scratch / "archive"), reactor(), pool)


def own_work_wrap() -> Wrap:
    """The chain the daemon starts the workspace end through: as root the helper's (with
    ``--no-ptrace``, as ``select`` builds it) or the shell chain; else a session."""
    if not ROOT:
        return session_wrapper(find_program("setsid"))
    if os.path.exists(HELPER):
        return HelperWrapper(HELPER, seccomp=True, no_ptrace=True)
    return Wrapper(Programs.find())


@attrs.define
class Workspaces:
    """Makes sandbox directories laid out as the daemon does (docs/isolation.rst, "Layout")."""

    layout: Layout
    identity: Identity
    count: int = 0
    wrap: Wrap = attrs.field(factory=own_work_wrap)

    def new(self) -> tuple[Path, WorkspaceEnd]:
        self.count += 1
        rid = f"{self.count:016x}"
        self.layout.create(rid, self.identity)
        path = self.layout.workspace(rid)
        identity, wrap = self.identity, self.wrap
        return Path(path), WorkspaceEnd(path, lambda argv: wrap(identity, (), path, argv))

    def give(self, path: Path) -> None:
        """Hand a tree the test wrote (as root) to the sandbox, as its own files would be."""
        if not ROOT:
            return
        for top, dirs, files in os.walk(path):
            for name in [*dirs, *files]:
                os.lchown(os.path.join(top, name), self.identity.uid, self.identity.gid)


@pytest.fixture
def workspaces(scratch: Path) -> Workspaces:
    identity = Identity(SANDBOX_UID, SANDBOX_UID) if ROOT else Identity(os.getuid(), os.getgid())
    layout = Layout(str(scratch / "root"), owns_files=ROOT)
    layout.prepare_root()
    return Workspaces(layout, identity)


def tree(path: Path) -> dict[str, Any]:
    """Everything under ``path``: file bytes, link targets, directories (links not followed)."""
    found: dict[str, Any] = {}
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(top, name)
            rel = os.path.relpath(full, path)
            if os.path.islink(full):
                found[rel] = ("link", os.readlink(full))
            elif os.path.isdir(full):
                found[rel] = ("dir",)
            else:
                found[rel] = ("file", Path(full).read_bytes())
    return found


def all_bytes(path: Path) -> bytes:
    """The concatenated bytes of every regular file under ``path`` (links not followed)."""
    chunks = []
    for top, _, files in os.walk(path):
        for name in files:
            full = os.path.join(top, name)
            if not os.path.islink(full):
                chunks.append(Path(full).read_bytes())
    return b"\n".join(chunks)
