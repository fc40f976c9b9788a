"""Running rsync for the archive: the workspace side as the sandbox, the archive side as root.

Every copy between a workspace and the archive is one rsync whose two ends run with different
credentials. The daemon spawns the *archive* end (root, or the daemon's own user) and names the
workspace as a remote path ``sandbox:./``; rsync starts the *workspace* end through its remote shell
(``-e``), which is :data:`RSH`: a constant ``sh`` script that runs the server end through the
sandbox's privilege-drop chain, the one every process of a sandbox starts through
(:meth:`sandboxd.isolation.sandbox.SandboxIsolation.start_argv`; docs/isolation.rst, "The
privilege-drop chain"): its namespaces entered, its cgroup joined, its uid/gid with
``no_new_privs``, the sandbox's seccomp filter, and (the exec helper's ``--no-ptrace``) not
ptrace-able by the sandbox's own processes. Its working directory is the workspace, entered as the
sandbox's uid. The chain's argv travels in ``SANDBOXD_RSH_*`` environment variables, one word each:
the script text never changes and holds no quote rsync's ``-e`` parser would have to understand.

So the end that reads (persist) or writes (restore) the workspace can reach exactly what the
sandbox itself can reach, whatever symlink, hardlink or swapped component it meets, and a
process of the sandbox that would take it over gains nothing the filter refuses the sandbox;
the root end only speaks the rsync protocol to it, and touches nothing but the archive.
"""

from collections.abc import Callable, Mapping, Sequence

from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorProcess
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

from sandboxd.core.exec.run import exit_code_of

REMOTE = "sandbox:./"
"""The workspace as rsync sees it: the remote end's working directory."""

RSH_SCRIPT = (
    'shift; i=${SANDBOXD_RSH_N:?}; while [ "$i" -gt 0 ]; do i=$((i - 1)); '
    r'eval "set -- \"\${SANDBOXD_RSH_$i}\" \"\$@\""; unset "SANDBOXD_RSH_$i"; done; '
    'unset SANDBOXD_RSH_N i; exec "$@"'
)
"""Run by rsync as ``RSH host rsync --server ...``: ``shift`` removes the host name, the words
``SANDBOXD_RSH_0`` .. ``SANDBOXD_RSH_{N-1}`` (the chain's argv before the program) are put in
front of the rest, and removed from the environment, then the whole is ``exec``\\ ed. The
script runs as root but only rebuilds an argv the daemon made; the chain does every step."""

RSH = f"/bin/sh -c '{RSH_SCRIPT}' sandboxd-rsh"

STDERR_KEPT = 8192
"""Bytes of rsync's stderr kept for the error message."""

OK_EXITS = (0, 24)
"""24: files vanished while being copied (the sandbox was writing): the copy is still whole."""

IO_TIMEOUT = 120
"""Seconds without any data after which rsync gives up (a sandbox that ``SIGSTOP``\\ s its end
must not hold the item's lock forever)."""


class RsyncFailed(Exception):
    """rsync exited with an error; the message holds its exit code and the end of its stderr."""


StartArgv = Callable[[Sequence[str]], list[str]]
"""The argv that runs the given argv as a sandbox, through its privilege-drop chain; the
given argv comes last, unchanged."""


@frozen
class WorkspaceEnd:
    """The workspace end of a copy: where its workspace is, and how a process starts as it."""

    path: str
    start: StartArgv


@frozen
class Rsync:
    """Spawns rsync without blocking the reactor (``rsync``: an absolute path, resolved at
    start-up)."""

    reactor: IReactorProcess
    rsync: str
    io_timeout: int = IO_TIMEOUT

    def local(self, args: Sequence[str]) -> Deferred[None]:
        """rsync between two archive paths, as the daemon (nothing of a sandbox's involved)."""
        argv = [self.rsync, f"--timeout={self.io_timeout}", *args]
        return self._spawn(argv, self._base_env())

    def with_workspace(self, end: WorkspaceEnd, args: Sequence[str]) -> Deferred[None]:
        """rsync with ``args``, where :data:`REMOTE` names ``end``'s workspace, run as ``end``."""
        chain = end.start([self.rsync])
        if not chain or chain[-1] != self.rsync:
            raise RsyncFailed(f"the workspace end's chain does not end in {self.rsync}")
        env = self._base_env()
        env["SANDBOXD_RSH_N"] = str(len(chain) - 1)
        for index, word in enumerate(chain[:-1]):
            if "\0" in word:
                raise RsyncFailed(f"the workspace end's chain holds a NUL byte: {word!r}")
            env[f"SANDBOXD_RSH_{index}"] = word
        argv = [
            self.rsync,
            f"--timeout={self.io_timeout}",
            f"--rsh={RSH}",
            f"--rsync-path={self.rsync}",
            *args,
        ]
        return self._spawn(argv, env)

    @staticmethod
    def _base_env() -> dict[str, str]:
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}

    def _spawn(self, argv: list[str], env: Mapping[str, str]) -> Deferred[None]:
        protocol = _RsyncProtocol(argv)
        try:
            self.reactor.spawnProcess(
                protocol, argv[0], argv, env=dict(env), path="/", childFDs={0: "w", 1: "r", 2: "r"}
            )
        except OSError as e:
            raise RsyncFailed(f"cannot start rsync: {e}") from None
        return protocol.done


class _RsyncProtocol(ProcessProtocol):
    """Collects the end of stderr; fires ``done`` on success, :class:`RsyncFailed` otherwise."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = argv
        self.stderr = b""
        self.done: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        self.transport.closeStdin()  # type: ignore[union-attr]

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        if childFD == 2:
            self.stderr = (self.stderr + data)[-STDERR_KEPT:]

    def processEnded(self, reason: Failure) -> None:
        code = exit_code_of(reason)
        if code in OK_EXITS:
            self.done.callback(None)
            return
        text = self.stderr.decode("utf-8", "replace").strip().replace("\n", " | ")
        self.done.errback(RsyncFailed(f"rsync exited {code}: {text or 'no message'}"))
