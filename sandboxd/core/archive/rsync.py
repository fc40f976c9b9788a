"""Running rsync for the archive: the workspace side as the sandbox, the archive side as root.

Every copy between a workspace and the archive is one rsync whose two ends run with different
credentials. The daemon spawns the *archive* end (root, or the daemon's own user) and names the
workspace as a remote path ``sandbox:./``; rsync starts the *workspace* end through its remote
shell (``-e``), which is :data:`RSH`: a constant ``sh`` script that joins the sandbox's cgroup
(as the exec wrapper does, so a kill of the sandbox also ends it and its memory counts against
the sandbox) and drops to the sandbox's uid/gid with ``setpriv --clear-groups --no-new-privs``.
Its working directory is the workspace, entered by root through the root-owned sandbox
directory the sandbox cannot change, so no path text of the sandbox's reaches a privileged
``open``. Its parameters travel in ``SANDBOXD_RSH_*`` environment variables: the script text
never changes and holds no quote rsync's ``-e`` parser would have to understand.

So the end that reads (persist) or writes (restore) the workspace can reach exactly what the
sandbox itself can reach, whatever symlink, hardlink or swapped component it meets; the root end
only speaks the rsync protocol to it, and touches nothing but the archive.
"""

import os
from collections.abc import Mapping, Sequence

from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorProcess
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

from sandboxd.core.exec.run import exit_code_of
from sandboxd.isolation.base import Identity
from sandboxd.isolation.privdrop import SETUP_FAILED, oom_reset_sh, setpriv_args

REMOTE = "sandbox:./"
"""The workspace as rsync sees it: the remote end's working directory."""

RSH_SCRIPT = (
    f"for f in $SANDBOXD_RSH_PROCS; do echo 0 > $f || exit {SETUP_FAILED}; done; shift; "
    'if [ -n "$SANDBOXD_RSH_NS" ]; then '
    'set -- /bin/sh -c "$SANDBOXD_RSH_CD" sandboxd-rsh "$@"; fi; '
    'if [ -n "$SANDBOXD_RSH_UID" ]; then '
    f"{oom_reset_sh('sandboxd-rsh')}; "
    'set -- "$SANDBOXD_RSH_SETPRIV" '
    + " ".join(setpriv_args('"$SANDBOXD_RSH_UID"', '"$SANDBOXD_RSH_GID"'))
    + ' -- "$@"; fi; '
    'if [ -n "$SANDBOXD_RSH_NS" ]; then '
    'set -- "$SANDBOXD_RSH_NSENTER" $SANDBOXD_RSH_NS -- "$@"; fi; exec "$@"'
)
"""Run by rsync as ``RSH host rsync --server ...``: the steps of
:mod:`sandboxd.isolation.privdrop` (join, oom, drop; its working directory is the workspace,
whose parent only root can change), with the sandbox's namespaces entered (``nsenter``) before
the drop, then exec the server end (``shift`` removes the host name). Entering a mount
namespace moves the working directory to its root, so the server end then starts through
:data:`CD_SCRIPT`, which enters the workspace again, as the sandbox."""

CD_SCRIPT = 'cd -- "$SANDBOXD_RSH_DIR" && exec "$@"'
"""The workspace entered again inside the sandbox's mount namespace (``SANDBOXD_RSH_CD``): the
path is the daemon's, through the root-owned sandbox directory the sandbox cannot change."""

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


@frozen
class WorkspaceEnd:
    """The workspace end of a copy: who the sandbox is, its cgroups, where its workspace is."""

    identity: Identity
    join_files: tuple[str, ...]
    path: str
    namespaces: tuple[str, ...] = ()
    """``nsenter`` options entering the sandbox's namespaces (empty: none)."""
    nsenter: str | None = None


@frozen
class Rsync:
    """Spawns rsync without blocking the reactor.

    ``rsync`` and ``setpriv`` are absolute paths, resolved at start-up (``setpriv`` may be
    ``None`` when the daemon never drops privilege: ``--isolation=none``).
    """

    reactor: IReactorProcess
    rsync: str
    setpriv: str | None
    io_timeout: int = IO_TIMEOUT

    def local(self, args: Sequence[str]) -> Deferred[None]:
        """rsync between two archive paths, as the daemon (nothing of a sandbox's involved)."""
        argv = [self.rsync, f"--timeout={self.io_timeout}", *args]
        return self._spawn(argv, self._base_env(), "/")

    def with_workspace(self, end: WorkspaceEnd, args: Sequence[str]) -> Deferred[None]:
        """rsync with ``args``, where :data:`REMOTE` names ``end``'s workspace, run as ``end``."""
        env = self._base_env()
        for path in end.join_files:
            if not path or any(c.isspace() for c in path):
                raise RsyncFailed(f"cgroup file {path!r}: whitespace in the path")
        env["SANDBOXD_RSH_PROCS"] = " ".join(end.join_files)
        if end.namespaces:
            if end.nsenter is None or any(c.isspace() for c in "".join(end.namespaces)):
                raise RsyncFailed(f"cannot enter the namespaces {end.namespaces!r}")
            env["SANDBOXD_RSH_NS"] = " ".join(end.namespaces)
            env["SANDBOXD_RSH_NSENTER"] = end.nsenter
            env["SANDBOXD_RSH_CD"] = CD_SCRIPT
            env["SANDBOXD_RSH_DIR"] = end.path
        if end.identity.uid != os.geteuid() or end.identity.gid != os.getegid():
            if self.setpriv is None:
                raise RsyncFailed("cannot run as the sandbox: no setpriv")
            env["SANDBOXD_RSH_UID"] = str(end.identity.uid)
            env["SANDBOXD_RSH_GID"] = str(end.identity.gid)
            env["SANDBOXD_RSH_SETPRIV"] = self.setpriv
        argv = [
            self.rsync,
            f"--timeout={self.io_timeout}",
            f"--rsh={RSH}",
            f"--rsync-path={self.rsync}",
            *args,
        ]
        return self._spawn(argv, env, end.path)

    @staticmethod
    def _base_env() -> dict[str, str]:
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}

    def _spawn(self, argv: list[str], env: Mapping[str, str], cwd: str) -> Deferred[None]:
        protocol = _RsyncProtocol(argv)
        try:
            self.reactor.spawnProcess(
                protocol, argv[0], argv, env=dict(env), path=cwd, childFDs={0: "w", 1: "r", 2: "r"}
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
