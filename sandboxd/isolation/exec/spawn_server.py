"""One long-running ``sandboxd-exec spawn-server`` that starts the isolated execs
(``SANDBOXD_SPAWNER=server``, and under the default ``zygote``; the server is
``sandboxd_exec_spawn.h``; docs/operating.rst, "The spawn server").

With ``SANDBOXD_SPAWNER=helper`` an isolated exec is ``reactor.spawnProcess`` of the helper:
``posix_spawnp`` holds the reactor until the child has exec'd the helper, and the helper's own
program start comes before the command's (docs/spawner-design.rst). The server is started once,
at the first exec (after it died, the exec that finds it gone is spawned and the next starts a
new server). Each exec sends it one message: the helper's argv and environment, exactly as they
would be spawned, with the command's stdin, stdout and stderr passed as descriptors. The
server's child, the daemon's own by ``CLONE_PARENT``, runs the helper's steps in-process and
execs the command. Its answer (the pid, or why no child was made) is read by the reactor; the
pipes are read by the reactor and the child is reaped when its pidfd says it has ended
(:class:`sandboxd._twisted.ServedProcess`).

The helper is still spawned for a command whose argv is not the helper's (the shell chain), for
a protocol that cannot take a pid given later (:class:`Served`), for a request over one
message's size, and when the server is gone or cannot take the message.
"""

import collections
import errno
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from twisted.internet import abstract
from twisted.internet.interfaces import IReactorProcess
from twisted.internet.main import CONNECTION_DONE, CONNECTION_LOST
from zope.interface import implementer

from sandboxd._twisted import ServedProcess
from sandboxd.isolation.base import PLAIN_ENV

if TYPE_CHECKING:
    from sandboxd.isolation.exec.zygotes import Zygotes, ZygoteSpec

MESSAGE_MAX = 256 << 10
"""The largest request the server reads (``SPAWN_MESSAGE_MAX``); a larger one is spawned."""

SPAWNERS = ("helper", "server", "zygote")

Answer = Callable[[int | OSError], None]
"""Told the server's answer to one request: the child's pid, or why there is none."""

Popen = Callable[..., Any]
"""Starts the server: ``subprocess.Popen`` (its ``pid``, ``poll`` and ``wait`` are used)."""


@runtime_checkable
class Served(Protocol):
    """A process protocol that can be given its pid once the server answers."""

    def spawned(self, pid: int) -> None: ...

    def spawn_failed(self, error: OSError) -> None: ...


def request(argv: Sequence[str], env: Mapping[str, str]) -> bytes:
    """One request: the count of arguments, the arguments, the environment, each NUL-ended."""
    parts = [str(len(argv)), *argv, *(f"{name}={value}" for name, value in env.items())]
    return b"".join(os.fsencode(part) + b"\0" for part in parts)


def answer_of(data: bytes) -> int | OSError:
    """The pid in one answer, or the error its negative value names."""
    value = int.from_bytes(data, sys.byteorder, signed=True)
    if len(data) == 4 and value > 0:
        return value
    code = -value if len(data) == 4 and value < 0 else errno.EPROTO
    return OSError(code, os.strerror(code))


class Answers(abstract.FileDescriptor):
    """The daemon's end of a socket that answers requests in their order (the spawn server's,
    and each zygote's: :mod:`sandboxd.isolation.exec.zygotes`), read by the reactor: each
    answer (:func:`answer_of`) goes to the oldest request still waiting (:attr:`pending`).
    ``lost`` is called once the socket ends or breaks; :meth:`close` ends it from our side."""

    def __init__(self, reactor: Any, sock: socket.socket, lost: Callable[[], None]) -> None:
        super().__init__(reactor)
        self.sock = sock
        self.lost = lost
        self.pending: collections.deque[Answer] = collections.deque()

    def fileno(self) -> int:
        return self.sock.fileno()

    def doRead(self) -> object:
        while self.sock.fileno() >= 0:  # an answer's callback may have closed the server
            try:
                data = self.sock.recv(8)
            except BlockingIOError:
                return None
            except OSError:
                return CONNECTION_LOST
            if not data or not self.pending:
                return CONNECTION_DONE
            self.pending.popleft()(answer_of(data))
        return None

    def connectionLost(self, reason: object) -> None:
        super().connectionLost(reason)  # type: ignore[no-untyped-call]
        self.lost()

    def close(self, why: str) -> None:
        """Stop reading and close the socket (its peer reads its end); each request still
        waiting is told ``EPIPE`` with ``why``. ``lost`` is not called."""
        self.stopReading()  # type: ignore[no-untyped-call]
        self.sock.close()
        pending, self.pending = self.pending, collections.deque()
        for answer in pending:
            answer(OSError(errno.EPIPE, why))


class SpawnServer:
    """The server process and its socket (started at the first request)."""

    def __init__(self, helper: str, popen: Popen = subprocess.Popen) -> None:
        self.helper = helper
        self._popen = popen
        self._process: subprocess.Popen[bytes] | None = None
        self._answers: Answers | None = None
        self._lost = False
        """The server ended by itself: the next request goes to the helper (not a new server
        at once, for a server that keeps failing)."""

    @property
    def pid(self) -> int | None:
        """The running server's pid (``None``: not started, or found gone)."""
        return None if self._process is None else self._process.pid

    def send(self, reactor: Any, body: bytes, fds: Sequence[int], answer: Answer) -> bool:
        """Send one request; ``answer`` is told the server's answer, as a reactor event.

        ``False`` (nothing sent, ``answer`` never told) for a request over
        :data:`MESSAGE_MAX`, a server found gone (the request after starts a new one), or a
        message the socket does not take now.
        """
        if len(body) > MESSAGE_MAX:
            return False
        answers = self._running(reactor)
        if answers is None:
            return False
        try:
            socket.send_fds(answers.sock, [body], list(fds))
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EMSGSIZE, errno.ENOBUFS):
                self.close()
            return False
        answers.pending.append(answer)
        return True

    def _running(self, reactor: Any) -> Answers | None:
        process = self._process
        if process is not None and process.poll() is not None:
            self.close()  # gone: this request goes to the helper, the next starts a new server
            return None
        if self._lost:
            self._lost = False  # found gone before (its socket ended): the same
            return None
        if self._answers is None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                self._process = self._popen(
                    [self.helper, "spawn-server"],
                    stdin=theirs.fileno(),
                    stdout=subprocess.DEVNULL,
                    env=PLAIN_ENV,
                )
            except OSError:
                ours.close()
                return None
            finally:
                theirs.close()
            ours.setblocking(False)
            self._answers = Answers(reactor, ours, self._ended)
            self._answers.startReading()  # type: ignore[no-untyped-call]
        return self._answers

    def _ended(self) -> None:
        self._lost = True
        self.close()

    def close(self) -> None:
        """End the server (it exits at the end of its socket); a request still waiting is
        told the server ended."""
        answers, self._answers = self._answers, None
        process, self._process = self._process, None
        if answers is not None:
            answers.close("the spawn server ended")
        if process is not None:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover (it ends at EOF; a bound only)
                process.kill()
                process.wait()


@implementer(IReactorProcess)
class Spawner:
    """``spawnProcess`` for the execs: the helper's own argv goes to the server, any other
    through the reactor. With ``zygotes`` and ``sandbox`` (a spawner of that sandbox's execs
    and background processes: :meth:`sandboxd.isolation.sandbox.SandboxIsolation.spawner`),
    the helper's argv goes to the sandbox's zygote first."""

    def __init__(
        self,
        reactor: Any,
        server: SpawnServer,
        zygotes: "Zygotes | None" = None,
        sandbox: "ZygoteSpec | None" = None,
    ) -> None:
        self.reactor = reactor
        self.server = server
        self.zygotes = zygotes
        self.sandbox = sandbox

    def spawnProcess(
        self,
        processProtocol: Any,
        executable: bytes | str,
        args: Sequence[bytes | str],
        env: Mapping[Any, Any] | None = None,
        path: bytes | str | None = None,
        uid: int | None = None,
        gid: int | None = None,
        usePTY: bool = False,
        childFDs: Mapping[int, int | str] | None = None,
    ) -> Any:
        """Through the sandbox's zygote or the server when they can take the command (see
        the module and :mod:`sandboxd.isolation.exec.zygotes`), else
        ``reactor.spawnProcess`` with the same arguments."""
        argv = [os.fsdecode(arg) for arg in args]
        if argv[0] == self.server.helper and isinstance(processProtocol, Served):
            fd_map = childFDs or {0: "w", 1: "r", 2: "r"}
            process = ServedProcess(self.reactor, processProtocol, fd_map)
            protocol: Served = processProtocol

            def answered(result: int | OSError) -> None:
                if isinstance(result, OSError):
                    # named as reactor.spawnProcess names it (os.posix_spawnp's filename)
                    protocol.spawn_failed(OSError(result.errno, result.strerror, argv[0]))
                    process.refused()
                else:
                    protocol.spawned(result)
                    process.answered(result)

            fds = [process.child_side[fd] for fd in (0, 1, 2)]
            body = request(argv, env or {})
            zygotes, sandbox = self.zygotes, self.sandbox
            if (
                zygotes is not None
                and sandbox is not None
                and zygotes.send(self.reactor, sandbox, body, fds, answered)
            ):
                process.connect()
                return process
            if self.server.send(self.reactor, body, fds, answered):
                process.connect()
                return process
            process.abandon()
        return self.reactor.spawnProcess(
            processProtocol, executable, args, env, path, uid, gid, usePTY, childFDs
        )
