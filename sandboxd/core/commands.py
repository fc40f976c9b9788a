"""Running commands in a sandbox: ``exec``, background processes and workspace watches.

A mixin of :class:`~sandboxd.core.manager.SandboxManager` (the attributes it uses are the
manager's). Exec and background processes are one way to run a command (:meth:`_launch`: the
tools, the environment and its size, the isolation's wrapper; the runner
:class:`~sandboxd.core.exec.run.ExecRun`), with two ways to follow it: a request to the end, or
a bounded log that readers come and go on.
"""

import os
from collections.abc import Callable
from typing import TypeVar

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorProcess, IReactorTime
from twisted.logger import Logger

from sandboxd.config import Config
from sandboxd.core.exec.run import ExecRun, Exited, Outcome
from sandboxd.core.exec.spec import ExecSpec, check_exec_size
from sandboxd.core.files.paths import Parts
from sandboxd.core.layout import Layout
from sandboxd.core.processes.log import OutputLog
from sandboxd.core.processes.process import Process
from sandboxd.core.processes.terminal import TerminalRun, TerminalSize
from sandboxd.core.sandbox import Sandbox
from sandboxd.core.watch.budget import WatchBudget
from sandboxd.core.watch.charge import thread_euid
from sandboxd.core.watch.watch import WatchEvent, WorkspaceWatch
from sandboxd.errors import BadRequest, NoCapacity, TerminalsUnavailable, TooMany
from sandboxd.isolation.base import Isolation, NoTerminals
from sandboxd.metrics import Metrics
from sandboxd.units import format_size

T = TypeVar("T")

BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
HOME_USER = "user"
"""``USER`` of a command run in the workspace as its home (E2B's user name)."""

log = Logger()


class Launch(ExecRun):
    """A run made ready by the manager: the wrapped argv and environment it will spawn."""

    argv: list[str]
    env: dict[str, str]


class TerminalLaunch(TerminalRun, Launch):
    """A run made ready by the manager to spawn on a pseudo-terminal."""


def _chain(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        then()

    return both


class Commands:
    """The manager's commands (a mixin: the manager provides these attributes)."""

    config: Config
    reactor: IReactorProcess
    clock: IReactorTime
    isolation: Isolation
    layout: Layout
    metrics: Metrics
    watch_budget: WatchBudget
    _devnull: int

    def files(self, sandbox: Sandbox, work: Callable[[str], T]) -> Deferred[T]:
        raise NotImplementedError  # pragma: no cover - the manager's

    def workspace_seen(self, sandbox: Sandbox, request: ExecSpec) -> str:
        """The workspace's path as ``request``'s command sees it (the real path, or for an
        ``as_home`` command the view the namespaces give it)."""
        workspace = self.layout.workspace(sandbox.rid)
        if not request.as_home:
            return workspace
        return self.isolation.namespaces.workspace_view(workspace)

    def command_env(self, sandbox: Sandbox, request: ExecSpec) -> dict[str, str]:
        """A fresh environment: the host's base, then create-time env, then exec env last."""
        path = BASE_PATH
        for sha in reversed(request.tools):
            path = os.path.join(self.config.tools_dir, sha, "bin") + ":" + path
        env = {
            "PATH": path,
            "HOME": self.layout.home(sandbox.rid),
            "TMPDIR": self.layout.tmp(sandbox.rid),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
        }
        if request.as_home:
            env.update(HOME=self.workspace_seen(sandbox, request), USER=HOME_USER)
        env.update(sandbox.env)
        env.update(request.env)
        return env

    def start_exec(
        self, sandbox: Sandbox, request: ExecSpec, on_output: Callable[[int, bytes], None]
    ) -> ExecRun:
        """Spawn the command in the sandbox; ``on_output(fd, data)`` is told each chunk of
        its output, and the run's ``when_finished()`` gives how it ended.

        An exec is a run that a request follows to its end: it counts as running (the idle
        reaper and the drain wait for it), keeps its output for the final frame, and is
        killed when its follower goes (the front's :meth:`ExecRun.abort`). It starts through
        the isolation's spawn server (or its sandbox's zygote) when there is one.
        """
        timeout = self.config.exec_timeout
        if request.timeout is not None:
            timeout = min(timeout, request.timeout)
        started = self.clock.seconds()

        def end() -> None:
            sandbox.running.discard(run)
            self.metrics.execs_in_flight.dec()
            self.metrics.exec_seconds.observe(self.clock.seconds() - started)
            outcome = run.outcome
            code = outcome.code if isinstance(outcome, Exited) else None
            self.metrics.exec_exits.labels("error" if code is None else str(code)).inc()

        run = self._launch(
            sandbox,
            request,
            on_output,
            max_output=self.config.max_output,
            log_timeout=self.config.log_timeout,
            timeout=timeout,
            on_end=end,
        )
        sandbox.execs += 1
        sandbox.running.add(run)
        self.metrics.execs_in_flight.inc()
        spawner = sandbox.isolation.spawner(self.reactor)
        try:
            run.start(spawner, run.argv, run.env, request.stdin, self._devnull)
        except BaseException:
            # Not started at all (fork or pipes refused): nothing may wait for it to end.
            sandbox.running.discard(run)
            self.metrics.execs_in_flight.dec()
            raise
        return run

    def start_process(
        self, sandbox: Sandbox, request: ExecSpec, tag: str | None = None, stdin: bool = False
    ) -> Process:
        """Start the command in the background of the sandbox and return its record at once
        (docs/extensions.rst, "Background processes"): the same run as an exec, its output
        into a bounded log instead of a request. It runs until it ends, is signalled, reaches
        ``request.timeout`` (124) or its sandbox dies; it does not count as running (a silent
        one lets its sandbox be reaped), its output counts as activity. Like an exec, it
        starts through the isolation's spawn server or zygote when there is one: its pid may
        come later (``process.run.when_started()``; a front that answers the pid waits
        for it)."""
        sandbox.processes.make_room()
        output = OutputLog(self.config.process_log_max)
        run = self._launch(
            sandbox,
            request,
            output.append,
            max_output=0,
            log_timeout=None,
            timeout=request.timeout,
        )
        process = Process(
            id=sandbox.processes.new_id(),
            tag=tag,
            cmd=request.cmd,
            started=self.clock.seconds(),
            run=run,
            log=output,
            stdin=stdin,
        )
        run.on_end = _chain(run.on_end, process.ended)
        spawner = sandbox.isolation.spawner(self.reactor)
        run.start(spawner, run.argv, run.env, request.stdin, self._devnull, keep_stdin_open=stdin)
        sandbox.processes.add(process)
        log.info("process {id} started in {rid}", id=process.id, rid=sandbox.rid)
        return process

    # Terminals (docs/extensions.rst, "Terminals")

    def start_terminal(
        self, sandbox: Sandbox, request: ExecSpec, size: TerminalSize, tag: str | None = None
    ) -> Process:
        """Start the command on a pseudo-terminal of window size ``size`` in the background of
        the sandbox and return its record at once: a background process (the same table, the
        same cap, the same reading of its output) whose output is the terminal's, with its
        ``terminal_scrollback`` last bytes kept for a reader that attaches later, whose stdin
        is the terminal's keyboard, and which can be resized. ``request.env`` gives its
        ``TERM``."""
        sandbox.processes.make_room()
        output = OutputLog(self.config.terminal_scrollback)
        run = self._launch(
            sandbox,
            request,
            output.append,
            max_output=0,
            log_timeout=None,
            timeout=request.timeout,
            terminal=True,
        )
        assert isinstance(run, TerminalLaunch)
        process = Process(
            id=sandbox.processes.new_id(),
            tag=tag,
            cmd=request.cmd,
            started=self.clock.seconds(),
            run=run,
            log=output,
            stdin=True,
        )
        run.on_end = _chain(run.on_end, process.ended)
        run.start_terminal(self.reactor, run.argv, run.env, size)
        sandbox.processes.add(process)
        log.info("terminal {id} started in {rid}", id=process.id, rid=sandbox.rid)
        return process

    def _launch(
        self,
        sandbox: Sandbox,
        request: ExecSpec,
        on_output: Callable[[int, bytes], None],
        *,
        max_output: int,
        log_timeout: float | None,
        timeout: float | None,
        on_end: Callable[[], None] = lambda: None,
        terminal: bool = False,
    ) -> "Launch":
        """The one way a command is made ready to run in a sandbox (exec and background
        process alike): tools checked, environment built and size-checked, argv wrapped by
        the isolation; the run's output counts as the sandbox's activity."""
        for sha in request.tools:
            if not os.path.isdir(os.path.join(self.config.tools_dir, sha)):
                raise BadRequest(f"tools: {sha} is not installed")
        cwd = os.path.join(self.workspace_seen(sandbox, request), *request.cwd)
        if sandbox.workdir and not request.cwd:
            cwd = sandbox.workdir  # the template's (docs/extensions.rst, "Templates")
        env = self.command_env(sandbox, request)
        # E2BIG is decided here, on the environment the command would really get: 400.
        check_exec_size(request.cmd, env)
        try:
            env = self.isolation.spawn_env(env)
        except ValueError as e:
            raise BadRequest(f"env: {e}") from None

        def touch() -> None:
            sandbox.last_active = self.clock.seconds()

        def end() -> None:
            touch()
            on_end()
            if run.timed_out:
                log.info("a command in {rid} timed out (exit 124)", rid=sandbox.rid)

        run = (TerminalLaunch if terminal else Launch)(
            self.clock,
            on_output,
            max_output=max_output,
            log_timeout=log_timeout,
            timeout=timeout,
            on_activity=touch,
            on_end=end,
        )
        run.review = self._oom_review(sandbox, request)
        # namespaces, cgroup, uid, seccomp: the one chain of every process of a sandbox
        try:
            run.argv = sandbox.isolation.start_argv(cwd, request.cmd, terminal=terminal)
        except NoTerminals as e:
            raise TerminalsUnavailable(str(e)) from None
        run.env = env
        return run

    def _oom_kills(self, sandbox: Sandbox) -> int | None:
        """The sandbox cgroup's OOM kill counter (``None``: it cannot be read)."""
        try:
            return sandbox.isolation.oom_kills()
        except OSError:
            return None

    def _oom_review(self, sandbox: Sandbox, request: ExecSpec) -> Callable[[Outcome], Outcome]:
        """The run's review: a command that failed while the cgroup's OOM kill counter rose
        (read now, and at its end) is marked ``oom_killed`` and the cause logged, naming the
        limit and its setting."""
        before = self._oom_kills(sandbox)

        def review(outcome: Outcome) -> Outcome:
            if before is None or not isinstance(outcome, Exited) or outcome.code == 0:
                return outcome
            kills = self._oom_kills(sandbox)
            if kills is None or kills <= before:
                return outcome
            log.warn(
                "sandbox {rid}: {cmd} ended {code}: the kernel OOM-killed {n} of its processes"
                " at the sandbox's memory limit, SANDBOXD_MEMORY_MAX={limit}",
                rid=sandbox.rid,
                cmd=request.cmd[0],
                code=outcome.code,
                n=kills - before,
                limit=format_size(self.config.memory_max),
            )
            return attrs.evolve(outcome, oom_killed=True)

        return review

    async def watch(
        self,
        sandbox: Sandbox,
        root: Parts,
        recursive: bool,
        deliver: Callable[[WatchEvent], None],
    ) -> WorkspaceWatch:
        """A running watch of the workspace under ``root``, at most ``watch_max`` per sandbox
        (``TooMany``); ``close()`` it when its consumer goes (docs/extensions.rst,
        "Workspace watch")."""
        if len(sandbox.watches) >= self.config.watch_max:
            raise TooMany(f"{self.config.watch_max} watches are open on this sandbox already")
        # As root with a uid per sandbox, the sandbox's uid pays for its watches, not root
        # (docs/isolation.rst, "Kernel quotas").
        set_euid = thread_euid() if self.isolation.owns_files else None
        charged_to = None if set_euid is None else (sandbox.identity.uid, set_euid.set)
        account = None
        if charged_to is None:  # the daemon's own uid pays: within its budget
            account = self.watch_budget.account(sandbox.rid)
            if account is None:
                raise NoCapacity("every inotify instance the daemon may take is in use")
        try:
            watch = WorkspaceWatch(
                self.reactor,  # type: ignore[arg-type]
                lambda work: self.files(sandbox, work),
                root,
                recursive,
                deliver,
                on_close=lambda: sandbox.watches.discard(watch),
                charged_to=charged_to,
                account=account,
            )
        except OSError as e:
            if account is not None:
                account.close()
            raise NoCapacity(f"cannot open an inotify instance: {e}") from None
        sandbox.watches.add(watch)
        await watch.start()
        return watch
