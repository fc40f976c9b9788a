"""Per-sandbox zygotes for the isolated execs (``SANDBOXD_SPAWNER=zygote``; the zygote is
``sandboxd_exec_zygote.h``; docs/operating.rst, "Zygotes").

A zygote is one small process per sandbox that runs commands: it has taken the helper's steps
once (the sandbox's cgroups, namespaces, uid and gid, no_new_privs, seccomp filter) and then
forks each exec of that sandbox, whose child only puts its descriptors in place, leads a new
session, enters the exec's cwd and execs the command. The child is the daemon's own
(``CLONE_PARENT``): its pipes are read and it is reaped as a spawn server's child
(:class:`sandboxd._twisted.ServedProcess`). Which of a sandbox's commands a zygote takes, and
the argv it is started with (:class:`ZygoteSpec`), are said where the sandbox's argv is built
(:attr:`sandboxd.isolation.sandbox.SandboxIsolation.zygote`).

Life of a zygote: the spawn server starts it beside a sandbox's first exec (which the server
runs); it serves the execs after that; it is retired (its socket closed: it exits) after a quiet
spell with no exec, and at its sandbox's kill, before the cgroup's (:meth:`Zygotes.retire`). At
most ``limit`` live at once: past that, an exec goes to the server. A zygote runs as the
sandbox's uid, so the sandbox can kill or stop it (it cannot ptrace it: it is not dumpable):
the daemon accepts only an answer naming its own unreaped child of the sandbox's uid that
nothing reaps yet, gives up on a zygote that does not answer in time, and sends the exec to the
server whenever the zygote cannot take it (gone, killed, an error, a lie, no answer); the next
exec starts a fresh one.
"""

import errno
import os
import signal
import socket
from collections.abc import Sequence
from typing import Any

from attrs import define, field, frozen

from sandboxd._twisted import reap_handled, reap_when_ended
from sandboxd.isolation.exec.spawn_server import Answer, Answers, SpawnServer, request

QUIET = 60.0
"""Seconds with no exec after which a zygote is retired (``SANDBOXD_ZYGOTE_QUIET``)."""

LIMIT = 256
"""Live zygotes per daemon (``SANDBOXD_ZYGOTES_MAX``): one pid each, within ``pid_max``."""

ANSWER_TIMEOUT = 5.0
"""Seconds a zygote has to answer an exec before it is killed and the exec sent to the server."""

PLACEHOLDER_CWD = "/"
PLACEHOLDER_COMMAND = ("sandboxd-zygote",)
"""The cwd and command of a zygote's own helper argv (:attr:`ZygoteSpec.argv`): it takes every
step of the helper but the last, so it uses neither; each exec brings its own."""


@frozen
class ZygoteSpec:
    """A sandbox as its zygote is made for it, by the code that builds the sandbox's argv
    (:attr:`sandboxd.isolation.sandbox.SandboxIsolation.zygote`, which says which of its
    commands a zygote takes): the sandbox ``rid``, its ``uid`` (the only uid a zygote's answer
    may name), and ``argv``, the helper argv of those commands with
    :data:`PLACEHOLDER_CWD` and :data:`PLACEHOLDER_COMMAND` for their cwd and command."""

    rid: str
    uid: int
    argv: tuple[str, ...]


def uid_of(pid: int) -> int | None:
    """The real uid of process ``pid`` (``None``: gone). Read from its status, since its
    ``/proc`` entry is root's while it is not dumpable (a zygote's child before its exec)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            lines = status.readlines()
    except OSError:
        return None
    (line,) = [line for line in lines if line.startswith(b"Uid:")]
    return int(line.split()[1])


def unclaimed_child(pid: int) -> bool:
    """``pid`` is an unreaped child of the daemon that no handler reaps yet."""
    if reap_handled(pid):
        return False
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


@define(eq=False)
class Zygote:
    """One sandbox's zygote: its socket, and its pid once the server has answered."""

    uid: int
    answers: Answers
    pid: int | None = None
    quiet: Any = None
    """The reactor's call that retires it after the quiet spell."""
    closed: bool = False


@define
class Zygotes:
    """The daemon's live zygotes, by sandbox id."""

    server: SpawnServer
    quiet: float = QUIET
    limit: int = LIMIT
    answer_timeout: float = ANSWER_TIMEOUT
    live: dict[str, Zygote] = field(factory=dict)

    def send(
        self, reactor: Any, sandbox: ZygoteSpec, body: bytes, fds: Sequence[int], answer: Answer
    ) -> bool:
        """Send exec ``body`` (one of the commands ``sandbox`` says a zygote takes, with its
        descriptors ``fds``) to the sandbox's zygote; ``answer`` is told the child's pid, or
        the server's answer where the zygote could not take it. ``False`` (nothing sent): no
        zygote serves that sandbox yet (one is started now, if there is room)."""
        key, uid = sandbox.rid, sandbox.uid
        zygote = self.live.get(key)
        if zygote is None:
            if len(self.live) < self.limit:
                self._start(reactor, sandbox)
            return False
        if zygote.pid is None:
            return False
        kept = [os.dup(fd) for fd in fds]  # for the server, should the zygote not answer
        try:
            socket.send_fds(zygote.answers.sock, [body], kept)
        except OSError:
            self._retire(key, zygote)
            _close(kept)
            return False
        timeout = reactor.callLater(self.answer_timeout, self._kill, key, zygote)
        zygote.quiet.reset(self.quiet)

        def answered(result: int | OSError) -> None:
            if timeout.active():
                timeout.cancel()
            if isinstance(result, int) and unclaimed_child(result) and uid_of(result) == uid:
                _close(kept)
                answer(result)
                return
            if isinstance(result, int):
                self._kill(key, zygote)  # it lies: the sandbox's own code runs in it
            if not self.server.send(reactor, body, kept, answer):
                answer(OSError(errno.EPIPE, "neither the zygote nor the spawn server answered"))
            _close(kept)

        zygote.answers.pending.append(answered)
        return True

    def _start(self, reactor: Any, sandbox: ZygoteSpec) -> None:
        """Ask the spawn server for ``sandbox``'s zygote, once the exec that started it is
        sent (its request goes to the server first: the zygote's set-up does not delay it)."""
        key = sandbox.rid
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        zygote = Zygote(sandbox.uid, Answers(reactor, ours, lambda: self._retire(key, zygote)))
        zygote.quiet = reactor.callLater(self.quiet, self._retire, key, zygote)
        self.live[key] = zygote
        argv = sandbox.argv
        body = request([argv[0], "zygote", *argv[1:]], {})
        reactor.callLater(0, self._ask_server, reactor, key, zygote, body, theirs)

    def _ask_server(
        self, reactor: Any, key: str, zygote: Zygote, body: bytes, theirs: socket.socket
    ) -> None:
        def started(result: int | OSError) -> None:
            if isinstance(result, OSError):
                self._retire(key, zygote)
                return
            # reaped when it ends (then retired), also one retired before this answer: it ends
            # at its socket's end, and must not stay a zombie of the daemon
            reap_when_ended(reactor, result, lambda: self._retire(key, zygote))
            if zygote.closed:
                return
            zygote.pid = result
            zygote.answers.startReading()  # type: ignore[no-untyped-call]

        sent = False
        if not zygote.closed:
            devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            sent = self.server.send(reactor, body, [theirs.fileno(), devnull, devnull], started)
            os.close(devnull)
        theirs.close()
        if not sent:
            self._retire(key, zygote)

    def _kill(self, key: str, zygote: Zygote) -> None:
        """A zygote that did not answer in time, or lied: killed, and retired."""
        # only one with a pid answers (or times out), and a closed one answers no more: never a
        # pid that may be reaped and reused already
        if zygote.pid is not None and not zygote.closed:  # pragma: no branch
            os.kill(zygote.pid, signal.SIGKILL)
        self._retire(key, zygote)

    def _retire(self, key: str, zygote: Zygote) -> None:
        """Close a zygote's socket (it exits at its end; its exec in flight goes to the
        server); the next exec of its sandbox starts a new one."""
        if self.live.get(key) is zygote:
            del self.live[key]
        if zygote.closed:
            return
        zygote.closed = True
        if zygote.quiet.active():
            zygote.quiet.cancel()
        zygote.answers.close("the zygote ended")

    def retire(self, rid: str) -> None:
        """Retire sandbox ``rid``'s zygote, if it has one (the sandbox's kill, before its
        cgroup's): its socket is closed first, so that one whose start is under way ends at its
        first read instead of serving, and is never asked for. One that joins the cgroup after
        the kill is killed by the disposal's next round
        (:meth:`~sandboxd.isolation.base.Isolation.dispose_leftover`)."""
        zygote = self.live.get(rid)
        if zygote is not None:
            self._retire(rid, zygote)

    def close(self) -> None:
        """Retire every zygote (the daemon stops)."""
        for key, zygote in list(self.live.items()):
            self._retire(key, zygote)


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)
