"""The spawn server's protocol and its fallbacks: the real ``sandboxd-exec spawn-server`` (its
children run the helper's ``session`` path: no root), and a stand-in server process whose end
of the socket the test holds, for the answers a real server gives only under load."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.main import CONNECTION_LOST
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import Clock

from sandboxd.core.exec.run import ExecRun, Exited, Outcome, SpawnFailed
from sandboxd.isolation.exec.helper import HELPER
from sandboxd.isolation.exec.spawn_server import (
    MESSAGE_MAX,
    Answers,
    Spawner,
    SpawnServer,
    answer_of,
    request,
)

built = pytest.mark.skipif(not os.path.exists(HELPER), reason="the helper is not built (no cc)")


class StandIn:
    """A ``Popen`` stand-in: the test keeps the server's end of the socket (``peer``)."""

    def __init__(self, keep: bool = True, ended: int | None = None) -> None:
        self.keep = keep
        self.ended = ended
        self.peer: socket.socket | None = None
        self.pid = 4242

    def __call__(self, argv: list[str], **kwargs: Any) -> StandIn:
        assert argv[1:] == ["spawn-server"]
        if self.keep:
            self.peer = socket.socket(fileno=os.dup(kwargs["stdin"]))
        return self

    def poll(self) -> int | None:
        return self.ended

    def wait(self, timeout: float) -> int:
        return 0

    def answer(self, value: int) -> list[int]:
        """Read one request and answer ``value``; the descriptors it carried."""
        assert self.peer is not None
        _, fds, _, _ = socket.recv_fds(self.peer, MESSAGE_MAX, 3)
        for fd in fds:
            os.close(fd)
        self.peer.send(value.to_bytes(4, sys.byteorder, signed=True))
        return fds


def exec_run() -> ExecRun:
    return ExecRun(
        Clock(), lambda fd, data: None, max_output=1 << 20, log_timeout=None, timeout=None
    )


def start(spawner: Spawner, run: ExecRun, argv: list[str], stdin: bytes | None = None) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        run.start(spawner, argv, {"PATH": "/usr/bin:/bin"}, stdin, devnull)
    finally:
        os.close(devnull)


def session(*argv: str) -> list[str]:
    return [HELPER, "session", "/", *argv]


@pytest.fixture
def server() -> Iterator[SpawnServer]:
    spawn_server = SpawnServer(HELPER)
    yield spawn_server
    spawn_server.close()


def test_a_request_counts_its_arguments_and_keeps_empty_ones() -> None:
    assert request(["a", "", "b"], {"K": "v=1"}) == b"3\0a\0\0b\0K=v=1\0"


def test_answers_are_pids_or_the_errors_they_name() -> None:
    assert answer_of((77).to_bytes(4, sys.byteorder, signed=True)) == 77
    failed = answer_of((-errno.EAGAIN).to_bytes(4, sys.byteorder, signed=True))
    assert isinstance(failed, OSError) and failed.errno == errno.EAGAIN
    assert str(failed) == "[Errno 11] Resource temporarily unavailable"
    for odd in (b"\0\0\0\0", b"\1\0"):
        error = answer_of(odd)
        assert isinstance(error, OSError) and error.errno == errno.EPROTO


@built
@pytest_twisted.ensureDeferred
async def test_the_server_runs_the_helpers_path_with_stdin_output_and_exit_code(
    server: SpawnServer,
) -> None:
    run = exec_run()
    script = "read line; echo out $line; echo err >&2; exit 3"
    start(Spawner(reactor, server), run, session("sh", "-c", script), stdin=b"in\n")
    assert run.pid is None  # the server has yet to answer
    outcome = await run.when_finished()
    assert outcome == Exited(3, b"out in\n", b"err\n")
    assert run.pid is not None and server.pid is not None


@built
@pytest_twisted.ensureDeferred
async def test_a_run_is_started_once_the_server_answers_its_pid(server: SpawnServer) -> None:
    """What a front that answers a background process's pid waits for."""
    run = exec_run()
    start(Spawner(reactor, server), run, session("sleep", "300"))
    waiting = run.when_started()
    assert not waiting.called and run.pid is None
    await waiting
    assert (
        run.pid is not None
        and os.waitid(os.P_PID, run.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    )
    assert run.when_started().called  # from now on, at once
    run.abort()
    assert (await run.when_finished()).code == 128 + 9


@pytest_twisted.ensureDeferred
async def test_a_run_the_server_refuses_or_the_reactor_spawns_is_started_at_once() -> None:
    stand_in = StandIn()
    spawner = Spawner(reactor, SpawnServer(HELPER, popen=stand_in))
    refused = exec_run()
    start(spawner, refused, session("true"))
    waiting = refused.when_started()
    assert not waiting.called
    stand_in.answer(-errno.EAGAIN)
    await waiting
    assert refused.pid is None and isinstance(refused.outcome, SpawnFailed)
    assert refused.when_started().called
    spawned = exec_run()
    start(spawner, spawned, ["sh", "-c", "exit 4"])  # not the helper's: the reactor's
    assert spawned.when_started().called and spawned.pid is not None
    assert (await spawned.when_finished()).code == 4  # type: ignore[union-attr]
    spawner.server.close()


@built
@pytest.mark.parametrize(
    ("cwd", "cmd", "code", "message"),
    [
        ("/nonexistent", "true", 2, b"sandboxd-exec: cd /nonexistent: No such file or directory\n"),
        ("/", "no-such-command", 127, b"sandboxd-exec: no-such-command: command not found\n"),
        ("/", "/etc/passwd", 126, b"sandboxd-exec: /etc/passwd: Permission denied\n"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_the_helpers_failures_are_the_same_through_the_server(
    server: SpawnServer, cwd: str, cmd: str, code: int, message: bytes
) -> None:
    argv = [HELPER, "session", cwd, cmd]
    done = subprocess.run(argv, capture_output=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert (done.returncode, done.stderr) == (code, message)
    run = exec_run()
    start(Spawner(reactor, server), run, argv)
    assert await run.when_finished() == Exited(code, b"", message)


@built
@pytest_twisted.ensureDeferred
async def test_an_abort_and_a_signal_before_the_answer_reach_the_command(
    server: SpawnServer,
) -> None:
    spawner = Spawner(reactor, server)
    killed, signalled = exec_run(), exec_run()
    start(spawner, killed, session("sleep", "300"))
    killed.abort()
    start(spawner, signalled, session("sleep", "300"))
    signalled.signal(signal.SIGTERM)
    assert await killed.when_finished() == Exited(128 + 9, b"", b"", signal=9)
    assert await signalled.when_finished() == Exited(128 + 15, b"", b"", signal=15)


class Plain(ProcessProtocol):
    def __init__(self) -> None:
        self.ended: Deferred[None] = Deferred()

    def processEnded(self, reason: Any) -> None:
        self.ended.callback(None)


@pytest_twisted.ensureDeferred
async def test_other_commands_and_protocols_are_spawned_by_the_reactor() -> None:
    stand_in = StandIn()
    spawner = Spawner(reactor, SpawnServer(HELPER, popen=stand_in))
    run = exec_run()
    start(spawner, run, ["sh", "-c", "exit 4"])
    assert run.pid is not None
    plain = Plain()
    spawner.spawnProcess(plain, HELPER, [HELPER, "session", "/", "true"], env={})
    await plain.ended
    assert (await run.when_finished()).code == 4  # type: ignore[union-attr]
    assert stand_in.peer is None  # never started


def fallback(server: SpawnServer, argv: list[str]) -> Deferred[Outcome]:
    run = exec_run()
    start(Spawner(reactor, server), run, argv)
    assert run.pid is not None, "spawned by the reactor"
    return run.when_finished()


@pytest_twisted.ensureDeferred
async def test_a_request_over_one_message_is_spawned() -> None:
    stand_in = StandIn()
    server = SpawnServer(HELPER, popen=stand_in)
    big = ["x" * (64 << 10)] * (MESSAGE_MAX // (64 << 10))
    outcome = await fallback(server, [HELPER, "session", "/", "sh", "-c", "exit 5", *big])
    assert outcome.code == 5  # type: ignore[union-attr]
    assert stand_in.peer is None


@pytest_twisted.ensureDeferred
async def test_a_server_found_gone_is_replaced_at_the_next_request() -> None:
    stand_in = StandIn()
    server = SpawnServer(HELPER, popen=stand_in)
    spawner = Spawner(reactor, server)
    first = exec_run()
    start(spawner, first, session("true"))
    stand_in.answer(-errno.ENOMEM)
    failed = await first.when_finished()
    assert failed == SpawnFailed(
        f"cannot start the command: [Errno 12] Cannot allocate memory: {HELPER!r}"
    )
    stand_in.ended = -9
    assert (await fallback(server, session("sh", "-c", "exit 6"))).code == 6  # type: ignore[union-attr]
    assert server.pid is None
    stand_in.ended = None
    again = exec_run()
    start(spawner, again, session("true"))
    assert server.pid == stand_in.pid and again.pid is None
    server.close()
    assert await again.when_finished() == SpawnFailed(
        f"cannot start the command: [Errno 32] the spawn server ended: {HELPER!r}"
    )


@pytest_twisted.ensureDeferred
async def test_a_server_that_cannot_be_started_or_closed_its_socket_means_the_reactor() -> None:
    def missing(argv: list[str], **kwargs: Any) -> Any:
        raise FileNotFoundError(argv[0])

    assert (await fallback(SpawnServer(HELPER, popen=missing), session("true"))).code == 0  # type: ignore[union-attr]
    deaf = SpawnServer(HELPER, popen=StandIn(keep=False))  # its end is closed: EPIPE
    assert (await fallback(deaf, session("true"))).code == 0  # type: ignore[union-attr]
    assert deaf.pid is None


@pytest_twisted.ensureDeferred
async def test_a_full_socket_means_the_reactor_and_the_server_stays() -> None:
    stand_in = StandIn()
    server = SpawnServer(HELPER, popen=stand_in)
    fds = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) for _ in range(3)]
    told: list[int | OSError] = []
    try:
        while server.send(reactor, b"1\0true\0", fds, told.append):
            pass
        assert server.pid == stand_in.pid
        assert (await fallback(server, session("true"))).code == 0  # type: ignore[union-attr]
    finally:
        for fd in fds:
            os.close(fd)
    server.close()
    assert told and all(isinstance(e, OSError) and e.errno == errno.EPIPE for e in told)


@pytest_twisted.ensureDeferred
async def test_an_answer_nobody_waits_for_or_the_end_of_the_socket_ends_the_server() -> None:
    stand_in = StandIn()
    server = SpawnServer(HELPER, popen=stand_in)
    run = exec_run()
    start(Spawner(reactor, server), run, session("true"))
    stand_in.answer(-errno.EAGAIN)
    assert stand_in.peer is not None
    stand_in.peer.send((1).to_bytes(4, sys.byteorder))  # unasked
    assert (await run.when_finished()) == SpawnFailed(
        f"cannot start the command: [Errno 11] Resource temporarily unavailable: {HELPER!r}"
    )
    while server.pid is not None:  # the reactor reads the unasked answer: the server is ended
        await _turn()
    stand_in.peer.close()
    assert (await fallback(server, session("true"))).code == 0  # type: ignore[union-attr]
    assert server.pid is None, "the request after the end is spawned"
    later = exec_run()
    start(Spawner(reactor, server), later, session("true"))
    assert server.pid == stand_in.pid and later.pid is None
    server.close()


async def _turn() -> None:
    d: Deferred[None] = Deferred()
    reactor.callLater(0.001, d.callback, None)
    await d


def test_a_broken_socket_is_a_lost_connection() -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # never connected: ENOTCONN
    sock.setblocking(False)
    answers = Answers(reactor, sock, lambda: None)
    assert answers.doRead() is CONNECTION_LOST
    sock.close()
