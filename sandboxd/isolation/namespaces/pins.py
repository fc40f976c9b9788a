"""Per-sandbox IPC, mount, network and PID namespaces (docs/isolation.rst, "Namespaces").

At create, the sandbox's namespaces are made once and **pinned**: the exec helper's
``namespaces`` mode (``sandboxd_exec_ns.h``; without the helper, ``unshare(1)`` and a short
script, see :mod:`sandboxd.isolation.namespaces.shell`) unshares them in a child and
bind-mounts its ``/proc/PID/ns/{ipc,mnt,net}`` onto files in ``{root}/.ns/{rid}/`` (a root-only
directory, bound onto itself with private propagation at start-up, as ``ip netns`` does for
``/run/netns``). In the new mount namespace ``/tmp`` and ``/var/tmp`` are the sandbox's own
``tmp/`` directory, ``/dev/shm`` a tmpfs of its own (capped at the memory limit, charged to
its cgroup), and ``/home`` a small root-owned tmpfs holding only ``user``, onto which the
sandbox's workspace is bound (:data:`HOME_VIEW`: E2B's ``/home/user``; the host's ``/home`` is
out of sight, and nothing is made in it), ``/run`` a small tmpfs of its own holding only
``lock/`` (the host's sockets and run-time files out of sight) and ``/dev`` one holding only
the allowed devices (no ``/dev/log``; docs/isolation.rst, "What of the host a sandbox sees");
the rest of the host's filesystem is as before (the host's later mounts arrive by slave
propagation), and nothing mounted there reaches the host.
The helper's server copies a template namespace of its own, which never holds a pin, rather
than the host's (``sandboxd_exec_ns.h``); the shell chain copies the host's and detaches the
pins' directory. A state root or tools directory inside one of those places (test set-ups)
stays reachable: the root-owned directory holding it there is bound back at its own path.

Every process of the sandbox enters the pinned namespaces with ``setns`` before it drops privilege
(:meth:`Namespaces.enter`, in the one chain of
:meth:`sandboxd.isolation.sandbox.SandboxIsolation.start_argv`, the archive's rsync end included):
the helper's ``enter`` prefix, ``nsenter`` in the shell chain. Kill unmounts the pins (the
namespaces, their IPC objects, tmpfs and sockets go once the last process has); start-up removes a
crashed predecessor's (:meth:`Namespaces.leftovers`).

The PID namespace (``pid``, only with ``mount`` and the helper: ``all`` leaves it out, saying
why, on the shell chain or where the kernel refuses it) has an init of its own that mounts the
namespace's ``/proc``; entering it makes the helper a relay that forks the command inside
(``sandboxd_exec_ns.h``), and the sandbox's end kills that init
(:mod:`sandboxd.isolation.namespaces.pidns`). The pids the API reports are the relays', as the
host numbers them: the daemon signals their process group, which holds the command.
"""

import errno
import os
import stat
import subprocess
from collections.abc import Callable, Sequence
from contextlib import suppress

from attrs import define, field
from twisted.logger import Logger

from sandboxd.isolation.base import PLAIN_ENV, Identity, IsolationUnavailable, RunProgram
from sandboxd.isolation.namespaces.creators import Creator, HelperCreator
from sandboxd.isolation.namespaces.identity_files import (
    rewrite_trust_file,
    write_identity_files,
    write_trust_file,
)
from sandboxd.isolation.namespaces.kinds import HOST_VIEW_PIN, KINDS, PIN, AllLayers
from sandboxd.isolation.namespaces.mounts import MountCalls, is_mount_point
from sandboxd.isolation.namespaces.netns_pool import NetnsPool
from sandboxd.isolation.namespaces.pidns import kill_init
from sandboxd.isolation.namespaces.root_view import RootView, probe_root, write_root_files
from sandboxd.isolation.naming import is_rid
from sandboxd.isolation.network.modes import NetworkMode, NetworkPolicy, host_only

PLACES = ("/tmp", "/var/tmp", "/dev/shm", "/home", "/run")
"""Shared places each sandbox gets its own of (a state root or tools inside one is kept)."""

HOME = "/home"
HOME_VIEW = "/home/user"
"""Where a sandbox with a mount namespace sees its workspace (when the host has a ``/home``)."""


def home_coverable(home: str = HOME) -> bool:
    """True when ``home`` is a directory (not a symlink) that a mount namespace can cover."""
    try:
        return stat.S_ISDIR(os.lstat(home).st_mode)
    except OSError:
        return False


NS_DIR = ".ns"
PROBE_IDENTITY = Identity(65534, 65534)
"""Who the start-up probe's ``/etc/passwd`` names (nobody: the probe runs no command)."""

log = Logger()


def run_program(argv: Sequence[str]) -> tuple[int, str]:
    """A :data:`~sandboxd.isolation.base.RunProgram`: ``argv`` run to its end in
    :data:`~sandboxd.isolation.base.PLAIN_ENV`; its exit code and stderr text."""
    done = subprocess.run(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=PLAIN_ENV,
        timeout=30,
        check=False,
    )
    return done.returncode, done.stderr.decode("utf-8", "replace").strip()


def kept_directories(places: Sequence[str], paths: Sequence[str]) -> list[str]:
    """For each of ``paths`` lying inside one of ``places``, the directory directly inside that
    place holding it (bound back into each sandbox's view)."""
    kept: list[str] = []
    for path in paths:
        for place in places:
            real = os.path.realpath(place)
            rel = os.path.relpath(path, real)
            if rel == "." or rel.startswith(".."):
                continue
            top = os.path.join(place, rel.split(os.sep)[0])
            if top not in kept:
                kept.append(top)
    return kept


def _ordered(pins: dict[str, str]) -> list[str]:
    """The pin paths with the mount namespace's last (past it the others are out of sight)."""
    return [pins[kind] for kind in ("ipc", "net", "pid", "mount") if kind in pins]


@define
class Namespaces:
    """The namespace layers in force (none at all: every method is a no-op) and the pins."""

    kinds: frozenset[str] = frozenset()
    nsroot: str = ""
    network: NetworkPolicy = field(factory=host_only)
    creator: Creator | None = None
    keep: list[str] = field(factory=list)
    shm_bytes: int = 64 << 20
    run: RunProgram = run_program
    mounts: MountCalls = field(factory=MountCalls)
    home_covered: Callable[[], bool] = home_coverable
    """Whether the host's ``/home`` is a directory the mount namespace covers."""
    pool: NetnsPool | None = None
    """Network namespaces of one mode wired ahead (``SANDBOXD_NETNS_POOL``); ``None``: none."""
    _pins: dict[str, dict[str, str]] = field(factory=dict)
    _modes: dict[str, NetworkMode] = field(factory=dict)
    _prepared: bool = False
    _roots: bool = True
    """False once the start-up probe found that no root can be switched on this state root."""

    def capabilities(self) -> list[str]:
        """``isolation.ipc``, ``isolation.mount``, ``isolation.net``, ``isolation.pid`` in force,
        and the network
        modes a create may ask for."""
        return sorted([f"isolation.{kind}" for kind in self.kinds] + self.network.capabilities())

    @property
    def switches_root(self) -> bool:
        """Whether a sandbox can run in a template's root: the mount namespace, made by the
        exec helper (``sandboxd_exec_root.h``; the shell chain cannot switch roots), where the
        start-up probe could switch one (:meth:`prepare`)."""
        return self._roots and "mount" in self.kinds and isinstance(self.creator, HelperCreator)

    def workspace_view(self, workspace: str) -> str:
        """Where a sandbox's commands see its workspace (real path ``workspace``):
        :data:`HOME_VIEW` when the mount namespace binds it there, else the real path."""
        if "mount" in self.kinds and self.home_covered():
            return HOME_VIEW
        return workspace

    def prepare(self) -> None:
        """Make ``{root}/.ns`` (root only) a mount with private propagation, check every kept
        directory is root's alone (and not :data:`HOME_VIEW`, where the workspace goes), and
        make and remove one probe set of namespaces, so that a layer the kernel refuses stops
        start-up (``IsolationUnavailable`` naming it). Once done, calling it again does nothing
        (until :meth:`close`)."""
        if not self.kinds or self._prepared:
            return
        for path in self.keep:
            if path == HOME_VIEW:
                raise IsolationUnavailable(
                    f"namespaces: the state root or tools lie in {HOME_VIEW}, where each"
                    " sandbox's workspace is mounted: choose another SANDBOXD_ROOT/TOOLS_DIR"
                )
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
                raise IsolationUnavailable(
                    f"namespaces: {path} holds the state root or tools inside a shared place:"
                    " it must be a directory owned by root and writable by root alone"
                )
        os.makedirs(self.nsroot, mode=0o700, exist_ok=True)
        os.chmod(self.nsroot, 0o700)
        try:
            if not is_mount_point(self.nsroot):
                self.mounts.bind(self.nsroot, self.nsroot)
            self.mounts.make_private(self.nsroot)
        except OSError as e:
            raise IsolationUnavailable(f"namespaces: cannot pin in {self.nsroot}: {e}") from None
        if self.pool is not None:
            self.pool.reclaim()  # a crashed predecessor's, before its veths' slots are reused
        try:
            for mode in self.network.offered.values():
                mode.prepare()  # egress: the host's side (table, forwarding) before the probe
            self._probe()
            if self.pool is not None:
                self.pool.start()
        except BaseException:
            for mode in self.network.offered.values():
                mode.close()  # start-up stops here: nothing of the modes is left on the host
            raise

    def _probe(self) -> None:
        """One probe set made and removed; with ``all``, a probe the kernel refuses with
        ``pid`` (a pod whose user namespace forbids a new ``/proc``) is made again without it,
        the reason logged, instead of stopping start-up."""
        try:
            self._probe_once()
        except IsolationUnavailable as e:
            if not isinstance(self.kinds, AllLayers) or "pid" not in self.kinds:
                raise
            log.warn("namespaces: pid left out of all: {why}", why=str(e))
            self.kinds = AllLayers(self.kinds - {"pid"})
            self._probe_once()

    def _probe_once(self) -> None:
        probe = "0" * 16
        probe_tmp = os.path.join(self.nsroot, "probe-tmp")
        self._remove_probe(probe, probe_tmp)
        os.mkdir(probe_tmp, 0o700)
        try:
            mode = self.network.offered[self.network.default]
            self._make(probe, probe_tmp, probe_tmp, mode, (PROBE_IDENTITY, probe_tmp))
        except OSError as e:
            raise IsolationUnavailable(f"namespaces {', '.join(sorted(self.kinds))}: {e}") from e
        finally:
            self._remove_probe(probe, probe_tmp)
        self._prepared = True
        if self.switches_root:
            mode = self.network.offered[self.network.default]

            def make(view: RootView) -> None:
                self._make(probe, probe_tmp, probe_tmp, mode, (PROBE_IDENTITY, probe_tmp), view)

            self._roots = probe_root(self.nsroot, probe_tmp, make, lambda: self.remove(probe))

    def _remove_probe(self, probe: str, probe_tmp: str) -> None:
        self.remove(probe)
        for path in self.keep:  # the mount points the probe made for the kept directories
            with suppress(FileNotFoundError):
                os.rmdir(os.path.join(probe_tmp, os.path.basename(path)))
        with suppress(FileNotFoundError):
            os.rmdir(probe_tmp)

    def create(
        self,
        rid: str,
        tmp: str,
        workspace: str,
        mode: NetworkMode,
        user: tuple[Identity, str] | None = None,
        root: RootView | None = None,
        trust: bytes = b"",
    ) -> None:
        """Make and pin the sandbox's namespaces (its network one only for a mode that wants
        one; its ``tmp`` and ``workspace`` directories in their places; with ``user``, its
        identity and home, an ``/etc/passwd`` and ``/etc/group`` naming it; with ``root``, a
        template's files as its root; with ``trust``, the CA bundle it sees at
        ``/etc/ssl/certs/ca-certificates.crt``, a file of its own beside the pins, root's,
        bound there), then attach the network mode; ``OSError`` when the
        kernel refused, or for a ``root`` where no root can be switched
        (:attr:`switches_root`)."""
        if root is not None and not self.switches_root:
            raise OSError(
                errno.EOPNOTSUPP, "a template's root needs the mount namespace and the exec helper"
            )
        if not self.kinds:
            return
        self._make(rid, tmp, workspace, mode, user, root, trust)

    def retrust(self, rid: str, bundle: bytes) -> None:
        """Rewrite in place the CA bundle sandbox ``rid`` sees (:func:`rewrite_trust_file`;
        nothing when it has none: no mount namespace, or a host without a bundle)."""
        if "mount" in self.kinds:
            rewrite_trust_file(os.path.join(self.nsroot, rid), bundle)

    def _make(
        self,
        rid: str,
        tmp: str,
        workspace: str,
        mode: NetworkMode,
        user: tuple[Identity, str] | None,
        root: RootView | None = None,
        trust: bytes = b"",
    ) -> None:
        assert self.creator is not None
        kinds = set(self.kinds)
        if not mode.own_namespace:
            kinds.discard("net")
        directory = os.path.join(self.nsroot, rid)
        os.mkdir(directory, 0o700)
        if user is not None and "mount" in kinds:
            write_identity_files(directory, *user)
        if trust and "mount" in kinds:
            write_trust_file(directory, trust)
        if root is not None:
            write_root_files(directory, root)
        pins = {kind: os.path.join(directory, PIN[kind]) for kind in KINDS if kind in kinds}
        if root is not None:
            pins["host-view"] = os.path.join(directory, HOST_VIEW_PIN)
        self._pins[rid] = pins
        pool = self.pool
        # Taken only now: a namespace taken is handed over or removed, never lost.
        pooled = pool.take() if pool is not None and "net" in kinds and pool.serves(mode) else None
        if pooled is not None:
            assert pool is not None
            self._modes[rid] = mode  # from here on, remove(rid) detaches the slot
            os.close(os.open(pins["net"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400))
            pool.hand_over(pooled, rid, pins["net"])
            kinds.discard("net")  # made and wired already: the helper leaves it out
        places = (tmp, workspace)
        argv = self.creator.argv(
            self.nsroot, rid, frozenset(kinds), places, self.shm_bytes, self.keep
        )
        code, err = self.run(argv)
        if code != 0:
            raise OSError(errno.EPERM, f"cannot make namespaces (exit {code}): {err}")
        if "net" in kinds:
            mode.attach(rid, self._pins[rid]["net"])
        self._modes[rid] = mode

    def enter(self, rid: str, argv: list[str], own_work: bool = False) -> list[str]:
        """``argv`` (the wrapped command) prefixed so that it runs in the sandbox's namespaces;
        for the daemon's ``own_work`` in a sandbox of a template, its mount namespace as it was
        before the root switch (:data:`HOST_VIEW_PIN`: the archive's ``rsync`` end needs
        nothing of the template)."""
        pins = self._pins.get(rid)
        if not pins or self.creator is None:
            return argv
        if own_work and "host-view" in pins:
            pins = {**pins, "mount": pins["host-view"]}
        return self.creator.enter(_ordered(pins), argv)

    def net_pin(self, rid: str) -> str | None:
        """Where ``rid``'s own network namespace is pinned (``None``: it has none; the ports
        proxy, :mod:`sandboxd.ports.dial`, connects only there)."""
        return self._pins.get(rid, {}).get("net")

    def remove(self, rid: str) -> None:
        """Detach the network mode, kill the PID namespace's init (and with it every process
        left inside), unmount and remove every pin of ``rid`` (none: no error)."""
        pins = self._pins.pop(rid, None)
        mode = self._modes.pop(rid, None)
        directory = os.path.join(self.nsroot, rid)
        if not self.nsroot:
            return
        net = os.path.join(directory, PIN["net"])
        if mode is not None and pins is not None and "net" in pins:
            mode.detach(rid, net)
        elif mode is None and os.path.exists(net):
            # A predecessor's: whichever mode wired it undoes what it finds.
            for offered in self.network.offered.values():
                if offered.own_namespace:
                    offered.detach(rid, net)
        kill_init(directory, os.path.join(directory, PIN["pid"]))
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(directory, name)
            self.mounts.unmount_all(path)
            os.unlink(path)
        os.rmdir(directory)

    def leftovers(self) -> list[str]:
        """Sandbox ids with pins under ``{root}/.ns`` (a crashed predecessor's, at start-up)."""
        if not self.nsroot:
            return []
        try:
            names = os.listdir(self.nsroot)
        except FileNotFoundError:
            return []
        return sorted(name for name in names if is_rid(name))

    def close(self) -> None:
        """Remove the pool's namespaces, close the network modes, unmount ``{root}/.ns`` (the
        daemon stops: every sandbox is gone), end the runner."""
        self._prepared = False
        if self.pool is not None:
            self.pool.close()
        for mode in self.network.offered.values():
            mode.close()
        end_runner = getattr(self.run, "close", None)
        if end_runner is not None:
            end_runner()
        if self.kinds and self.nsroot and os.path.isdir(self.nsroot):
            self.mounts.unmount_all(self.nsroot)
            try:
                os.rmdir(self.nsroot)
            except OSError as e:
                log.warn("namespaces: cannot remove {path}: {why}", path=self.nsroot, why=e)
