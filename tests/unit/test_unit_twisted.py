"""Every poke of ``sandboxd._twisted`` into Twisted's private API, pinned against the installed
Twisted: an upgrade that removes or renames one fails here, by name."""

from __future__ import annotations

import errno
import fcntl
import os
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import abstract, reactor
from twisted.internet.defer import Deferred
from twisted.internet.process import ProcessReader
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.testing import StringTransport
from twisted.web.http import HTTPChannel

from sandboxd import _twisted


class Ended(ProcessProtocol):
    def __init__(self) -> None:
        self.ended: Deferred[None] = Deferred()

    def processEnded(self, reason: Any) -> None:
        self.ended.callback(None)


@pytest_twisted.ensureDeferred
async def test_a_spawned_process_has_output_readers_whose_read_can_be_replaced() -> None:
    protocol = Ended()
    process = reactor.spawnProcess(
        protocol, "/bin/true", ["true"], env={}, childFDs={0: "w", 1: "r", 2: "r"}
    )
    readers = _twisted.output_readers(process)
    assert len(readers) == 2 and all(isinstance(r, ProcessReader) for r in readers)
    reader = readers[0]
    assert callable(reader.doRead)
    original = reader.doRead
    _twisted.replace_read(reader, original)
    assert reader.doRead is original
    await protocol.ended
    assert _twisted.output_readers(object()) == []


def test_socket_sizes_are_class_attributes_of_connections() -> None:
    from twisted.internet.abstract import FileDescriptor

    assert isinstance(FileDescriptor.bufferSize, int)
    assert isinstance(FileDescriptor.SEND_LIMIT, int)
    transport = StringTransport()
    _twisted.set_socket_sizes(transport, 3, 4)
    assert (transport.bufferSize, transport.SEND_LIMIT) == (3, 4)  # type: ignore[attr-defined]


def test_the_bad_request_hook_is_twisted_webs() -> None:
    assert callable(HTTPChannel._respondToBadRequestAndDisconnect)
    calls: list[str] = []

    class Channel(_twisted.BadRequestChannel):
        def bad_request(self) -> None:
            calls.append("bad")

    channel = Channel()
    channel._respondToBadRequestAndDisconnect()
    assert calls == ["bad"]


def test_the_default_bad_request_answer_is_twisted_webs() -> None:
    channel = _twisted.BadRequestChannel()
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.bad_request()
    assert transport.value().startswith(b"HTTP/1.1 400 Bad Request")
    assert _twisted.CHECKED_AGAINST and os.sep


def test_the_request_line_of_a_channel_reading_headers() -> None:
    seen: list[tuple[bytes, bytes]] = []

    class Channel(HTTPChannel):
        def allHeadersReceived(self) -> None:
            seen.append(_twisted.request_line(self))
            super().allHeadersReceived()

    channel = Channel()
    channel.makeConnection(StringTransport())
    channel.dataReceived(b"PUT /a?b=c HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\n")
    assert seen == [(b"PUT", b"/a?b=c")]
    channel.connectionLost(None)


class Pipes(Ended):
    def __init__(self) -> None:
        super().__init__()
        self.closed: list[int] = []
        self.out = b""

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        self.out += data

    def childConnectionLost(self, childFD: int) -> None:
        self.closed.append(childFD)


async def _until(predicate: Any) -> None:
    while not predicate():
        d: Deferred[None] = Deferred()
        reactor.callLater(0.001, d.callback, None)
        await d


@pytest_twisted.ensureDeferred
async def test_a_served_process_is_twisteds_process_with_its_pid_given_later() -> None:
    from twisted.internet import process as twisted_process

    # What ServedProcess takes from Process, by name (the rest is Process's own behaviour).
    for name in ("pipes", "proto", "_reactor", "lostProcess"):
        assert name in twisted_process.Process.__init__.__code__.co_names or hasattr(
            twisted_process.Process, name
        ), name
    assert callable(twisted_process._BaseProcess.reapProcess)
    devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    protocol = Pipes()
    served = _twisted.ServedProcess(reactor, protocol, {0: devnull, 1: "r", 2: "r"})
    actions = [(os.POSIX_SPAWN_DUP2, served.child_side[fd], fd) for fd in (0, 1, 2)]
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", "echo hi"], {}, file_actions=actions)
    os.close(devnull)
    served.connect()  # the child's ends closed, ours read by the reactor
    assert set(served.pipes) == {1, 2}
    await _until(lambda: len(protocol.closed) == 2)  # both pipes ended before the answer
    assert not protocol.ended.called
    served.answered(pid)  # reaped at once: it has exited
    await protocol.ended
    assert protocol.out == b"hi\n" and pid not in twisted_process.reapProcessHandlers


@pytest_twisted.ensureDeferred
async def test_a_refused_served_process_closes_its_pipes_and_never_ends() -> None:
    protocol = Pipes()
    served = _twisted.ServedProcess(reactor, protocol, {0: "w", 1: "r", 2: "r"})
    copies = [os.dup(fd) for fd in served.child_side.values()]  # the server's, until it answers
    served.connect()
    served.refused()
    await _until(lambda: len(protocol.closed) == 3)
    assert served.pipes == {} and not protocol.ended.called
    for fd in copies:
        os.close(fd)


def test_a_channel_handling_a_request_is_taken_over_with_what_it_buffered() -> None:
    """``HTTPChannel._dataBuffer`` holds what came past a request being handled; taken over,
    the channel passes every later byte to the new protocol, which is told of the loss first,
    then the channel's own ``connectionLost`` runs."""
    from twisted.internet.protocol import Protocol
    from twisted.web.http import Request

    events: list[Any] = []
    held: list[Request] = []

    class Held(Request):
        def process(self) -> None:
            held.append(self)

    class Channel(HTTPChannel):
        def connectionLost(self, reason: Any = None) -> None:
            events.append("channel lost")
            super().connectionLost(reason)

    class Taker(Protocol):
        def dataReceived(self, data: bytes) -> None:
            events.append(data)

        def connectionLost(self, reason: Any = None) -> None:
            events.append("taker lost")

    channel = Channel()
    channel.requestFactory = Held
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(b"GET /ws HTTP/1.1\r\nhost: x\r\n\r\nearly")
    assert len(held) == 1  # handled, not finished: what follows is buffered
    taker = Taker()
    assert _twisted.take_over_channel(channel, taker) == b"early"
    assert taker.transport is transport
    channel.dataReceived(b"late")
    channel.connectionLost(None)
    assert events == [b"late", "taker lost", "channel lost"]


@pytest_twisted.ensureDeferred
async def test_a_child_is_reaped_by_its_pidfd_and_its_end_told() -> None:
    """Not through Twisted's table: its SIGCHLD handling never calls ``waitpid`` for it."""
    from twisted.internet.process import reapProcessHandlers

    ended: list[str] = []
    sleeper = os.posix_spawn("/bin/sleep", ["sleep", "30"], {})
    _twisted.reap_when_ended(reactor, sleeper, lambda: ended.append("sleeper"))
    assert _twisted.reap_handled(sleeper) and sleeper not in reapProcessHandlers
    await _until(lambda: True)  # a turn of the reactor: still running, nothing
    assert ended == [] and _twisted.reap_handled(sleeper)
    os.kill(sleeper, 9)
    await _until(lambda: bool(ended))
    assert ended == ["sleeper"] and not _twisted.reap_handled(sleeper)
    with pytest.raises(ChildProcessError):
        os.waitpid(sleeper, os.WNOHANG)  # reaped

    done = os.posix_spawn("/bin/true", ["true"], {})
    os.waitid(os.P_PID, done, os.WEXITED | os.WNOWAIT)  # ended before it is watched
    _twisted.reap_when_ended(reactor, done, lambda: ended.append("done"))
    await _until(lambda: len(ended) == 2)
    assert ended == ["sleeper", "done"] and not _twisted.reap_handled(done)
    assert not _twisted.reap_handled(os.getpid())


def test_without_a_pidfd_a_child_is_reaped_through_twisteds_table(monkeypatch: Any) -> None:
    """No descriptor left (``EMFILE``): Twisted's SIGCHLD handling reaps it after all."""
    from twisted.internet.process import reapAllProcesses, reapProcessHandlers

    def exhausted(pid: int) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(os, "pidfd_open", exhausted)
    ended: list[str] = []
    sleeper = os.posix_spawn("/bin/sleep", ["sleep", "30"], {})
    _twisted.reap_when_ended(reactor, sleeper, lambda: ended.append("sleeper"))
    assert sleeper in reapProcessHandlers and _twisted.reap_handled(sleeper)
    reapAllProcesses()  # still running: nothing
    assert ended == []
    os.kill(sleeper, 9)
    os.waitid(os.P_PID, sleeper, os.WEXITED | os.WNOWAIT)
    reapAllProcesses()
    assert ended == ["sleeper"] and not _twisted.reap_handled(sleeper)
    assert sleeper not in reapProcessHandlers

    done = os.posix_spawn("/bin/true", ["true"], {})
    os.waitid(os.P_PID, done, os.WEXITED | os.WNOWAIT)  # reaped as it is registered
    _twisted.reap_when_ended(reactor, done, lambda: ended.append("done"))
    assert ended == ["sleeper", "done"] and not _twisted.reap_handled(done)


def poll_reactor(kind: str, by_round: bool) -> Any:
    """A reactor of our own, of Twisted's ``kind``, handing events out by round or as is."""
    from twisted.internet.epollreactor import EPollReactor
    from twisted.internet.pollreactor import PollReactor

    own = EPollReactor() if kind == "epoll" else PollReactor()
    if by_round:
        assert _twisted.dispatch_by_round(own)
    return own


@pytest.mark.parametrize("kind", ["epoll", "poll"])
@pytest.mark.parametrize("by_round", [True, False], ids=["by-round", "twisteds-own"])
@pytest.mark.parametrize("lower_freed", [False, True], ids=["pidfd-lowest", "lower-number-freed"])
def test_a_descriptor_made_in_a_round_is_not_handed_a_closed_ones_event(
    kind: str, by_round: bool, lower_freed: bool
) -> None:
    """A child's pipe and its pidfd are ready in the same round of events. The pipe's end
    reaps the child (as ``Process`` does), which closes the pidfd, and a pipe is made in that
    round (the next exec's), taking the pidfd's number: with events handed out by round it is
    not handed the pidfd's event; with Twisted's own loop it is (the stdin pipe that dropped
    its stdin). With ``lower_freed``, a number below the pidfd's is freed as the pipe is made
    (as another thread of the test process may)."""
    own = poll_reactor(kind, by_round)
    lower = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    read_end, write_end = os.pipe()
    child = os.posix_spawn(
        "/bin/true", ["true"], {}, file_actions=[(os.POSIX_SPAWN_DUP2, write_end, 1)]
    )
    os.close(write_end)
    os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)  # ended: pipe and pidfd both ready
    told: list[int] = []
    made: list[int] = []
    spurious: list[int] = []

    class Made(abstract.FileDescriptor):
        """A pipe made in that round: nothing is ever written to it."""

        def __init__(self, fd: int) -> None:
            super().__init__(own)
            self.fd = fd

        def fileno(self) -> int:
            return self.fd

        def doRead(self) -> None:
            spurious.append(self.fd)  # (the last one, after a write, is not spurious)

    class ChildsPipe(abstract.FileDescriptor):
        def fileno(self) -> int:
            return read_end

        def connectionLost(self, reason: Any) -> None:
            watch.reap()
            if lower_freed:
                os.close(lower)
            # The lowest free number, as os.pipe() takes it in the daemon (here, in a test
            # process with lower numbers free, the pidfd's is given outright). Should another
            # thread free a lower number meanwhile, the pipe's write end takes the pidfd's
            # number: it is moved above it before the read end is put there.
            read, write = os.pipe()
            above = fcntl.fcntl(write, fcntl.F_DUPFD_CLOEXEC, pidfd + 1)
            os.close(write)
            if read != pidfd:
                os.dup2(read, pidfd)
                os.close(read)
            made.extend((pidfd, above))
            Made(made[0]).startReading()

    ChildsPipe(own).startReading()  # registered first: its event comes first in the round
    watch = _twisted._ExitWatch(own, child, told.append)
    pidfd = watch.pidfd
    try:
        own.doIteration(0)
        assert told == [0]
        assert made[0] == pidfd  # the pidfd was closed, and its number taken in the round
        assert os.readlink(f"/proc/self/fd/{pidfd}").startswith("pipe:")
        assert spurious == ([] if by_round else [pidfd])
        own.doIteration(0)  # the next round: the new pipe is not readable, and not told so
        assert spurious == ([] if by_round else [pidfd])
        os.write(made[1], b"x")  # now it is: told in the next round (level-triggered)
        own.doIteration(0)
        assert spurious == ([pidfd] if by_round else [pidfd, pidfd])
    finally:
        own.removeAll()
        for fd in (read_end, *made, *([] if lower_freed else [lower])):
            os.close(fd)


def test_only_the_epoll_and_poll_reactors_are_handed_out_by_round() -> None:
    """The select reactor hands out selectables, asyncio cancels a removed reader's callback:
    neither is changed. Asking twice changes a reactor once."""
    from twisted.internet.selectreactor import SelectReactor

    assert not _twisted.dispatch_by_round(SelectReactor())
    own = poll_reactor("epoll", True)
    poller = own._poller
    assert _twisted.dispatch_by_round(own) and own._poller is poller


def test_a_stdin_pipe_ends_only_when_its_reader_has_gone() -> None:
    """Readability of a stdin pipe's writing end (Twisted's read hack) ends the pipe only when
    its reader has gone: an event handed to it that was meant for a descriptor whose number it
    took leaves it open, with what it has to write."""
    from twisted.internet.main import CONNECTION_LOST
    from twisted.internet.testing import MemoryReactor

    reader, writer = os.pipe()
    stdin = _twisted.StdinWriter(MemoryReactor(), None, 0, writer, forceReadHack=True)
    try:
        assert not _twisted.reader_gone(writer)
        assert stdin.doRead() is None  # its reader is there: not its event
        os.close(reader)
        assert _twisted.reader_gone(writer)
        assert stdin.doRead() is CONNECTION_LOST
    finally:
        os.close(writer)
