"""Every use the daemon makes of Twisted's private API, in one place.

Each was checked against Twisted 26.10.0 (the version ``tests/run`` installs) and is pinned by
``tests/unit/test_unit_twisted.py``: an upgrade that removes or renames one fails there first,
by name, not somewhere deep in a stream.
"""

import os
import select
from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet import abstract
from twisted.internet._baseprocess import BaseProcess
from twisted.internet.epollreactor import EPollReactor
from twisted.internet.pollreactor import PollReactor
from twisted.internet.process import (
    Process,
    ProcessReader,
    ProcessWriter,
    reapProcessHandlers,
    registerReapProcessHandler,
    unregisterReapProcessHandler,
)
from twisted.web.http import HTTPChannel

CHECKED_AGAINST = "26.10.0"


def output_readers(process: object) -> list[ProcessReader]:
    """The readers of a spawned process's output pipes.

    ``twisted.internet.process.Process.pipes`` (private: a dict of child fd → reader).
    """
    pipes: dict[int, object] = getattr(process, "pipes", {})
    return [reader for reader in pipes.values() if isinstance(reader, ProcessReader)]


def replace_read(reader: ProcessReader, read: Callable[[], object]) -> None:
    """Make ``reader`` read with ``read`` (``ProcessReader.doRead``, which returns a
    ``CONNECTION_DONE``/``CONNECTION_LOST`` reason or ``None``, as ``fdesc.readFromFD``)."""
    reader.doRead = read  # type: ignore[method-assign]


def set_socket_sizes(transport: Any, read: int, send: int) -> None:
    """Read up to ``read`` and hand the kernel up to ``send`` bytes at a time on a TCP or UNIX
    connection (``twisted.internet.abstract.FileDescriptor.bufferSize`` and ``SEND_LIMIT``,
    undocumented class attributes)."""
    transport.bufferSize = read
    transport.SEND_LIMIT = send


def request_line(channel: HTTPChannel) -> tuple[bytes, bytes]:
    """The method and the path of the request whose headers a channel is reading
    (``HTTPChannel._command`` and ``_path``, set from the request line, deleted once its body is
    in)."""
    return channel._command, channel._path


class BadRequestChannel(HTTPChannel):
    """An ``HTTPChannel`` whose answer to a malformed request is :meth:`bad_request`.

    twisted.web answers a bad request line, too many or too large headers, a bad length or
    chunking through ``HTTPChannel._respondToBadRequestAndDisconnect`` (private).
    """

    def bad_request(self) -> None:
        """Answer a malformed request and close (twisted.web's own answer by default)."""
        super()._respondToBadRequestAndDisconnect()

    def _respondToBadRequestAndDisconnect(self) -> None:
        self.bad_request()


class _RoundPoller:
    """A poll reactor's poller (``_poller``, private) that notes, for each descriptor of the
    round of events it returns, the selectable registered for it at that moment (from the
    reactor's ``_selectables``, private)."""

    def __init__(self, poller: Any, selectables: Mapping[int, object]) -> None:
        self.poller = poller
        self.selectables = selectables
        self.polled: dict[int, object] = {}

    def poll(self, *args: Any) -> list[tuple[int, int]]:
        events: list[tuple[int, int]] = self.poller.poll(*args)
        self.polled = {fd: self.selectables.get(fd) for fd, _ in events}
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self.poller, name)


def dispatch_by_round(reactor: object) -> bool:
    """Make an epoll or poll reactor hand each event of a round only to the selectable that
    was registered for its descriptor when the round was polled; say whether it is one.

    Twisted's loop (``doPoll``) looks each event's selectable up by descriptor number as it
    hands the round out. A handler may stop watching a descriptor and close it, and one made
    later in the round (the next exec's pipe, an accepted socket) may take its number: it was
    handed the closed one's event. A stdin pipe told it was readable took that for its
    reader's end and dropped what it had to write. An event whose selectable has changed is
    dropped instead; both reactors are level-triggered, so whatever is true of the new
    descriptor is reported in the next round. The reactor's private ``_poller``,
    ``_selectables`` and ``_doReadOrWrite`` (the dispatch of one event) are wrapped.

    The other reactors need nothing: the select reactor hands out selectables, not numbers,
    and asyncio cancels a removed reader's pending callback."""
    if not isinstance(reactor, EPollReactor | PollReactor):
        return False
    if isinstance(reactor._poller, _RoundPoller):
        return True
    poller = _RoundPoller(reactor._poller, reactor._selectables)
    dispatch = reactor._doReadOrWrite

    def dispatch_if_polled(selectable: object, fd: int, event: int) -> None:
        if poller.polled.get(fd) is selectable:
            dispatch(selectable, fd, event)

    reactor._poller = poller
    reactor._doReadOrWrite = dispatch_if_polled  # type: ignore[method-assign]
    return True


def reader_gone(fd: int) -> bool:
    """Whether the pipe whose writing end is ``fd`` has no reader left, by ``poll(2)`` now."""
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR, POLLHUP and POLLNVAL are told whatever is asked
    return bool(poller.poll(0))


class StdinWriter(ProcessWriter):
    """A child's stdin pipe (Twisted's ``ProcessWriter``, internal) that believes the read
    hack only when :func:`reader_gone` says so. With the hack on, the writing end of a pipe is
    watched for readability, which means its reader has gone, and what is left to write is
    dropped. But Twisted's epoll reactor hands out the events of one round by descriptor
    number: an event meant for a descriptor closed earlier in that round, whose number this
    pipe took, would end the pipe with the child still reading. :func:`dispatch_by_round`
    drops such events; this check holds under any reactor (docs/spawner-design.rst)."""

    def doRead(self) -> Any:
        if self.enableReadHack and not reader_gone(self.fd):
            return None  # not this pipe's event: it goes on being watched
        return super().doRead()


class ServedProcess(Process):
    """A process transport for a child that another process of ours starts (the spawn server,
    whose children are ours by ``CLONE_PARENT``): Twisted's own ``Process`` pipes, reap and
    ending, with the pid given later, by :meth:`answered`.

    ``Process.__init__`` forks, so it is skipped for ``BaseProcess.__init__`` (private), and
    the attributes it would set are set here: ``pipes`` (child fd → ``ProcessReader`` or
    ``ProcessWriter``, both internal), ``_reactor``. The reap is by the child's pidfd
    (:class:`_ExitWatch`), through ``Process``'s own ``reapProcess`` hook.
    """

    def __init__(self, reactor: Any, proto: Any, child_fds: Mapping[int, int | str]) -> None:
        BaseProcess.__init__(self, proto)
        self._reactor = reactor
        self.pipes: dict[int, Any] = {}
        self.child_side: dict[int, int] = {}
        """The descriptor each child fd is to be (what the spawn server is sent)."""
        self._parent_side: dict[int, tuple[int, str]] = {}
        self._made: list[int] = []
        self._exit_watch: _ExitWatch | None = None
        for child_fd, target in sorted(child_fds.items()):
            if isinstance(target, int):
                self.child_side[child_fd] = target
                continue
            read, write = os.pipe2(os.O_CLOEXEC)
            self._made += [read, write]
            theirs, ours = (write, read) if target == "r" else (read, write)
            self.child_side[child_fd], self._parent_side[child_fd] = theirs, (ours, target)

    def connect(self) -> None:
        """The request is sent: close the child's ends, read and write ours, connect the
        protocol (as ``Process.__init__`` does after its fork)."""
        for child_fd, (ours, target) in self._parent_side.items():
            os.close(self.child_side[child_fd])
            if target == "w":
                self.pipes[child_fd] = StdinWriter(
                    self._reactor, self, child_fd, ours, forceReadHack=True
                )
            else:
                self.pipes[child_fd] = ProcessReader(self._reactor, self, child_fd, ours)
        self._made = []
        assert self.proto is not None
        self.proto.makeConnection(self)

    def abandon(self) -> None:
        """The request could not be sent: close every pipe made for it."""
        for fd in self._made:
            os.close(fd)
        self._made = []

    def answered(self, pid: int) -> None:
        """The child is ``pid``: reap it when its pidfd says it has ended (at once, if it has
        already), not on every SIGCHLD as Twisted's table would (:class:`_ExitWatch`)."""
        self.pid = pid
        self._exit_watch = _ExitWatch(self._reactor, pid, self.processEnded)

    def reapProcess(self) -> None:
        """Reap the child now if it has ended (``Process`` calls this when its pipes close,
        which :meth:`maybeCallProcessEnded` lets it do only once the child is answered)."""
        assert self._exit_watch is not None
        self._exit_watch.reap()

    def refused(self) -> None:
        """No child was made: close the pipes; the protocol is never told ``processEnded``."""
        self.loseConnection()

    def maybeCallProcessEnded(self) -> None:
        if self.pid is None and not self.lostProcess:
            return  # no answer yet (the pipes may end first), or refused
        super().maybeCallProcessEnded()


_watched: set[int] = set()
"""The children an :class:`_ExitWatch` reaps."""


def reap_handled(pid: int) -> bool:
    """Something reaps ``pid`` already: an :class:`_ExitWatch`, or Twisted
    (``twisted.internet.process.reapProcessHandlers``, the private table of pid → process its
    SIGCHLD handling reaps)."""
    return pid in _watched or pid in reapProcessHandlers


class _ExitWatch(abstract.FileDescriptor):
    """Reaps one child of ours when its pidfd becomes readable (it has ended), then tells
    ``ended`` its wait status. Twisted's own reap calls ``waitpid`` for every child in its
    table on every SIGCHLD, so that each exec's end costs one call per live zygote and
    background process; this costs one per end of the child watched. Where no pidfd can be
    had (no descriptor left: ``EMFILE``), the child goes in Twisted's table after all
    (``registerReapProcessHandler``, which calls :meth:`reapProcess` and
    :meth:`processEnded`)."""

    def __init__(self, reactor: Any, pid: int, ended: Callable[[int], None]) -> None:
        super().__init__(reactor)
        self.pid = pid
        self.ended = ended
        _watched.add(pid)
        try:
            self.pidfd = os.pidfd_open(pid)
        except OSError:
            self.pidfd = -1
            registerReapProcessHandler(pid, self)  # ended already: processEnded at once
            return
        self.startReading()

    def fileno(self) -> int:
        return self.pidfd

    def doRead(self) -> None:
        self.reap()

    def reap(self) -> None:
        """Reap the child if it has ended."""
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid:
            self.processEnded(status)

    reapProcess = reap

    def processEnded(self, status: int) -> None:
        """The child is reaped: stop watching, close the pidfd, tell ``ended``."""
        if self.pidfd >= 0:
            self.stopReading()
            os.close(self.pidfd)
        elif self.pid in reapProcessHandlers:  # not when Twisted reaped it as it came in
            unregisterReapProcessHandler(self.pid, self)
        _watched.discard(self.pid)
        self.ended(status)


def reap_when_ended(reactor: Any, pid: int, ended: Callable[[], None]) -> None:
    """Reap child ``pid`` (one that no ``Process`` stands for: a zygote) when it ends, by its
    pidfd (:class:`_ExitWatch`), and then call ``ended``."""
    _ExitWatch(reactor, pid, lambda status: ended())


# Ports: a proxied WebSocket upgrade takes the client's connection over


def take_over_channel(channel: HTTPChannel, protocol: Any) -> bytes:
    """From now on, ``protocol`` (connected to ``channel``'s transport here) gets every byte
    the client sends and is told first when the connection is lost (the channel's own
    ``connectionLost`` runs after it: the site's and gate's bookkeeping). The bytes the channel
    had read past the request (``HTTPChannel._dataBuffer``, private) are returned.

    The same move as ``HTTPChannel._protocolUpgradeForWebsockets`` (private), which replaces
    the channel's ``connectionLost`` instead of running it after."""
    own_lost = channel.connectionLost

    def lost(reason: Any) -> None:
        try:
            protocol.connectionLost(reason)
        finally:
            own_lost(reason)

    buffered = b"".join(channel._dataBuffer)
    channel._dataBuffer = []
    channel.dataReceived = protocol.dataReceived  # type: ignore[method-assign]
    channel.connectionLost = lost  # type: ignore[method-assign]
    protocol.makeConnection(channel.transport)
    return buffered
