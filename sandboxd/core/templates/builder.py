"""A template built from a Dockerfile (docs/extensions.rst, "Building a template").

The build writes into ``{root}/.templates/.build-{random}/rootfs``: ``FROM`` copies the base
template's files there (or a Debian suite's, :mod:`~sandboxd.core.templates.debian`), ``RUN``
runs as root inside it (:mod:`~sandboxd.core.templates.build_runner`: a user namespace whose
root is the host's, its root switched to the build's files, nothing of the host reachable),
``COPY`` writes the context's files with an import's checks, ``ENV`` and ``WORKDIR`` change
what the later steps and the template's sandboxes get. Once every step has passed, the
directory is renamed into place as an import's is; a failed or cancelled build is removed,
and one a killed daemon left is removed at the next start (:meth:`TemplateStore.open`).

Each step is reported as it goes through ``emit``, as values of
:mod:`~sandboxd.core.templates.build_events`: its start, each line of its output, then the
build's end (:func:`step_started`, :meth:`Build._line`, :func:`build_failed`).
"""

import contextlib
import os
import posixpath
import signal
import sys
from collections.abc import Callable
from typing import IO, Any

from attrs import define, field
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from sandboxd.core.templates import build_files, build_runner, debian, dockerfile
from sandboxd.core.templates.build_events import (
    BuildEvent,
    BuildFailed,
    Built,
    StepOutput,
    StepStarted,
)
from sandboxd.core.templates.build_limits import BuildLimits, RunCgroup
from sandboxd.core.templates.dockerfile import Step
from sandboxd.core.templates.extract import Stopped
from sandboxd.core.templates.store import ROOTFS, Template, TemplateStore
from sandboxd.errors import BadRequest, SandboxdError, TemplateCannotRun

log = Logger()

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""``RUN``'s ``PATH`` unless the template's or an ``ENV`` sets one."""
NETWORKS = ("none", "host")
OUTPUT_KEPT = 200
SHUTDOWN_WAIT = 10.0
"""The longest a stopping daemon waits for a build it cancelled to end (its command killed)."""
"""The last lines of a failed step's output repeated in the build's end."""
LINE_MAX = 16384
"""The longest line of ``RUN``'s output a frame carries: a longer one is cut into pieces of
this size (output without newlines must not grow the daemon's memory)."""


class StepFailed(Exception):
    """A step that did not pass: why, and ``RUN``'s exit code."""

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _RunProtocol(ProcessProtocol):
    """One ``RUN``'s process: its output (stdout and stderr) as lines, then its exit code."""

    def __init__(self, line: Callable[[str], None]) -> None:
        self.line = line
        self.ended: Deferred[int] = Deferred()
        self._partial = {1: b"", 2: b""}

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        *lines, rest = (self._partial[childFD] + data).split(b"\n")
        while len(rest) >= LINE_MAX:  # a line without its end yet: its full pieces go now
            lines.append(rest[:LINE_MAX])
            rest = rest[LINE_MAX:]
        self._partial[childFD] = rest
        for line in lines:
            self.line(line.decode("utf-8", "replace"))

    def processEnded(self, reason: Failure) -> None:
        for rest in self._partial.values():
            if rest:
                self.line(rest.decode("utf-8", "replace"))
        code = getattr(reason.value, "exitCode", None)
        self.ended.callback(code if code is not None else 128 + signal.SIGKILL)


@define
class Build:
    """One build of template ``name`` (the name reserved in ``store`` until it ends)."""

    store: TemplateStore
    name: str
    steps: list[Step]
    context: IO[bytes] | None
    network: str
    emit: Callable[[BuildEvent], None]
    env: dict[str, str] = field(factory=dict)
    workdir: str = "/"
    directory: str = ""
    base_digest: str = ""
    cancelled: bool = False
    timed_out: bool = False
    _process: Any = None
    _group: RunCgroup | None = None
    _paused: bool = False
    _output: list[str] = field(factory=list)
    _step: int = 0
    _ended: Deferred[None] = field(factory=Deferred)
    _shutting_down: bool = False

    @property
    def rootfs(self) -> str:
        return os.path.join(self.directory, ROOTFS)

    @property
    def limits(self) -> BuildLimits:
        return self.store.build_limits

    def cancel(self) -> None:
        """Stop the build (its client went): the running command is killed, every process of
        its cgroup with it (what it started would keep its output's pipe open: its end
        would never come), and nothing is kept (its output is read again, to its end: a
        paused pipe would keep it from ending)."""
        self.cancelled = True
        self.resume_output()
        if self._process is not None:
            with contextlib.suppress(ProcessExitedAlready):  # it ended, its output unread
                self._process.signalProcess("KILL")
        if self._group is not None:  # its end kills it again, and fails if it cannot
            self._group.kill().addErrback(lambda _: None)

    def pause_output(self) -> None:
        """The client is behind: the running command's output is read no more until
        :meth:`resume_output` (its pipe fills and it waits; so does a command started
        meanwhile). What the daemon holds for a client that does not read is bounded."""
        self._paused = True
        if self._process is not None:
            self._process.pauseProducing()

    def resume_output(self) -> None:
        """The client takes frames again: the command's output is read again."""
        self._paused = False
        if self._process is not None:
            self._process.resumeProducing()

    def _time_out(self) -> None:
        """The build ran past its time: its running command is killed, and it fails."""
        self.timed_out = True
        self.cancel()

    def _stop_reason(self) -> str:
        if self.timed_out:
            return (
                f"the build ran past its time limit ({self.limits.timeout:g} s,"
                " SANDBOXD_BUILD_TIMEOUT): its step was stopped"
            )
        return "the build was cancelled"

    async def run(self) -> Template | None:
        """Every step, then the template in place; the end is emitted either way (``None``
        when the build failed: nothing of it is left; a fault of the daemon's is logged and
        ends it as a failed step does). Past :attr:`BuildLimits.timeout`, the running
        command is killed and the build fails at its step, saying so."""
        reactor = self.store.reactor
        timer = reactor.callLater(self.limits.timeout, self._time_out)
        trigger = reactor.addSystemEventTrigger("before", "shutdown", self._shut_down)
        try:
            return await self._run()
        finally:
            if timer.active():
                timer.cancel()
            if not self._shutting_down:
                reactor.removeSystemEventTrigger(trigger)
            self._ended.callback(None)

    def _shut_down(self) -> Deferred[None]:
        """The daemon stops: the build is cancelled, and the reactor waits (for the Deferred)
        until it has ended, its command killed and its cgroup removed, or
        :data:`SHUTDOWN_WAIT` seconds (a step in the store's pool, which stops meanwhile,
        may never end). Its directory is left for the next start to remove."""
        self._shutting_down = True
        self.cancel()
        ended: Deferred[None] = Deferred()
        self._ended.addBoth(lambda _: None if ended.called else ended.callback(None))
        ended.addTimeout(SHUTDOWN_WAIT, self.store.reactor)
        return ended.addErrback(lambda _: None)

    async def _run(self) -> Template | None:
        created = self.store.reactor.seconds()
        try:
            self.directory = self.store.begin(self.name)
            for number, step in enumerate(self.steps, 1):
                self._step, self._output = number, []
                if self.cancelled:
                    raise StepFailed(self._stop_reason())
                self.emit(step_started(number, len(self.steps), step))
                await STEPS[step.instruction](self, step)
            if self.cancelled:  # during the last step, which was not a command
                raise StepFailed(self._stop_reason())
            template = await self._finish(created)
        except Exception as e:
            if self._shutting_down:  # the store's pool stops too: the next start removes it
                log.info("templates: build of {name} stopped with the daemon", name=self.name)
            else:
                await self.store.abandon(self.directory, self.name)
            reason = str(e)
            if not isinstance(e, (StepFailed, SandboxdError, OSError)):
                log.failure("templates: build of {name}", Failure(e), name=self.name)
                reason = f"{type(e).__name__}: {e}"
            number = max(self._step, 1)  # the first step, where the build could not begin
            self.emit(build_failed(number, self.steps[number - 1], reason, self._output, e))
            return None
        self.emit(Built(template))
        return template

    async def _finish(self, created: float) -> Template:
        size = await self.store.in_thread(build_files.tree_size, self.rootfs)
        dockerfile_text = "\n".join(step.text for step in self.steps)
        digest = await self.store.in_thread(
            build_files.context_digest, dockerfile_text, self.context, self.base_digest
        )
        template = Template(self.name, digest, size, self.env, self.workdir, created)
        await self.store.complete(self.directory, template)
        return template

    def _line(self, line: str) -> None:
        self._output.append(line)
        del self._output[:-OUTPUT_KEPT]
        self.emit(StepOutput(self._step, line))

    async def from_(self, step: Step) -> None:
        name = dockerfile.from_name(step)
        if name.startswith("debian:"):
            await debian.bootstrap(self, name.partition(":")[2])
            return
        base = self.store.get(name)
        self.base_digest = base.digest
        self.env, self.workdir = dict(base.env), base.workdir
        await self.stoppable(build_files.copy_base, self.store.rootfs(base), self.rootfs)

    async def stoppable(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args, stopped)`` in the store's pool (a copy), ``stopped()`` saying whether
        the build was cancelled or ran past its time, which ``work`` asks as it goes and then
        raises :class:`~sandboxd.core.templates.extract.Stopped`: ``StepFailed`` saying
        which."""
        try:
            return await self.store.in_thread(work, *args, lambda: self.cancelled)
        except Stopped:
            raise StepFailed(self._stop_reason()) from None

    async def run_step(self, step: Step) -> None:
        await self.execute(dockerfile.run_argv(step))

    async def execute(self, argv: list[str]) -> None:
        """``argv`` as root inside the build's files (:meth:`_contained`)."""
        env = {"PATH": PATH, "HOME": "/root", **self.env}
        await self._contained([self.rootfs, self.network, self.workdir, *argv], env)

    async def execute_host(self, argv: list[str], env: dict[str, str]) -> None:
        """``argv`` on the host, as the daemon (``mmdebstrap``), in a mount namespace of its
        own (:data:`~sandboxd.core.templates.build_runner.HOST`) and in the build's cgroup
        (:meth:`_contained`), its output the step's."""
        await self._contained([build_runner.HOST, *argv], {"PATH": PATH, **env})

    async def _contained(self, arguments: list[str], env: dict[str, str]) -> None:
        """The runner with ``arguments`` in a cgroup of its own with the build's limits
        (:mod:`~sandboxd.core.templates.build_limits`), killed whole when the build is
        cancelled or runs past its time (:meth:`cancel`), and killed and removed once it
        ends. ``StepFailed`` unless it exits 0, saying so when the kernel OOM-killed a
        process of it."""
        group = self.limits.cgroup()
        self._group = group
        try:
            joins = [] if group is None else [f"--join={path}" for path in group.join_files()]
            runner = [sys.executable, "-I", build_runner.__file__, *joins]
            code = await self._spawn([*runner, *arguments], env)
            if code != 0 and not self.timed_out and group is not None and group.oom_killed():
                raise StepFailed(
                    f"the command exited with {code}: out of memory (a process of it went past"
                    f" SANDBOXD_BUILD_MEMORY_MAX, {self.limits.limits.memory_bytes} bytes, and"
                    " was killed)",
                    code,
                )
            self._check(code)
        finally:
            self._group = None
            if group is not None:
                await group.end(self._shutting_down)

    def _check(self, code: int) -> None:
        if code != 0:
            reason = self._stop_reason() if self.timed_out else f"the command exited with {code}"
            raise StepFailed(reason, code)

    async def _spawn(self, argv: list[str], env: dict[str, str]) -> int:
        """``argv`` run to its end, its output the step's: its exit code."""
        protocol = _RunProtocol(self._line)
        self._process = self.store.reactor.spawnProcess(protocol, argv[0], argv, env)
        self._process.closeStdin()
        if self._paused:
            self._process.pauseProducing()
        try:
            return await protocol.ended
        finally:
            self._process = None

    async def copy(self, step: Step) -> None:
        sources, dest = dockerfile.copy_paths(step)
        if self.context is None:
            raise StepFailed("COPY needs a context: send the build as a tar")
        await self.stoppable(
            build_files.copy_context,
            self.rootfs,
            self.context,
            sources,
            dest,
            self.workdir,
            self.store.limit,
        )

    async def env_step(self, step: Step) -> None:
        for key, value in dockerfile.env_pairs(step):
            self.env[key] = value

    async def workdir_step(self, step: Step) -> None:
        self.workdir = posixpath.normpath(
            posixpath.join(self.workdir, dockerfile.workdir_path(step))
        )
        await self.execute([])  # the runner makes the directory, inside the build's root


STEPS: dict[str, Callable[[Build, Step], Any]] = {
    "FROM": Build.from_,
    "RUN": Build.run_step,
    "COPY": Build.copy,
    "ENV": Build.env_step,
    "WORKDIR": Build.workdir_step,
}


def step_started(number: int, total: int, step: Step) -> StepStarted:
    """Step ``number`` of ``total`` starts."""
    return StepStarted(number, total, step.line, step.text)


def build_failed(
    number: int, step: Step, error: str, output: list[str], exception: BaseException
) -> BuildFailed:
    """A failed build's end: the step, its line and instruction, why, its output's last lines
    and, for a ``RUN``, its exit code."""
    exit_code = exception.exit_code if isinstance(exception, StepFailed) else None
    return BuildFailed(number, step.line, step.text, error, tuple(output), exit_code)


def start_build(
    store: TemplateStore,
    name: str,
    text: str,
    context: IO[bytes] | None,
    network: str,
    emit: Callable[[BuildEvent], None],
) -> Build:
    """A build of ``text`` checked before anything is made: ``TemplateCannotRun`` (``501``)
    unless the daemon runs as root, ``BadRequest`` for a Dockerfile the builder cannot follow
    (naming the line) or an unknown network, ``TemplateNotFound``
    for a ``FROM`` of no template, ``TemplateConflict`` for a name taken."""
    if not store.keep_owners:
        raise TemplateCannotRun("template builds need a daemon running as root")
    if network not in NETWORKS:
        raise BadRequest(f"network: must be one of {', '.join(NETWORKS)}")
    steps = dockerfile.parse_dockerfile(text)
    base = dockerfile.from_name(steps[0])
    if not base.startswith("debian:"):
        store.get(base)
    store.reserve(name)
    return Build(store, name, steps, context, network, emit)
