"""A live view of a sandbox's workspace under one root: each change as a plain event.

A :class:`WorkspaceWatch` owns one inotify descriptor, read by the reactor. Watches are
added by :func:`add_tree` in a file thread running with the sandbox's filesystem
credentials (it opens each directory without following links, from the workspace down:
the watch sees only what the sandbox may see). Recursive watches follow new directories as
they appear. A full kernel queue is reported as an ``overflow`` event (walk again). The watch
ends when its consumer closes it or the sandbox dies (:attr:`WatchEvent.gone`).
"""

import errno
import os
from collections.abc import Callable
from typing import Any

from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFDSet, IReadDescriptor
from twisted.python.failure import Failure
from zope.interface import implementer

from sandboxd.core.files.paths import Parts
from sandboxd.core.files.workspace import parent_of, translate
from sandboxd.core.watch import inotify
from sandboxd.core.watch.inotify import IN_IGNORED, IN_ISDIR, IN_Q_OVERFLOW, Inotify

READ_SIZE = 1 << 16
DIRS_MAX = 8192
"""Directories one recursive watch follows at most (past that: ``overflow``)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@frozen
class WatchEvent:
    """A change: ``kind`` (``create``, ``write``, ``remove``, ``rename``, ``chmod``,
    ``overflow``), the ``/``-rooted workspace path, whether it is a directory; or ``gone``:
    the sandbox died."""

    kind: str
    path: str | None = None
    is_dir: bool = False
    gone: bool = False


def display(parts: Parts) -> str:
    return "".join(f"/{p}" for p in parts)


def add_tree(
    ino: Inotify, fd: int, workspace: str, parts: Parts, recursive: bool, room: int
) -> list[tuple[int, Parts]]:
    """Watch the directory ``parts`` (and, ``recursive``, every directory below it, at most
    ``room`` in all): its ``(wd, parts)`` pairs. Run with the sandbox's fs credentials."""
    added: list[tuple[int, Parts]] = []
    with parent_of(workspace, parts) as parent:
        name = parts[-1] if parts else "."
        top = os.open(name, _DIR_FLAGS, dir_fd=parent)
    pending: list[tuple[int, Parts]] = [(top, parts)]
    try:
        while pending:
            dir_fd, where = pending.pop()
            try:
                added.append((ino.watch_dir(fd, dir_fd), where))
                if not recursive:
                    continue
                with os.scandir(dir_fd) as entries:
                    names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
                for entry in names:
                    if len(added) + len(pending) >= room:
                        raise OSError(errno.ENOSPC, "too many directories to watch")
                    try:
                        pending.append((os.open(entry, _DIR_FLAGS, dir_fd=dir_fd), (*where, entry)))
                    except OSError:
                        continue  # removed, swapped or unreadable meanwhile: not watched
            finally:
                os.close(dir_fd)
    finally:
        for dir_fd, _ in pending:
            os.close(dir_fd)
    return added


@implementer(IReadDescriptor)
class WorkspaceWatch:
    """Watches a sandbox's workspace under ``root``; ``deliver(event)`` for each change."""

    def __init__(
        self,
        reactor: IReactorFDSet,
        run_as_sandbox: Callable[[Callable[[str], Any]], "Deferred[Any]"],
        root: Parts,
        recursive: bool,
        deliver: Callable[[WatchEvent], None],
        ino: Inotify | None = None,
        on_close: Callable[[], None] = lambda: None,
    ) -> None:
        self.reactor = reactor
        self.run_as_sandbox = run_as_sandbox
        self.root = root
        self.recursive = recursive
        self.deliver = deliver
        self.on_close = on_close
        self.ino = ino or Inotify()
        self.fd = self.ino.open()
        self.paths: dict[int, Parts] = {}
        self.closed = False
        self._overflowed = False

    async def start(self) -> None:
        """Add the watches (``PathNotFound``/``BadRequest`` as a file call would raise),
        then read events."""
        try:
            await self._add(self.root, DIRS_MAX)
        except OSError as e:
            self.close()
            raise translate(e, self.root) from None
        if not self.closed:
            self.reactor.addReader(self)

    async def _add(self, parts: Parts, room: int) -> None:
        ino, fd, recursive = self.ino, self.fd, self.recursive
        added = await self.run_as_sandbox(lambda ws: add_tree(ino, fd, ws, parts, recursive, room))
        self.paths.update(added)

    def close(self, gone: bool = False) -> None:
        """Stop watching; with ``gone`` (the sandbox died) the consumer is told last."""
        if self.closed:
            return
        self.closed = True
        self.reactor.removeReader(self)
        os.close(self.fd)
        self.on_close()
        if gone:
            self.deliver(WatchEvent("gone", gone=True))

    # IReadDescriptor

    def fileno(self) -> int:
        return -1 if self.closed else self.fd

    def logPrefix(self) -> str:
        return "WorkspaceWatch"

    def connectionLost(self, reason: Failure) -> None:
        self.close()

    def doRead(self) -> None:
        try:
            buffer = os.read(self.fd, READ_SIZE)
        except BlockingIOError:
            return
        for raw in inotify.parse(buffer):
            self._event(raw)

    def _event(self, raw: inotify.RawEvent) -> None:
        if raw.mask & IN_Q_OVERFLOW:
            self.deliver(WatchEvent("overflow"))
            return
        where = self.paths.get(raw.wd)
        if where is None:
            return
        if raw.mask & IN_IGNORED:
            del self.paths[raw.wd]
            return
        kind = inotify.kind_of(raw.mask)
        if kind is None or not raw.name:
            return  # the watched directory itself: its parent's watch reports it
        parts = (*where, raw.name)
        is_dir = bool(raw.mask & IN_ISDIR)
        self.deliver(WatchEvent(kind, display(parts), is_dir))
        if is_dir and kind == "create" and self.recursive:
            room = DIRS_MAX - len(self.paths)
            added = Deferred.fromCoroutine(self._add(parts, room))
            added.addErrback(self._not_added, parts)

    def _not_added(self, failure: Failure, parts: Parts) -> None:
        error = failure.value
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            if not self._overflowed:
                self._overflowed = True
                self.deliver(WatchEvent("overflow"))
            return
        # Gone or swapped before it could be watched: nothing under it to report.
