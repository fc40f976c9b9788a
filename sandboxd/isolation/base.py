"""The isolation seam: what the sandbox manager asks of uids, cgroups and file credentials.

The manager never touches the kernel itself; it holds one :class:`Isolation` bundle, built at
start-up from the configuration (``sandboxd.isolation.select``). ``--isolation=none`` gives the
development bundle of ``sandboxd.isolation.none``; the cgroup drivers give real isolation.
"""

import errno
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

import attrs
from attrs import field, frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorProcess

from sandboxd.isolation.namespaces.root_view import RootView

if TYPE_CHECKING:
    from sandboxd.isolation.disk.base import DiskDriver
    from sandboxd.isolation.exec.spawn_server import SpawnServer
    from sandboxd.isolation.exec.zygotes import Zygotes, ZygoteSpec
    from sandboxd.isolation.namespaces.pins import Namespaces
    from sandboxd.isolation.network.modes import NetworkMode
    from sandboxd.isolation.sandbox import SandboxIsolation

T = TypeVar("T")

REMOVAL_ROUNDS = 5
"""Kills and removals of a sandbox's cgroup before a busy one is given up (the sandbox's uid
is then kept out of the pool until the next start-up reclaims it)."""

RunProgram = Callable[[Sequence[str]], tuple[int, str]]
"""Runs an argv to its end, blocking: its exit code and the text it wrote (which streams, each
implementation says). The daemon's own programs, run as root: never a sandbox's."""

PLAIN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
"""The environment of a program the daemon starts as root for itself (the helper's servers,
``unshare``): the system's directories, the C locale, nothing of the daemon's own."""


class IsolationUnavailable(Exception):
    """The configured isolation cannot be provided; the message is one line naming the cause."""


class NoFreeUid(Exception):
    """Every uid of the pool is held by a live sandbox."""


@frozen
class Identity:
    """The numeric uid and gid a sandbox's processes and file calls run as."""

    uid: int
    gid: int


@frozen
class Limits:
    """Resource limits of one sandbox's cgroup (``None``: no limit)."""

    memory_bytes: int | None
    cpu_cores: float | None
    pids: int | None


@frozen
class CgroupStats:
    """What the cgroup says of a sandbox (``GET /sandboxes/{rid}/stats``)."""

    memory_bytes: int
    memory_peak_bytes: int
    cpu_usec: int
    pids: int
    oom_kills: int
    cpus: tuple[int, ...] | None = None
    """The CPUs the sandbox is placed on (``None``: not placed, every CPU of the daemon's)."""


class UidPool(Protocol):
    """Bare numeric uids/gids, one per live sandbox, never 0, never shared."""

    @property
    def total(self) -> int: ...

    @property
    def free(self) -> int: ...

    def allocate(self) -> Identity:
        """Take a free identity; raise :class:`NoFreeUid` when none is left."""

    def release(self, identity: Identity) -> None:
        """Give an identity back to the pool."""


class CgroupDriver(Protocol):
    """One cgroup per sandbox, inside the subtree delegated to the daemon."""

    name: str

    def problem(self) -> str | None:
        """Why the driver cannot work here (one line), or ``None`` as far as it can tell
        without changing anything."""

    def preflight(self) -> None:
        """Check the driver can work here and prepare it (raise :class:`IsolationUnavailable`
        naming the problem if not)."""

    def unprepare(self) -> None:
        """Undo what :meth:`preflight` made (start-up stopped before the daemon ran); what
        was there before it stays."""

    def create(self, rid: str, limits: Limits) -> None:
        """Create the sandbox's cgroup with its limits."""

    def join_files(self, rid: str) -> Sequence[str]:
        """The files a new process writes ``0`` (itself) into to join the sandbox's cgroup."""

    def kill(self, rid: str) -> Deferred[None]:
        """SIGKILL every process in the sandbox's cgroup; fire once the cgroup is empty."""

    def remove(self, rid: str) -> None:
        """Remove the (empty) cgroup; a missing cgroup is not an error."""

    def freeze(self, rid: str, frozen: bool) -> Deferred[bool]:
        """Freeze (``frozen``) or thaw every process in the sandbox's cgroup; fire, once they
        are, with whether the driver can (a fork copies a frozen sandbox's files)."""

    def stats(self, rid: str) -> CgroupStats:
        """Read the sandbox's usage counters."""

    def oom_kills(self, rid: str) -> int:
        """How many processes the kernel has OOM-killed in the sandbox's cgroup (one file
        read: asked before and after each exec)."""

    def leftovers(self) -> list[str]:
        """Sandbox ids whose cgroups exist in our subtree (left by a crashed predecessor)."""

    def remove_instance(self) -> None:
        """Remove the daemon's own (empty) cgroups once its last sandbox is gone (a drain
        ends the daemon)."""


class FsCredentials(Protocol):
    """Runs blocking file work with a sandbox's filesystem credentials."""

    def run(self, identity: Identity, work: Callable[[], T]) -> Deferred[T]:
        """Call ``work()`` in a worker thread whose fsuid/fsgid are the identity's."""


class SandboxDirectories(Protocol):
    """A sandbox's directory tree (``sandboxd.core.layout.Layout``): made under its top
    directory, which the disk driver makes and a disk limit in force charges to the sandbox."""

    def create(self, rid: str, identity: Identity, disk: "DiskDriver") -> None:
        """Make the sandbox's tree, owned by ``identity``, its top directory by ``disk``."""

    def destroy(self, rid: str, disk: "DiskDriver") -> None:
        """Remove the sandbox's tree, whatever is in it, its top directory by ``disk``; a
        missing tree is not an error."""

    def directory(self, rid: str) -> str:
        """The sandbox's top directory (what its disk limit charges)."""

    def workspace(self, rid: str) -> str: ...

    def home(self, rid: str) -> str: ...

    def tmp(self, rid: str) -> str: ...


InThread = Callable[[Callable[[str], None], str], Deferred[None]]
"""``in_thread(work, rid)``: calls ``work(rid)`` off the reactor thread; fires when it ends."""


CD_AND_EXEC = 'cd -- "$1" && shift && unset OLDPWD && exec "$@"'
"""The shell chains' last step, run after privilege is dropped, so a ``cwd`` the sandbox
swapped for a symlink gets it nothing its uid could not reach anyway."""

Wrap = Callable[[Identity, Sequence[str], str, Sequence[str]], list[str]]
"""``wrap(identity, join_files, cwd, argv)``: the argv to spawn so that ``argv`` runs in the
sandbox (see :class:`Isolation`)."""


def require_command(argv: Sequence[str], identity: Identity | None = None) -> None:
    """``ValueError`` for an empty command, or for an ``identity`` that is root's (a wrapper
    that drops privilege never runs a command as uid or gid 0)."""
    if identity is not None and (identity.uid <= 0 or identity.gid <= 0):
        raise ValueError(f"refusing to run a command as {identity}: never as root")
    if not argv:
        raise ValueError("empty command")


def no_namespaces() -> "Namespaces":
    """No namespace layer in force (every sandbox shares the host's IPC, mounts, network)."""
    from sandboxd.isolation.namespaces.pins import Namespaces

    return Namespaces()


def no_disk_limits() -> "DiskDriver":
    """No disk limit in force (plain directories, nothing counted)."""
    from sandboxd.isolation.disk.plain import NoDiskLimits

    return NoDiskLimits()


def plain_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env``: what an unprivileged wrapper (``--isolation=none``) spawns with."""
    return dict(env)


class NoTerminals(Exception):
    """The privilege-drop chain in force cannot give a command a controlling terminal (the
    shell chain: its ``setsid`` forks away from the terminal); terminals need the helper."""


def terminal_wrap(wrap: Wrap) -> Wrap:
    """``wrap`` for a terminal's command, spawned on a pseudo-terminal: the exec helper's
    chain with ``--ctty`` (fd 0 becomes the controlling terminal of the command's session);
    :class:`NoTerminals` for a chain without that step."""
    from sandboxd.isolation.exec.helper import HelperSession, HelperWrapper

    if not isinstance(wrap, HelperWrapper | HelperSession):
        raise NoTerminals("terminals need the exec helper (sandboxd-exec), which is not in use")
    return attrs.evolve(wrap, ctty=True)


@frozen
class Isolation:
    """Everything the manager needs to isolate sandboxes, chosen once at start-up.

    ``wrap(identity, join_files, cwd, argv)`` returns the argv that joins the cgroup, starts a
    new session (so the exec's process group can be killed), drops privilege, and only then
    enters ``cwd`` (a component the sandbox swapped for a symlink gets it nothing its uid could
    not reach) and execs ``argv``.
    """

    name: str
    uids: UidPool
    cgroups: CgroupDriver
    fs: FsCredentials
    wrap: Wrap
    owns_files: bool
    """True when the daemon must chown what it creates to the sandbox's identity (as root)."""
    spawn_env: Callable[[Mapping[str, str]], dict[str, str]] = field(default=plain_env)
    """The ``env`` to give ``spawnProcess`` for a wrapped command whose environment is ``env``.

    The first programs of a wrapped argv run as root, so the command's environment must not reach
    them as is (``LD_PRELOAD``, ``LD_LIBRARY_PATH``, locale paths... would act with root's
    rights); the cgroup bundles encode it so that only the command, after the privilege drop,
    sees it. Raises ``ValueError`` for a name that cannot be carried (not a shell identifier, or
    the wrapper's reserved ``__SANDBOXD_`` prefix): a ``400`` for the caller.
    """
    namespaces: "Namespaces" = field(factory=no_namespaces)
    """The sandboxes' IPC, mount and network namespaces and network modes
    (:mod:`sandboxd.isolation.namespaces.pins`)."""
    exec_chain: str = "shell"
    """How commands start, for the start-up log: ``helper PATH`` or ``shell`` (the chain of
    :mod:`sandboxd.isolation.exec.wrapper`)."""
    spawn_server: "SpawnServer | None" = None
    """Starts the execs' helper argv without spawning it (``SANDBOXD_SPAWNER=server``;
    :mod:`sandboxd.isolation.exec.spawn_server`); ``None``: every command is spawned."""
    zygotes: "Zygotes | None" = None
    """The sandboxes' zygotes that fork their execs (``SANDBOXD_SPAWNER=zygote``, beside
    :attr:`spawn_server`: :mod:`sandboxd.isolation.exec.zygotes`); ``None``: none."""
    layers: tuple[str, ...] = ()
    """The capability names of the layers in force beyond uid + cgroup
    (:mod:`sandboxd.isolation.layers`), for ``/healthz``."""
    own_work_wrap: Wrap | None = None
    """``wrap`` for what the daemon runs as a sandbox for its own work (the archive's rsync
    end): the same chain, and what it starts cannot be ptraced by the sandbox's own processes
    (the helper's ``--no-ptrace``); ``None``: :attr:`wrap` (a chain without that step)."""
    disk: "DiskDriver" = field(factory=no_disk_limits)
    """Makes, measures and removes each sandbox's top directory under its disk limits
    (:mod:`sandboxd.isolation.disk`, chosen at start-up from the state root's filesystem)."""

    def create(
        self,
        rid: str,
        identity: Identity,
        limits: Limits,
        directories: SandboxDirectories,
        network: "NetworkMode",
        root: str | None = None,
        trust: bytes = b"",
    ) -> "SandboxIsolation":
        """Make sandbox ``rid``'s layers, in their order, and return its isolation: its cgroup
        with ``limits``, its directories (``directories``, their top made by :attr:`disk`:
        the disk limit comes with them; with ``root``, a template's files, the directories of
        its own root among them), then its namespaces, made and pinned once with ``network``
        wired in (and their root switched to ``root``'s; ``trust``, when not empty, the CA
        bundle its programs see: :meth:`Namespaces.create`), and entered by every process of the
        sandbox (:meth:`~sandboxd.isolation.sandbox.SandboxIsolation.start_argv`). Where one
        fails, every layer is undone, the last first, and the error raised: nothing of the
        sandbox is left but ``identity``, still the caller's to release."""
        try:
            self.cgroups.create(rid, limits)
            directories.create(rid, identity, self.disk)
            view = None if root is None else RootView(root, directories.directory(rid))
            if view is not None:
                view.prepare()
            self.namespaces.create(
                rid,
                directories.tmp(rid),
                directories.workspace(rid),
                network,
                (identity, directories.home(rid)),
                view,
                trust,
            )
        except BaseException:
            self.namespaces.remove(rid)
            self.cgroups.remove(rid)
            directories.destroy(rid, self.disk)
            raise
        return self.attach(rid, identity, directories)

    def attach(
        self, rid: str, identity: Identity, directories: SandboxDirectories
    ) -> "SandboxIsolation":
        """The isolation of sandbox ``rid`` whose layers exist (:meth:`create` made them),
        its processes running as ``identity``; nothing is made or checked."""
        from sandboxd.isolation.sandbox import SandboxIsolation

        return SandboxIsolation(self, rid, identity, directories)

    async def dispose_leftover(
        self, rid: str, directories: SandboxDirectories, in_thread: InThread
    ) -> None:
        """End sandbox ``rid``'s layers, a live one's (its
        :meth:`~sandboxd.isolation.sandbox.SandboxIsolation.dispose`) or a predecessor's
        leftover: kill every process in its cgroup; once nothing runs inside, unpin its
        namespaces; remove the (empty) cgroup; last, remove its directories (``in_thread``: a
        tree can be large).

        A process whose start was under way at the kill (an exec's helper, a zygote) joins the
        cgroup only once it runs, and so can join after the kill found it empty: its removal is
        then busy, and the kill and removal are tried again, :data:`REMOVAL_ROUNDS` times in
        all. A process that joins once the cgroup is gone fails its join and never runs."""
        await self.cgroups.kill(rid)
        self.namespaces.remove(rid)
        rounds = 1
        while True:
            try:
                self.cgroups.remove(rid)
                break
            except OSError as e:
                if e.errno != errno.EBUSY or rounds == REMOVAL_ROUNDS:
                    raise
            rounds += 1
            await self.cgroups.kill(rid)
        await in_thread(lambda rid: directories.destroy(rid, self.disk), rid)

    def leftovers(self) -> set[str]:
        """The sandbox ids a predecessor left layers of: cgroups, and namespace pins."""
        return set(self.cgroups.leftovers()) | set(self.namespaces.leftovers())

    def prepare(self) -> None:
        """Make what every sandbox's layers share: the namespaces' pins directory (start-up
        checked it already: then this does nothing)."""
        self.namespaces.prepare()

    def close(self) -> None:
        """The daemon stops, its sandboxes gone: unmount the pins directory, close the network
        modes, retire the zygotes, stop the spawn server."""
        self.namespaces.close()
        if self.zygotes is not None:
            self.zygotes.close()
        if self.spawn_server is not None:
            self.spawn_server.close()

    def spawner(
        self, reactor: IReactorProcess, sandbox: "ZygoteSpec | None" = None
    ) -> IReactorProcess:
        """What spawns an argv of a sandbox's
        :meth:`~sandboxd.isolation.sandbox.SandboxIsolation.start_argv`: ``reactor`` itself,
        or where the spawn server runs (:attr:`spawn_server`), its
        :class:`~sandboxd.isolation.exec.spawn_server.Spawner`, which hands the helper's argv
        to the server and spawns any other; with ``sandbox`` (a spawner of that sandbox's
        execs: :meth:`~sandboxd.isolation.sandbox.SandboxIsolation.spawner`), to its zygote
        first where :attr:`zygotes` run."""
        if self.spawn_server is None:
            return reactor
        from sandboxd.isolation.exec.spawn_server import Spawner

        spawner = Spawner(reactor, self.spawn_server, self.zygotes, sandbox)
        return cast(IReactorProcess, spawner)
