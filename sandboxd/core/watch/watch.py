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
from typing import Any, TypeVar

from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFDSet, IReadDescriptor
from twisted.python.failure import Failure
from zope.interface import implementer

from sandboxd.core.files.paths import Parts
from sandboxd.core.files.workspace import parent_of, translate
from sandboxd.core.watch import inotify
from sandboxd.core.watch.budget import Account
from sandboxd.core.watch.charge import open_charged_to
from sandboxd.core.watch.inotify import (
    IN_CREATE,
    IN_IGNORED,
    IN_ISDIR,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    Inotify,
    RawEvent,
)

T = TypeVar("T")

_MADE_HERE = IN_CREATE | IN_MOVED_TO
"""Event bits that report an entry new in its directory."""

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


@frozen
class Watched:
    """A directory now watched: its watch descriptor, its workspace path, and (recursive
    walks) its ``(name, is_dir)`` entries as listed right after its watch was in place."""

    wd: int
    parts: Parts
    entries: tuple[tuple[str, bool], ...] = ()


def add_tree(
    ino: Inotify, fd: int, workspace: str, parts: Parts, recursive: bool, room: int
) -> list[Watched]:
    """Watch the directory ``parts`` (and, ``recursive``, every directory below it, at most
    ``room`` in all), each listed once its watch is in place. Run with the sandbox's fs
    credentials."""
    added: list[Watched] = []
    with parent_of(workspace, parts) as parent:
        name = parts[-1] if parts else "."
        top = os.open(name, _DIR_FLAGS, dir_fd=parent)
    pending: list[tuple[int, Parts]] = [(top, parts)]
    try:
        while pending:
            dir_fd, where = pending.pop()
            try:
                wd = ino.watch_dir(fd, dir_fd)
                if not recursive:
                    added.append(Watched(wd, where))
                    continue
                with os.scandir(dir_fd) as listing:
                    entries = tuple((e.name, e.is_dir(follow_symlinks=False)) for e in listing)
                added.append(Watched(wd, where, entries))
                for entry, is_dir in entries:
                    if not is_dir:
                        continue
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


def _shielded(work: "Deferred[T]") -> "Deferred[T]":
    """``work``'s result, in a Deferred whose cancellation leaves ``work`` alone (a thread
    cannot be stopped: what it does with the inotify descriptor must be waited for)."""
    out: Deferred[T] = Deferred()

    def settle(result: Any) -> None:
        if out.called:
            return  # cancelled meanwhile: the result is not wanted
        if isinstance(result, Failure):
            out.errback(result)
        else:
            out.callback(result)

    work.addBoth(settle)
    return out


@implementer(IReadDescriptor)
class WorkspaceWatch:
    """Watches a sandbox's workspace under ``root``; ``deliver(event)`` for each change.

    A new directory's watch is added from a file thread: events of its watch read before
    that thread is back are held, and once it is back, what the directory already held
    without an event of its own (made before its watch was in place) is reported as
    created, then the held events follow. Nothing made in a followed directory is missed,
    nothing is reported twice. The inotify descriptor is closed when the watch is closed and
    no file thread uses it any more (its number is never reused under a running walk).
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        run_as_sandbox: Callable[[Callable[[str], Any]], "Deferred[Any]"],
        root: Parts,
        recursive: bool,
        deliver: Callable[[WatchEvent], None],
        ino: Inotify | None = None,
        on_close: Callable[[], None] = lambda: None,
        charged_to: tuple[int, Callable[[int], None]] | None = None,
        account: Account | None = None,
    ) -> None:
        """``charged_to``: ``(uid, set_euid)`` to open the inotify instance as ``uid``, so that
        it and its watches count against that uid's kernel limits (:mod:`.charge`); ``None``:
        against the daemon's own. ``account``: the daemon's budget the watches are taken from
        (:mod:`.budget`; given back as they go, all of it once the descriptor is closed)."""
        self.reactor = reactor
        self.run_as_sandbox = run_as_sandbox
        self.root = root
        self.recursive = recursive
        self.deliver = deliver
        self.on_close = on_close
        self.account = account
        self.ino = ino or Inotify()
        if charged_to is None:
            self.fd = self.ino.open()
        else:
            uid, set_euid = charged_to
            self.fd = open_charged_to(uid, self.ino.open, set_euid)
        self.fd_open = True
        """The inotify descriptor is still open (closed once closed and no walk uses it)."""
        self.paths: dict[int, Parts] = {}
        self.closed = False
        self._overflowed = False
        self._walks = 0
        """File threads running on :attr:`fd` now."""
        self._settling = 0
        """Walks whose watches are being made known now."""
        self._held: list[RawEvent] = []

    async def start(self) -> None:
        """Add the watches (``PathNotFound``/``BadRequest`` as a file call would raise),
        then read events. Any failure, a cancellation too, closes the watch."""
        try:
            await self._add(self.root, DIRS_MAX, follow=False)
        except OSError as e:
            self.close()
            raise translate(e, self.root) from None
        except BaseException:
            self.close()
            raise
        if not self.closed:
            self.reactor.addReader(self)

    async def _add(self, parts: Parts, room: int, follow: bool) -> None:
        if self.account is not None:
            room = self.account.take(room)
            if not room:
                raise OSError(errno.ENOSPC, "the daemon's inotify watches are all in use")
        ino, fd, recursive = self.ino, self.fd, self.recursive
        walk = self.run_as_sandbox(lambda ws: add_tree(ino, fd, ws, parts, recursive, room))
        self._walks += 1
        walk.addBoth(self._walk_done)
        added: list[Watched] = await _shielded(walk)
        if self.closed:
            return
        if self.account is not None:
            self.account.give(room - len(added))  # a failed walk keeps its room till closed
        self._settling += 1
        try:
            self._settle(added, follow)
        finally:
            self._settling -= 1

    def _settle(self, added: list[Watched], follow: bool) -> None:
        """A walk is back: its watches are known from now on; for a followed directory, its
        entries without an event of their own are reported as created, then what was held."""
        if follow:
            self.doRead()  # every event queued so far: those of the new watches are held
        new = {w.wd for w in added}
        self.paths.update((w.wd, w.parts) for w in added)
        held, self._held = self._held, []
        if follow:
            for w in added:
                announced = {raw.name for raw in held if raw.wd == w.wd and raw.mask & _MADE_HERE}
                for name, is_dir in w.entries:
                    if self.closed:
                        return  # its consumer closed it on an event just told
                    if name not in announced:
                        self.deliver(WatchEvent("create", display((*w.parts, name)), is_dir))
        for raw in held:
            if raw.wd in new:
                self._event(raw)
            elif self._walks:
                self._held.append(raw)  # another walk's

    def _walk_done(self, result: Any) -> Any:
        self._walks -= 1
        if self.closed and not self._walks:
            self._release()
        return result

    def _release(self) -> None:
        """Close the descriptor: once, as the watch is closed or its last walk is back
        (whichever is later; a closed watch starts no walk)."""
        self.fd_open = False
        os.close(self.fd)
        if self.account is not None:
            self.account.close()

    def close(self, gone: bool = False) -> None:
        """Stop watching; with ``gone`` (the sandbox died) the consumer is told last."""
        if self.closed:
            return
        self.closed = True
        self.reactor.removeReader(self)
        if not self._walks:
            self._release()
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
        while not self.closed:
            try:
                buffer = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                return
            for raw in inotify.parse(buffer):
                self._event(raw)

    def _event(self, raw: RawEvent) -> None:
        if self.closed:
            return  # its consumer closed it on an event of the same read
        if raw.mask & IN_Q_OVERFLOW:
            self.deliver(WatchEvent("overflow"))
            return
        where = self.paths.get(raw.wd)
        if where is None:
            if self._walks or self._settling:
                self._held.append(raw)  # perhaps a watch a walk is adding: known once back
            return
        if raw.mask & IN_IGNORED:
            del self.paths[raw.wd]
            if self.account is not None:
                self.account.give(1)
            return
        kind = inotify.kind_of(raw.mask)
        if kind is None or not raw.name:
            return  # the watched directory itself: its parent's watch reports it
        parts = (*where, raw.name)
        is_dir = bool(raw.mask & IN_ISDIR)
        self.deliver(WatchEvent(kind, display(parts), is_dir))
        if self.closed:
            return
        if is_dir and kind == "create" and self.recursive and parts not in self.paths.values():
            room = DIRS_MAX - len(self.paths)
            added = Deferred.fromCoroutine(self._add(parts, room, follow=True))
            added.addErrback(self._not_added, parts)

    def _not_added(self, failure: Failure, parts: Parts) -> None:
        error = failure.value
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            if not self._overflowed:
                self._overflowed = True
                self.deliver(WatchEvent("overflow"))
            return
        # Gone or swapped before it could be watched: nothing under it to report.
