"""Interpreter contexts of a sandbox: create, list, restart, remove, execute.

A mixin of :class:`~sandboxd.core.manager.SandboxManager` (docs/extensions.rst, "Contexts").
A context's kernel is its language's (:mod:`sandboxd.core.contexts.languages`), run by
``SANDBOXD_KERNEL_PYTHON`` and started like every process of its sandbox
(:meth:`Commands._launch`: the privilege-drop chain, its uid, cgroup, namespaces and filter);
the daemon speaks to it over unix sockets in the sandbox's ``tmp/``
(:mod:`sandboxd.core.contexts.kernel`), from a thread pool of its own.
"""

import os
import secrets
import signal
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define, field
from twisted.internet.defer import Deferred, ensureDeferred, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from sandboxd.core.contexts.context import Context, new_context_id
from sandboxd.core.contexts.events import End, Error, Event, Output, Result
from sandboxd.core.contexts.kernel import (
    KernelGone,
    KernelLink,
    connection_info,
    write_connection_file,
)
from sandboxd.core.contexts.languages import LANGUAGES, Kernels, Language, names, probe_kernels
from sandboxd.core.contexts.template_kernels import kernels_of
from sandboxd.core.exec.spec import ExecSpec
from sandboxd.core.sandbox import Sandbox

if TYPE_CHECKING:
    from sandboxd.core.commands import Launch
from sandboxd.errors import BadRequest, ContextNotFound, ContextsUnavailable, TooMany

T = TypeVar("T")
log = Logger()

KERNEL_START_TIMEOUT = 30.0
"""Seconds a new kernel may take to answer (ipykernel imports IPython: about a second)."""
INTERRUPT_GRACE = 5.0
"""Seconds an interrupted cell may take to stop before its kernel is killed."""
KERNEL_THREADS = 64
"""Executions waiting on kernels at once, all sandboxes together (more wait their turn)."""
STARTUP_TAIL = 2000
"""Bytes of a kernel's own output kept to explain why it did not start."""


@define(eq=False)
class Execution:
    """One queued or running execution: :attr:`done` fires after its :class:`End`;
    :meth:`cancel` (its follower went) interrupts it, or drops it while it waits its turn;
    nothing once its :class:`End` is delivered."""

    done: Deferred[None]
    cancelled: bool = False
    interrupt: Callable[[], None] = field(default=lambda: None)

    def cancel(self) -> None:
        self.cancelled = True
        self.interrupt()


class ContextCommands:
    """The manager's contexts (a mixin: the manager provides the attributes)."""

    _kernel_pool: ThreadPool | None = None
    _kernels: Kernels | None = None
    _kernel_waiters: list[Deferred[Kernels]] | None = None
    """Who waits for the kernels' probe while it runs (``None``: none runs)."""

    # -- what the manager provides
    config: Any
    reactor: Any
    clock: Any
    layout: Any
    admin_pool: Any
    sandboxes: dict[str, Sandbox]
    _devnull: int

    def files(self, sandbox: Sandbox, work: Callable[[str], T]) -> Deferred[T]:
        raise NotImplementedError  # pragma: no cover - the manager's

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
    ) -> "Launch":
        raise NotImplementedError  # pragma: no cover - the Commands mixin's

    def workspace_seen(self, sandbox: Sandbox, request: ExecSpec) -> str:
        raise NotImplementedError  # pragma: no cover - the Commands mixin's

    def start_in_sandbox(
        self,
        sandbox: Sandbox,
        spec: ExecSpec,
        on_output: Callable[[int, bytes], None],
        *,
        max_output: int,
        timeout: float | None,
    ) -> "Launch":
        """``spec`` started as a command of ``sandbox`` (its uid, cgroup, namespaces, root
        and filter), its stdin ``/dev/null``, no log timeout: a kernel, or a probe of the
        sandbox's own python."""
        run = self._launch(
            sandbox, spec, on_output, max_output=max_output, log_timeout=None, timeout=timeout
        )
        run.start(self.reactor, run.argv, run.env, None, self._devnull)
        return run

    # -- capability

    def kernels_probed(self) -> Deferred[Kernels]:
        """The languages whose kernels this host has: ``SANDBOXD_KERNEL_PYTHON`` is asked once,
        in a thread of the admin pool (a Python starting takes seconds under emulation, and
        up to :data:`~sandboxd.core.contexts.languages.PROBE_TIMEOUT` if it hangs: the
        reactor serves meanwhile). The first call starts the probe (the manager's start
        does); every call fires once it is answered."""
        if self._kernels is not None:
            return succeed(self._kernels)
        waiter: Deferred[Kernels] = Deferred()
        if self._kernel_waiters is None:
            self._kernel_waiters = [waiter]
            python = self.config.kernel_python
            probing = deferToThreadPool(
                self.reactor, self.admin_pool, lambda: probe_kernels(python)
            )
            probing.addCallback(self._probed)
        else:
            self._kernel_waiters.append(waiter)
        return waiter

    def _probed(self, kernels: Kernels) -> None:
        self._kernels = kernels
        waiters, self._kernel_waiters = self._kernel_waiters or [], None
        for waiter in waiters:
            waiter.callback(kernels)

    async def contexts_missing(self) -> str | None:
        """Why contexts cannot run here (``None``: they can): Python's kernel is missing.
        Answered once the probe is (:meth:`kernels_probed`)."""
        kernels = await self.kernels_probed()
        return None if "python" in kernels.languages else kernels.missing["python"]

    def _pool(self) -> ThreadPool:
        if self._kernel_pool is None:
            pool = ThreadPool(0, KERNEL_THREADS, "sandboxd-kernels")
            pool.start()
            self._kernel_pool = pool
            self.reactor.addSystemEventTrigger("during", "shutdown", self._stop_kernel_pool)
        return self._kernel_pool

    def _stop_kernel_pool(self) -> None:
        for sandbox in self.sandboxes.values():
            for context in sandbox.contexts.values():
                if context.link is not None:
                    context.link.given_up.set()
        assert self._kernel_pool is not None
        self._kernel_pool.stop()  # every wait given up: the threads end within POLL
        for sandbox in self.sandboxes.values():
            for context in sandbox.contexts.values():
                if context.link is not None:
                    context.link.close()

    def _in_thread(self, work: Callable[[], T]) -> Deferred[T]:
        return deferToThreadPool(self.reactor, self._pool(), work)

    # -- contexts

    async def create_context(
        self, sandbox: Sandbox, language: str | None, cwd: str | None, as_home: bool = False
    ) -> Context:
        """A new context with a running kernel, ready for its first execution. ``cwd``
        defaults to the workspace (as the sandbox sees it: ``as_home``, its home view)."""
        kernels = await kernels_of(self, sandbox)  # a template's own (template_kernels.py)
        missing = None if "python" in kernels.languages else kernels.missing["python"]
        if missing is not None:
            where = "on this host" if sandbox.template is None else "in this sandbox"
            raise ContextsUnavailable(f"contexts are not available {where}: {missing}")
        language = language or "python"
        if language not in kernels.languages:
            why = kernels.missing.get(language)
            raise BadRequest(
                f"language: {language!r} has no kernel here (languages:"
                f" {names(kernels.languages)})" + (f": {why}" if why else "")
            )
        if len(sandbox.contexts) >= self.config.contexts_max:
            raise TooMany(
                f"{self.config.contexts_max} contexts are open on this sandbox already"
                " (SANDBOXD_CONTEXTS_MAX)"
            )
        spec = self._kernel_spec(LANGUAGES[language], as_home)
        context = Context(new_context_id(), language, cwd or self.workspace_seen(sandbox, spec))
        context.as_home = as_home
        sandbox.contexts[context.cid] = context
        try:
            await self._start_kernel(sandbox, context)
        except BaseException:
            sandbox.contexts.pop(context.cid, None)
            raise
        return context

    def context(self, sandbox: Sandbox, cid: str) -> Context:
        """The context ``cid`` of ``sandbox``, else ``404 ContextNotFound``."""
        try:
            return sandbox.contexts[cid]
        except KeyError:
            raise ContextNotFound(f"no context {cid!r} in this sandbox") from None

    async def restart_context(self, sandbox: Sandbox, context: Context) -> None:
        """A fresh kernel for ``context`` (same id; its variables are gone), once the
        execution running in it, if any, is interrupted and over."""
        if context.run is not None and not context.run.ended:
            context.run.signal(signal.SIGINT)
        await context.queue.acquire()
        try:
            await self._stop_kernel(context)
            await self._start_kernel(sandbox, context)
        finally:
            context.queue.release()

    async def remove_context(self, sandbox: Sandbox, context: Context) -> None:
        """Kill the context's kernel and forget it (what runs in it ends with a
        ``KernelDied`` error, what waits in its queue ends at once)."""
        sandbox.contexts.pop(context.cid, None)
        context.removed = True
        context.stop()
        await context.queue.acquire()
        try:
            await self._stop_kernel(context)
        finally:
            context.queue.release()

    async def close_contexts(self, sandbox: Sandbox) -> None:
        """Remove every context of ``sandbox`` (it is being killed)."""
        for context in list(sandbox.contexts.values()):
            await self.remove_context(sandbox, context)

    def _kernel_spec(self, language: Language, as_home: bool, conn: str = "") -> ExecSpec:
        cmd = language.argv(self.config.kernel_python, conn)
        return ExecSpec(cmd, {}, (), None, None, (), as_home=as_home)

    async def _start_kernel(self, sandbox: Sandbox, context: Context) -> None:
        context.starts += 1
        # a name the sandbox cannot guess ahead (it could otherwise take it first)
        name = f"k{context.cid}{secrets.token_hex(4)}"
        prefix = os.path.join(self.layout.tmp(sandbox.rid), name)
        conn = prefix + ".json"
        try:
            info = connection_info(prefix)
            await self.files(sandbox, lambda _workspace: write_connection_file(conn, info))
        except (ValueError, OSError) as e:
            raise ContextsUnavailable(f"the kernel cannot start: {e}") from None
        tail = bytearray()

        def keep(fd: int, data: bytes) -> None:
            tail.extend(data)
            del tail[:-STARTUP_TAIL]

        language = LANGUAGES[context.language]
        spec = self._kernel_spec(language, context.as_home, conn)
        run = self.start_in_sandbox(sandbox, spec, keep, max_output=0, timeout=None)
        context.run = run
        context.link = None
        link = await self._in_thread(lambda: KernelLink(info, lambda: not run.ended))
        context.link = link
        try:
            await self._in_thread(lambda: link.wait_ready(KERNEL_START_TIMEOUT))
            await self._in_thread(
                lambda: link.run_silently(language.chdir_code(context.cwd), KERNEL_START_TIMEOUT)
            )
        except KernelGone as e:
            context.stop()
            said = tail.decode(errors="replace").strip()
            raise ContextsUnavailable(f"the kernel did not start: {e}: {said}") from None
        log.info("context {cid} started in {rid}", cid=context.cid, rid=sandbox.rid)

    async def _stop_kernel(self, context: Context) -> None:
        run, link = context.run, context.link
        context.stop()
        if run is not None and not run.ended:
            await run.when_finished()
        if link is not None:
            await self._in_thread(link.close)

    def run_code(
        self,
        sandbox: Sandbox,
        context: Context,
        code: str,
        env: Mapping[str, str],
        deliver: Callable[[Event], None],
        timeout: float | None = None,
    ) -> Execution:
        """Queue ``code`` in ``context``; ``deliver`` is told its events, :class:`End` last.

        ``env`` holds for this execution only. Past ``timeout`` seconds the cell is
        interrupted, and its kernel killed if it has not stopped :data:`INTERRUPT_GRACE`
        seconds later; a kernel that dies ends the execution with an ``Error`` (the next one
        starts a fresh kernel). Text past ``SANDBOXD_MAX_OUTPUT`` bytes is dropped, said once
        on stderr."""
        execution = Execution(Deferred())
        execution.done = ensureDeferred(
            self._execute(sandbox, context, code, env, deliver, timeout, execution)
        )
        return execution

    async def _execute(
        self,
        sandbox: Sandbox,
        context: Context,
        code: str,
        env: Mapping[str, str],
        deliver: Callable[[Event], None],
        timeout: float | None,
        execution: Execution,
    ) -> None:
        await context.queue.acquire()
        timers: list[IDelayedCall] = []
        try:
            if execution.cancelled or context.removed:
                if context.removed:
                    deliver(Error("ContextRemoved", "the context was removed", ()))
                return
            if not context.alive:
                try:
                    await self._stop_kernel(context)
                    await self._start_kernel(sandbox, context)
                except ContextsUnavailable as e:
                    deliver(Error("KernelDied", e.detail, ()))
                    return
            await self._execute_in(sandbox, context, code, env, deliver, timeout, execution, timers)
        finally:
            for timer in timers:
                if timer.active():
                    timer.cancel()
            execution.interrupt = lambda: None
            context.queue.release()
            deliver(End())

    async def _execute_in(
        self,
        sandbox: Sandbox,
        context: Context,
        code: str,
        env: Mapping[str, str],
        deliver: Callable[[Event], None],
        timeout: float | None,
        execution: Execution,
        timers: list[IDelayedCall],
    ) -> None:
        link, run = context.link, context.run
        assert link is not None and run is not None
        budget = [self.config.max_output]
        killed: list[bool] = []
        """Whether its kernel was killed, the cell deaf to its interrupt."""

        def bounded(event: Event) -> None:
            size = len(event.text) if isinstance(event, Output) else 0
            if isinstance(event, Result):
                size = sum(len(str(value)) for value in event.data.values())
            if size > budget[0]:
                if budget[0] >= 0:
                    deliver(
                        Output("stderr", "\n[sandboxd: output past SANDBOXD_MAX_OUTPUT dropped]\n")
                    )
                budget[0] = -1
                return
            budget[0] -= size
            sandbox.last_active = self.clock.seconds()
            deliver(event)

        def from_thread(event: Event) -> None:
            self.reactor.callFromThread(bounded, event)

        def kill() -> None:
            killed.append(True)
            context.stop()

        def interrupt() -> None:
            run.signal(signal.SIGINT)
            timers.append(self.clock.callLater(INTERRUPT_GRACE, kill))

        try:
            before, after = LANGUAGES[context.language].env_code(env)
        except ValueError as e:
            deliver(Error("ValueError", str(e), ()))
            return
        execution.interrupt = interrupt
        if timeout is not None:
            timers.append(self.clock.callLater(timeout, interrupt))
        try:
            if env:
                await self._in_thread(lambda: link.run_silently(before))
            await self._in_thread(lambda: link.execute(code, from_thread))
            if env:
                await self._in_thread(lambda: link.run_silently(after))
        except KernelGone as e:
            context.stop()
            why = str(e)
            if killed:
                why = f"the cell did not stop within {INTERRUPT_GRACE:g}s of its interrupt"
            deliver(Error("KernelDied", f"{why}: the context restarts at its next execution", ()))
