"""The same spawns from inside a running Twisted reactor, the way the daemon makes them.

- ``tx-direct``: ``reactor.spawnProcess`` of ``/bin/true`` with the daemon's ``childFDs``
  (stdin ``/dev/null``, stdout and stderr pipes), to ``processEnded``;
- ``tx-helper``: ``reactor.spawnProcess`` of today's isolated argv (the helper);
- ``tx-zygote``: a request to the per-sandbox zygote (its answer read blocking: a prototype),
  the two pipes read by the reactor, the child reaped by Twisted's own SIGCHLD handling
  (``registerReapProcessHandler``: the child is the daemon's, by ``CLONE_PARENT``).

Imported by ``run.py --twisted`` (the project's virtualenv has Twisted).
"""

import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet import abstract, fdesc, process
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.protocol import ProcessProtocol


class Ended(ProcessProtocol):
    def __init__(self) -> None:
        self.done: Deferred[None] = Deferred()

    def processEnded(self, reason: Any) -> None:
        self.done.callback(None)


class PipeEnd(abstract.FileDescriptor):
    """One output pipe read by the reactor until EOF."""

    def __init__(self, reactor: Any, fd: int, closed: Callable[[], None]) -> None:
        super().__init__(reactor)
        self.fd = fd
        self.closed = closed
        fdesc.setNonBlocking(fd)
        self.startReading()

    def fileno(self) -> int:
        return self.fd

    def doRead(self) -> object:
        return fdesc.readFromFD(self.fd, lambda data: None)

    def connectionLost(self, reason: Any) -> None:
        super().connectionLost(reason)
        os.close(self.fd)
        self.closed()


class Reaped:
    """Reaped by Twisted's SIGCHLD handling (``reapAllProcesses`` calls ``reapProcess``)."""

    def __init__(self, pid: int, ended: Callable[[], None]) -> None:
        self.pid = pid
        self.ended = ended

    def reapProcess(self) -> None:
        pid, _ = os.waitpid(self.pid, os.WNOHANG)
        if pid == self.pid:
            process.unregisterReapProcessHandler(self.pid, self)
            self.ended()

    def processEnded(self, status: int) -> None:
        """Reaped at registration (it had ended already)."""
        self.ended()


def zygote_exec(
    reactor: Any, sock: socket.socket, devnull: int, argv: Sequence[str], env: dict[str, str]
) -> Deferred[None]:
    done: Deferred[None] = Deferred()
    waiting = [3]  # two pipes and the exit

    def one() -> None:
        waiting[0] -= 1
        if waiting[0] == 0:
            done.callback(None)

    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    body = b"".join(a.encode() + b"\0" for a in argv) + b"\0"
    body += b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    socket.send_fds(sock, [body], [devnull, out_w, err_w])
    os.close(out_w)
    os.close(err_w)
    PipeEnd(reactor, out_r, one)
    PipeEnd(reactor, err_r, one)
    pid = int.from_bytes(sock.recv(4), sys.byteorder, signed=True)
    process.registerReapProcessHandler(pid, Reaped(pid, one))  # reaps at once if it can
    return done


def rows(
    reactor: Any, helper_argv: list[str], true: str, zygote: Any, env: dict[str, str], rounds: int
) -> Deferred[dict[str, list[float]]]:
    devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def spawn(argv: list[str]) -> Deferred[None]:
        protocol = Ended()
        reactor.spawnProcess(
            protocol, argv[0], argv, env=env, childFDs={0: devnull, 1: "r", 2: "r"}
        )
        return protocol.done

    makers: dict[str, Callable[[], Deferred[None]]] = {
        "tx-direct": lambda: spawn([true]),
        "tx-helper": lambda: spawn(helper_argv),
        "tx-zygote": lambda: zygote_exec(reactor, zygote.sock, devnull, ["true"], env),
    }

    async def run() -> dict[str, list[float]]:
        times: dict[str, list[float]] = {name: [] for name in makers}
        for round_ in range(rounds + 10):
            for name, make in makers.items():
                start = time.perf_counter()
                await make()
                if round_ >= 10:  # the first ten warm up
                    times[name].append(time.perf_counter() - start)
        return times

    return ensureDeferred(run())
