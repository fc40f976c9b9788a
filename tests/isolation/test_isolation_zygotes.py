"""The daemon's side of the zygotes (``sandboxd.isolation.exec.zygotes``): a sandbox's zygote,
its start through the spawn server, its life, and what the daemon does with each answer a
zygote can give, true or not (which commands of a sandbox go to its zygote:
tests/isolation/test_isolation_zygote_spec.py). A stand-in spawn server and a stand-in zygote: the
test holds their ends of the sockets, and real children of this process stand for the pids
they answer (the real zygote under real isolation: tests/kernel/test_zygote.py)."""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import sys
from collections.abc import Callable, Iterator

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.process import reapAllProcesses

from sandboxd import _twisted
from sandboxd.core.exec.run import Exited
from sandboxd.isolation.exec.helper import HELPER
from sandboxd.isolation.exec.spawn_server import MESSAGE_MAX, Spawner, SpawnServer, request
from sandboxd.isolation.exec.zygotes import (
    PLACEHOLDER_COMMAND,
    Zygotes,
    ZygoteSpec,
    uid_of,
    unclaimed_child,
)
from tests.isolation.test_isolation_spawn_server import StandIn, exec_run, start

UID = os.getuid()


def exec_argv(*command: str, rid: str = "a") -> list[str]:
    """An exec's helper argv as the daemon builds it, for sandbox ``rid``."""
    pins = [f"/ns/{rid}/ipc", f"/ns/{rid}/pid", f"/ns/{rid}/mnt"]
    return [
        HELPER,
        "enter",
        str(len(pins)),
        *pins,
        HELPER,
        "--umask=077",
        "sandbox",
        str(UID),
        str(UID),
        "/home/user",
        "1",
        f"/cg/{rid}/tasks",
        *command,
    ]


def spec(rid: str = "a") -> ZygoteSpec:
    """Sandbox ``rid``'s zygote as its isolation would make it."""
    return ZygoteSpec(rid, UID, tuple(exec_argv(*PLACEHOLDER_COMMAND, rid=rid)))


def spawn(*argv: str) -> int:
    """A real child of this process (standing for a zygote or the command it forks)."""
    return os.posix_spawn(f"/bin/{argv[0]}", list(argv), {})


@pytest_twisted.ensureDeferred
async def test_only_an_unreaped_child_that_nothing_reaps_is_accepted() -> None:
    assert uid_of(os.getpid()) == UID
    assert not unclaimed_child(os.getpid()), "not a child"
    child = spawn("sleep", "30")
    assert unclaimed_child(child)
    ended: Deferred[None] = Deferred()
    _twisted.reap_when_ended(reactor, child, lambda: ended.callback(None))
    assert not unclaimed_child(child), "reaped by its pidfd already"
    os.kill(child, signal.SIGKILL)
    os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)
    reapAllProcesses()  # Twisted's SIGCHLD handling does not reap it: its pidfd's reader does
    assert os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    await ended
    assert uid_of(child) is None, "gone"


class Zygote:
    """The test's end of a zygote the stand-in server was asked for, and a real child of this
    process standing for it."""

    def __init__(self, fds: list[int], body: bytes) -> None:
        self.sock = socket.socket(fileno=fds[0])
        for fd in fds[1:]:
            os.close(fd)
        self.body = body
        self.pid = spawn("sleep", "30")

    def take(self) -> bytes:
        """One request (its three descriptors closed)."""
        body, fds, _, _ = socket.recv_fds(self.sock, MESSAGE_MAX, 3)
        assert len(fds) == 3
        for fd in fds:
            os.close(fd)
        return body

    def answer(self, value: int) -> None:
        self.sock.send(value.to_bytes(4, sys.byteorder, signed=True))

    def gone(self) -> bool:
        """Its pid was killed (and reaped)."""
        return uid_of(self.pid) is None

    def close(self) -> None:
        self.sock.close()
        if not self.gone():
            os.kill(self.pid, signal.SIGKILL)


async def server_request(stand_in: StandIn) -> tuple[bytes, list[int]]:
    """The next request the stand-in server gets (once the reactor has sent it)."""
    await until(lambda: stand_in.peer is not None)
    peer = stand_in.peer
    assert peer is not None
    await until(lambda: bool(select.select([peer], [], [], 0)[0]))
    body, fds, _, _ = socket.recv_fds(peer, MESSAGE_MAX, 3)
    assert len(fds) == 3
    for fd in fds:
        os.set_inheritable(fd, False)  # recv_fds does not take them close-on-exec
    return body, fds


def answer_server(stand_in: StandIn, value: int) -> None:
    assert stand_in.peer is not None
    stand_in.peer.send(value.to_bytes(4, sys.byteorder, signed=True))


async def until(done: Callable[[], bool]) -> None:
    for _ in range(2500):
        if done():
            return
        d: Deferred[None] = Deferred()
        reactor.callLater(0.002, d.callback, None)
        await d
    raise AssertionError("never")


async def served_by_the_server(
    stand_in: StandIn, body: bytes, told: list[int | OSError], pid: int
) -> None:
    """The exec ``body`` reaches the server, which answers ``pid``; wait until it is told."""
    assert (await server_request(stand_in))[0] == body
    answer_server(stand_in, pid)
    await until(lambda: bool(told))


@pytest.fixture
def stand_in() -> StandIn:
    return StandIn()


@pytest.fixture
def zygotes(stand_in: StandIn) -> Iterator[Zygotes]:
    made = Zygotes(SpawnServer(HELPER, popen=stand_in), quiet=30.0, limit=2, answer_timeout=10.0)
    yield made
    made.close()
    made.server.close()


def never(result: int | OSError) -> None:
    raise AssertionError(result)


async def ready(zygotes: Zygotes, stand_in: StandIn, sandbox: ZygoteSpec, fds: list[int]) -> Zygote:
    """``sandbox`` with a zygote that answers (the first exec: not the zygote's)."""
    body = request(exec_argv("true", rid=sandbox.rid), {})
    assert not zygotes.send(reactor, sandbox, body, fds, never)
    assert not zygotes.send(reactor, sandbox, body, fds, never), "no pid yet"
    started, zygote_fds = await server_request(stand_in)
    assert started == request([sandbox.argv[0], "zygote", *sandbox.argv[1:]], {})
    zygote = Zygote(zygote_fds, started)
    answer_server(stand_in, zygote.pid)
    await until(lambda: zygotes.live[sandbox.rid].pid == zygote.pid)
    return zygote


@pytest_twisted.ensureDeferred
async def test_a_zygote_answers_the_execs_of_its_sandbox_with_its_own_children(
    zygotes: Zygotes, stand_in: StandIn, fds: list[int]
) -> None:
    sandbox = spec()
    zygote = await ready(zygotes, stand_in, sandbox, fds)
    told: list[int | OSError] = []
    body = request(exec_argv("ls", "-l"), {"K": "v"})
    assert zygotes.send(reactor, sandbox, body, fds, told.append)
    assert zygote.take() == body
    child = spawn("true")
    zygote.answer(child)
    await until(lambda: bool(told))
    assert told == [child]
    os.waitpid(child, 0)
    assert not zygotes.send(reactor, spec("b"), body, fds, never), "b's own"
    assert len(zygotes.live) == 2
    assert not zygotes.send(reactor, spec("c"), body, fds, never)
    assert len(zygotes.live) == 2, "at the limit: c's execs go to the server"
    zygotes.close()
    assert zygotes.live == {}
    assert zygote.sock.recv(8) == b"", "retired: its socket ended"
    zygote.close()


@pytest_twisted.ensureDeferred
async def test_an_error_a_lie_or_silence_sends_the_exec_to_the_server(
    zygotes: Zygotes, stand_in: StandIn, fds: list[int]
) -> None:
    argv, sandbox = exec_argv("true"), spec()
    zygote = await ready(zygotes, stand_in, sandbox, fds)
    told: list[int | OSError] = []
    body = request(argv, {})
    assert zygotes.send(reactor, sandbox, body, fds, told.append)
    zygote.take()
    zygote.answer(-errno.EAGAIN)  # its clone at pids.max: the server's child joins past it
    await served_by_the_server(stand_in, body, told, 4343)
    assert told == [4343] and zygotes.live, "the zygote stays"

    for lie in (os.getpid(), zygote.pid, 1):  # not a child; its own pid, reaped already; init
        told.clear()
        assert zygotes.send(reactor, sandbox, body, fds, told.append)
        zygote.take()
        zygote.answer(lie)
        await served_by_the_server(stand_in, body, told, 4444)
        assert told == [4444]
        await until(zygote.gone)  # killed, reaped
        assert zygotes.live == {}, "a liar is retired"
        zygote.close()
        zygote = await ready(zygotes, stand_in, sandbox, fds)

    zygotes.answer_timeout = 0.05
    told.clear()
    assert zygotes.send(reactor, sandbox, body, fds, told.append)
    zygote.take()  # and never answers
    await served_by_the_server(stand_in, body, told, 4545)
    assert told == [4545]
    await until(zygote.gone)
    zygote.close()


@pytest_twisted.ensureDeferred
async def test_a_zygote_that_ends_or_cannot_be_reached_is_replaced(
    zygotes: Zygotes, stand_in: StandIn, fds: list[int]
) -> None:
    argv, sandbox = exec_argv("true"), spec()
    zygote = await ready(zygotes, stand_in, sandbox, fds)
    told: list[int | OSError] = []
    body = request(argv, {})
    assert zygotes.send(reactor, sandbox, body, fds, told.append)
    zygote.take()
    zygote.sock.close()  # it ends with the exec in flight
    await served_by_the_server(stand_in, body, told, 4646)
    assert told == [4646] and zygotes.live == {}
    os.kill(zygote.pid, signal.SIGKILL)

    zygote = await ready(zygotes, stand_in, sandbox, fds)
    os.kill(zygote.pid, signal.SIGKILL)  # its end of the socket stays open: found at the reap
    await until(lambda: zygotes.live == {})
    zygote.close()

    zygote = await ready(zygotes, stand_in, sandbox, fds)
    zygote.sock.shutdown(socket.SHUT_RDWR)  # a send finds it gone: nothing sent
    assert not zygotes.send(reactor, sandbox, body, fds, never)
    assert zygotes.live == {}
    zygote.close()


@pytest_twisted.ensureDeferred
async def test_a_zygote_the_server_cannot_start_is_no_zygote(
    zygotes: Zygotes, stand_in: StandIn, fds: list[int]
) -> None:
    argv, sandbox = exec_argv("true"), spec()
    assert not zygotes.send(reactor, sandbox, request(argv, {}), fds, never)
    _, zygote_fds = await server_request(stand_in)
    for fd in zygote_fds:
        os.close(fd)
    answer_server(stand_in, -errno.EAGAIN)
    await until(lambda: zygotes.live == {})

    assert not zygotes.send(reactor, sandbox, request(argv, {}), fds, never)
    _, zygote_fds = await server_request(stand_in)
    zygote = Zygote(zygote_fds, b"")
    zygotes.close()  # retired before the server's answer: the zygote is told to end
    answer_server(stand_in, zygote.pid)
    assert zygote.sock.recv(8) == b""
    os.kill(zygote.pid, signal.SIGKILL)  # it ends (at its socket's end): reaped, no zombie
    await until(zygote.gone)
    zygote.close()

    assert not zygotes.send(reactor, sandbox, request(argv, {}), fds, never)
    _, zygote_fds = await server_request(stand_in)
    zygote = Zygote(zygote_fds, b"")
    os.kill(zygote.pid, signal.SIGKILL)  # it has ended by the time its pid is known
    os.waitid(os.P_PID, zygote.pid, os.WEXITED | os.WNOWAIT)
    answer_server(stand_in, zygote.pid)
    await until(lambda: zygotes.live == {})
    assert zygote.sock.recv(8) == b""
    zygote.close()

    assert not zygotes.send(reactor, sandbox, request(argv, {}), fds, never)
    zygotes.close()  # retired before the server is asked: it never is
    await _turns(3)
    assert stand_in.peer is not None and not select.select([stand_in.peer], [], [], 0)[0]

    stand_in.ended = -9  # the server is gone: no zygote either
    assert not zygotes.send(reactor, sandbox, request(argv, {}), fds, never)
    await until(lambda: zygotes.live == {})


async def _turns(count: int) -> None:
    for _ in range(count):
        d: Deferred[None] = Deferred()
        reactor.callLater(0.002, d.callback, None)
        await d


@pytest_twisted.ensureDeferred
async def test_neither_zygote_nor_server_is_a_failed_spawn(
    zygotes: Zygotes, stand_in: StandIn, fds: list[int]
) -> None:
    argv, sandbox = exec_argv("true"), spec()
    zygote = await ready(zygotes, stand_in, sandbox, fds)
    told: list[int | OSError] = []
    assert zygotes.send(reactor, sandbox, request(argv, {}), fds, told.append)
    zygote.take()
    stand_in.ended = -9
    zygote.answer(-errno.ENOMEM)
    await until(lambda: bool(told))
    (failed,) = told
    assert isinstance(failed, OSError) and failed.errno == errno.EPIPE
    zygote.close()


@pytest_twisted.ensureDeferred
async def test_a_quiet_zygote_is_retired(stand_in: StandIn, fds: list[int]) -> None:
    zygotes = Zygotes(SpawnServer(HELPER, popen=stand_in), quiet=0.05)
    zygote = await ready(zygotes, stand_in, spec(), fds)
    await until(lambda: zygotes.live == {})
    assert zygote.sock.recv(8) == b""
    zygote.close()
    zygotes.server.close()


@pytest_twisted.ensureDeferred
async def test_the_spawner_hands_an_exec_to_its_sandboxs_zygote(
    zygotes: Zygotes, stand_in: StandIn, fds: list[int]
) -> None:
    argv, sandbox = exec_argv("true"), spec()
    zygote = await ready(zygotes, stand_in, sandbox, fds)
    spawner = Spawner(reactor, zygotes.server, zygotes, sandbox)
    run = exec_run()
    start(spawner, run, argv)
    body, command_fds, _, _ = socket.recv_fds(zygote.sock, MESSAGE_MAX, 3)
    assert body.startswith(b"%d\0" % len(argv))
    sh = os.posix_spawn(
        "/bin/sh",
        ["sh", "-c", "echo out; exit 3"],
        {},
        file_actions=[
            (os.POSIX_SPAWN_DUP2, command_fds[0], 0),
            (os.POSIX_SPAWN_DUP2, command_fds[1], 1),
            (os.POSIX_SPAWN_DUP2, command_fds[2], 2),
        ],
    )
    for fd in command_fds:
        os.close(fd)
    zygote.answer(sh)
    assert await run.when_finished() == Exited(3, b"out\n", b"")
    zygote.close()
