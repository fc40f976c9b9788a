"""The floor: what spawning a process costs here, with no daemon and no HTTP in the way.

Each spawn goes through ``posix_spawn`` (the path ``reactor.spawnProcess`` takes), with stdin
from ``/dev/null`` and stdout/stderr on pipes read to their end, as the daemon does, then
``waitpid``. The wrapper floor spawns the very argv :mod:`sandboxd.isolation.exec.wrapper` builds
for the daemon (join the cgroup as root, ``setsid``, ``setpriv``), around ``/bin/true``, in a
real cgroup made by the daemon's own cgroup driver.
"""

import os
import secrets
import select
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from sandboxd.core.manager import BASE_PATH
from sandboxd.isolation.base import Identity, Limits
from sandboxd.isolation.exec.helper import HELPER, HelperSession, HelperWrapper, helper_problem
from sandboxd.isolation.exec.wrapper import Programs, Wrapper, spawn_env
from sandboxd.isolation.none import find_program, session_wrapper

READ_SIZE = 1 << 20


def base_env(home: str) -> dict[str, str]:
    """An environment like the one the daemon gives a command."""
    return {"PATH": BASE_PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "TERM": "dumb"}


def run(argv: Sequence[str], env: dict[str, str]) -> tuple[float, int, int]:
    """Spawn ``argv``, read its stdout and stderr to their end, reap it.

    Returns (seconds, bytes of output, exit status).
    """
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    actions: list[tuple[Any, ...]] = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, err_w, 2),
    ]
    start = time.perf_counter()
    try:
        pid = os.posix_spawn(argv[0], list(argv), env, file_actions=actions)
    finally:
        os.close(out_w)
        os.close(err_w)
    total = 0
    open_fds = {out_r, err_r}
    try:
        while open_fds:
            ready, _, _ = select.select(list(open_fds), [], [])
            for fd in ready:
                data = os.read(fd, READ_SIZE)
                if data:
                    total += len(data)
                else:
                    open_fds.discard(fd)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(out_r)
        os.close(err_r)
    return time.perf_counter() - start, total, os.waitstatus_to_exitcode(status)


def run_many(argv: Sequence[str], env: dict[str, str], count: int) -> float:
    """Start ``count`` copies of ``argv`` at once (no pipes) and wait for all: wall seconds."""
    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
    start = time.perf_counter()
    pids = [os.posix_spawn(argv[0], list(argv), env, file_actions=actions) for _ in range(count)]
    for pid in pids:
        os.waitpid(pid, 0)
    return time.perf_counter() - start


class Floors:
    """The argvs of the floor rows, and the cgroup the wrapper floor joins (as root)."""

    def __init__(self, reactor: Any, isolated: bool, uid: int) -> None:
        self.reactor = reactor
        self.home = tempfile.mkdtemp(prefix="sandboxd-bench-floor-")
        os.chmod(self.home, 0o755)
        self.env = base_env(self.home)
        self.true = find_program("true")
        self.setsid = find_program("setsid")
        self.driver: Any = None
        self.rid = secrets.token_hex(8)
        self.wrapper: Wrapper | None = None
        self.identity = Identity(uid, uid)
        if isolated:
            self._make_cgroup()

    def _make_cgroup(self) -> None:
        from sandboxd.config import Config
        from sandboxd.isolation.select import Host, choose_driver

        config = Config.load({"SANDBOXD_ROOT": self.home, "SANDBOXD_ISOLATION": "auto"})
        driver = choose_driver(config, self.reactor, Host())
        driver.preflight()
        limits = Limits(memory_bytes=config.memory_max, cpu_cores=config.cpu_cores, pids=256)
        driver.create(self.rid, limits)
        self.driver = driver
        self.wrapper = Wrapper(Programs.find())

    @property
    def isolated(self) -> bool:
        return self.wrapper is not None

    def direct(self) -> list[str]:
        """``/bin/true`` itself."""
        return [self.true]

    def none_chain(self) -> list[str]:
        """The shell chain of ``--isolation=none`` for ``true``: setsid, sh (cd), true."""
        return session_wrapper(self.setsid)(self.identity, (), self.home, ["true"])

    def none_helper(self) -> list[str] | None:
        """What ``--isolation=none`` spawns for ``true`` with the helper (``None``: not built)."""
        if helper_problem(HELPER, as_root=False) is not None:
            return None
        return HelperSession(HELPER)(self.identity, (), self.home, ["true"])

    def wrapper_floor(self) -> list[str]:
        """The reference of the isolated exec target: ``/bin/true`` in the shell wrapper (join
        the cgroup as root, setsid, setpriv), no ``cd``."""
        assert self.wrapper is not None
        procs = self.driver.join_files(self.rid)
        return [
            self.wrapper.programs.sh,
            "-c",
            self.wrapper.script,
            "sandboxd-exec",
            str(self.identity.uid),
            str(self.identity.gid),
            str(len(procs)),
            *procs,
            self.true,
        ]

    def isolated_chain(self) -> list[str]:
        """The isolated shell chain for ``true`` (wrapper, sh (cd), true)."""
        assert self.wrapper is not None
        procs = self.driver.join_files(self.rid)
        return self.wrapper(self.identity, procs, self.home, ["true"])

    def isolated_helper(self, seccomp: bool = True) -> list[str] | None:
        """What the isolated daemon spawns for ``true`` with the helper (``None``: not built),
        with its system call filter or (``seccomp=False``) without."""
        if helper_problem(HELPER, as_root=True) is not None:
            return None
        procs = self.driver.join_files(self.rid)
        return HelperWrapper(HELPER, seccomp)(self.identity, procs, self.home, ["true"])

    def spawn_env(self) -> dict[str, str]:
        return spawn_env(self.env)

    async def close(self) -> None:
        if self.driver is not None:
            await self.driver.kill(self.rid)
            self.driver.remove(self.rid)
            remove_instance = getattr(self.driver, "remove_instance", None)
            if remove_instance is not None:
                remove_instance()
        os.rmdir(self.home)
