"""
``HttpSandbox``: the application's side of the sandboxd wire contract (SPEC §1, §6).

Every method returns a ``Deferred`` (``await`` it from a Twisted coroutine, or turn it into an
asyncio future with ``Deferred.asFuture``). ``create`` goes to ``base_url`` (the load balancer);
every other sandbox call decodes the handle and goes straight to the replica that holds it.

Failures (see ``SandboxError`` and its subclasses): ``SandboxNotFound`` means recreate,
``SandboxBusy`` means the sandbox is alive but slow. Idempotent calls (file reads and writes,
probes, delete, mkdir, rmdir, mark_ready, kill) are retried on ``SandboxBusy`` under ``retry``;
``create``, ``persist``, ``exec``, ``rename`` and ``resolve_tools`` are sent exactly once.

From Twisted::

    from twisted.internet.task import react
    from sandboxd_client import HttpSandbox

    async def main(reactor) -> None:
        client = HttpSandbox("http://sandboxd:8080", reactor=reactor)
        handle = await client.create()
        result = await client.exec(handle, ["echo", "hi"], on_output=print)
        await client.kill(handle)
        await client.close()

    react(main)

From asyncio, install Twisted's asyncio reactor on your loop before anything imports the
reactor, start it (this runs Twisted's start-up: its thread pool resolves host names), and
bridge each Deferred with ``asFuture``::

    import asyncio
    from twisted.internet import asyncioreactor
    from sandboxd_client import HttpSandbox  # importing it installs no reactor

    async def main() -> None:
        from twisted.internet import reactor

        client = HttpSandbox("http://sandboxd:8080", reactor=reactor)
        loop = asyncio.get_running_loop()
        handle = await client.create().asFuture(loop)
        result = await client.exec(handle, ["echo", "hi"]).asFuture(loop)
        await client.kill(handle).asFuture(loop)
        await client.close().asFuture(loop)

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    asyncioreactor.install(loop)
    from twisted.internet import reactor

    reactor.startRunning(installSignalHandlers=False)
    try:
        loop.run_until_complete(main())
    finally:
        reactor.stop()
        loop.run_forever()  # runs Twisted's shutdown, which then stops the loop

Security: a handle carries the URL its calls (and the bearer token) are sent to; store handles
where only the application can write them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hyperlink import DecodedURL
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.web.client import HTTPConnectionPool
from twisted.web.iweb import IAgent

from . import _wire as wire
from ._deferreds import async_to_deferred
from ._execstream import ExecStreamDecoder, OutputCallback
from ._follow import OutputDecoder, WatchDecoder
from ._handles import check_base_url, decode_handle
from ._ndjson import DEFAULT_MAX_LINE
from ._retry import RetryPolicy, retrying
from ._transfers import OCTETS, Handle, Transfers
from ._transport import Transport, collector_paused
from ._types import (
    ExecResult,
    Health,
    OutputChunk,
    ProcessInfo,
    ProcessOutput,
    SandboxHandle,
    SandboxInfo,
    SandboxNotFound,
    SandboxSpec,
    SandboxStats,
    ToolsResolution,
    WalkEntry,
    WatchEvent,
)


@functools.lru_cache(maxsize=4096)
def sandbox_url(handle: Handle, segments: tuple[str, ...]) -> DecodedURL:
    """The URL of one sandbox route: ``{pod_url}/sandboxes/{remote_id}/{segments}``.

    Remembered for the last few thousand (handle, route) pairs, both immutable: decoding the
    handle and building its URL (hyperlink checks the host's IDNA form each time) was a third
    of the client's CPU per ``exec``. A malformed handle raises ``ValueError`` every time.
    """
    route = decode_handle(handle)
    return route.base.child("sandboxes", route.remote_id, *segments)


class HttpSandbox(Transfers):
    """
    A client for one sandboxd service.

    :param base_url: the load-balanced service URL ``create`` (and ``health``, ``list``,
        ``resolve_tools``) are sent to.
    :param token: bearer token sent on every request (SPEC §2 auth).
    :param reactor: the reactor to connect with; the global reactor if ``None``.
    :param clock: what deadlines and backoffs are timed with; ``reactor`` if ``None``.
    :param pool: / :param agent: inject connection handling (tests, custom TLS). By default a
        persistent ``HTTPConnectionPool`` that ``close()`` closes.
    :param retry: attempts, read deadlines and backoffs of idempotent calls.
    :param exec_idle_timeout: seconds ``exec`` waits without receiving a byte before raising
        ``SandboxBusy`` (the host sends keepalives every few seconds while a command is quiet).
    :param create_timeout: / :param persist_timeout: / :param tools_timeout: deadlines of the
        calls that are sent once and may legitimately take long (restore, rsync, downloads).
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        reactor: Any = None,
        clock: IReactorTime | None = None,
        pool: HTTPConnectionPool | None = None,
        agent: IAgent | None = None,
        retry: RetryPolicy | None = None,
        exec_idle_timeout: float = 30.0,
        create_timeout: float = 120.0,
        persist_timeout: float = 600.0,
        tools_timeout: float = 300.0,
        connect_timeout: float | None = None,
        max_persistent_per_host: int = 8,
        cached_connection_timeout: float = 50.0,
        max_exec_line: int = DEFAULT_MAX_LINE,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as global_reactor

            reactor = global_reactor
        self._base = check_base_url(base_url)
        self._clock: IReactorTime = clock if clock is not None else reactor
        self._retry = retry if retry is not None else RetryPolicy()
        self._exec_idle_timeout = exec_idle_timeout
        self._create_timeout = create_timeout
        self._persist_timeout = persist_timeout
        self._tools_timeout = tools_timeout
        self._max_exec_line = max_exec_line
        self._http = Transport(
            reactor,
            clock=self._clock,
            token=token,
            pool=pool,
            agent=agent,
            connect_timeout=connect_timeout,
            max_persistent_per_host=max_persistent_per_host,
            cached_connection_timeout=cached_connection_timeout,
        )

    # -- routing ---------------------------------------------------------------------------

    def _url(self, handle: Handle, *segments: str) -> DecodedURL:
        return sandbox_url(handle, segments)

    async def _idempotent(
        self,
        method: str,
        url: DecodedURL,
        payload: Any = None,
        *,
        service: bool = False,
        gone_ok: type[BaseException] | None = None,
    ) -> Any:
        async def attempt(deadline: float) -> Any:
            return await self._http.call(
                method, url, timeout=deadline, service=service, payload=payload
            )

        return await retrying(self._clock, self._retry, attempt, gone_ok=gone_ok)

    async def _once(
        self, method: str, url: DecodedURL, payload: Any, *, timeout: float, service: bool
    ) -> Any:
        return await self._http.call(method, url, timeout=timeout, service=service, payload=payload)

    # -- lifecycle -------------------------------------------------------------------------

    @async_to_deferred
    async def create(self, spec: SandboxSpec | None = None) -> SandboxHandle:
        """
        Create a sandbox through ``base_url``; never retried (it could open a second one).

        ``SandboxBusy`` here means the outcome is unknown: a sandbox may exist that no handle
        names; the host's idle reaper collects it.
        """
        body = (spec if spec is not None else SandboxSpec()).to_json()
        url = self._base.child("sandboxes")
        reply = await self._once("POST", url, body, timeout=self._create_timeout, service=True)
        return wire.decode_created(reply)

    @async_to_deferred
    async def kill(self, handle: Handle) -> None:
        """Kill the sandbox; a retry that finds it already gone counts as done."""
        await self._idempotent("DELETE", self._url(handle), gone_ok=SandboxNotFound)

    @async_to_deferred
    async def persist(self, handle: Handle, delete: bool) -> None:
        """Copy the workspace to the archive (``delete``: reconcile with ``--delete``)."""
        url = self._url(handle, "persist")
        payload = {"delete": bool(delete)}
        await self._once("POST", url, payload, timeout=self._persist_timeout, service=False)

    @async_to_deferred
    async def mark_ready(self, handle: Handle) -> None:
        """Mark the sandbox fully restored and trusted."""
        await self._idempotent("POST", self._url(handle, "mark-ready"))

    @async_to_deferred
    async def ready(self, handle: Handle) -> bool:
        """Read the ready mark."""
        reply = await self._idempotent("GET", self._url(handle, "ready"))
        return wire.decode_field(reply, "ready", bool, "ready")

    @async_to_deferred
    async def expose_port(self, handle: Handle, port: int) -> None:
        """Not supported by wire contract v1: always raises ``NotImplementedError``."""
        raise NotImplementedError("sandboxd does not expose sandbox ports")

    # -- exec ------------------------------------------------------------------------------

    @async_to_deferred
    async def exec(
        self,
        handle: Handle,
        cmd: Sequence[str],
        *,
        on_output: OutputCallback | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        tools: Sequence[str] | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecResult:
        """
        Run one command; return its ``ExecResult`` (a non-zero exit is a result).

        ``on_output(chunk)`` receives every live output chunk (stdout and stderr interleaved)
        as it arrives; with ``on_stderr`` (the ``exec.split`` extension) ``on_output`` gets
        stdout alone and ``on_stderr(chunk)`` the stderr chunks, still in arrival order. If a
        callback raises, the stream is dropped (the host then kills the command) and
        its exception propagates. A stream that ends without a final frame raises
        ``SandboxNotFound``; ``exec_idle_timeout`` seconds without a byte raise ``SandboxBusy``.
        Never retried.
        """
        url = self._url(handle, "exec")
        payload = wire.exec_body(cmd, env, cwd, timeout, stdin, tools)
        if on_stderr is not None:
            payload["split"] = True
        body = self._http.producer(wire.json_bytes(payload))
        deadline = self._exec_idle_timeout
        response = await self._http.send(
            "POST", url, timeout=deadline, service=False, body=body, content_type=wire.JSON
        )
        await self._http.check(response, timeout=deadline, service=False)
        decoder = ExecStreamDecoder(on_output, self._max_exec_line, on_stderr)
        try:
            await self._http.read(response, decoder.feed, timeout=deadline, service=False)
        except Exception:
            if not decoder.done:
                raise
        return decoder.finish()

    # -- background processes (SPEC 2.1) ---------------------------------------------------

    @async_to_deferred
    async def start_process(
        self,
        handle: Handle,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        tag: str | None = None,
        stdin: bool = False,
        tools: Sequence[str] | None = None,
    ) -> ProcessInfo:
        """Start ``cmd`` in the background; return at once with its id and pid. With
        ``stdin=True`` its stdin is a pipe for :meth:`send_stdin` until :meth:`close_stdin`.
        Never retried (a retry could start it twice)."""
        payload = wire.exec_body(cmd, env, cwd, timeout, None, tools)
        payload["stdin"] = stdin
        if tag is not None:
            payload["tag"] = tag
        url = self._url(handle, "processes")
        reply = await self._once(
            "POST", url, payload, timeout=self._exec_idle_timeout, service=False
        )
        started = wire.decode_started(reply)
        return ProcessInfo(started[0], started[1], tag, tuple(cmd), 0.0, True, None)

    @async_to_deferred
    async def processes(self, handle: Handle) -> list[ProcessInfo]:
        """Every background process record of the sandbox, oldest first."""
        reply = await self._idempotent("GET", self._url(handle, "processes"))
        return wire.decode_processes(reply)

    @async_to_deferred
    async def output(
        self,
        handle: Handle,
        process_id: str,
        offset: int = 0,
        follow: bool = True,
        on_output: Callable[[OutputChunk], object] | None = None,
    ) -> ProcessOutput:
        """Read a background process's output from byte ``offset``: each chunk to
        ``on_output`` as it arrives; with ``follow`` until the process ends. The result's
        ``offset`` is where to resume after a dropped connection (nothing lost, nothing
        twice); ``dropped`` counts bytes that fell out of the host's log before they were
        read. ``ProcessNotFound`` for an unknown id; ``SandboxNotFound`` when the sandbox is
        killed (in band) or the replica is gone."""
        url = self._url(handle, "processes", process_id, "output")
        url = url.set("offset", str(offset)).set("follow", "true" if follow else "false")
        deadline = self._exec_idle_timeout
        response = await self._http.send("GET", url, timeout=deadline, service=False)
        await self._http.check(response, timeout=deadline, service=False)
        decoder = OutputDecoder(offset, on_output, self._max_exec_line)
        try:
            await self._http.read(response, decoder.feed, timeout=deadline, service=False)
        except Exception:
            if not decoder.ended:
                raise
        return decoder.finish(follow)

    @async_to_deferred
    async def send_stdin(self, handle: Handle, process_id: str, data: bytes) -> None:
        """Write ``data`` to the stdin of a process started with ``stdin=True`` (never
        retried: bytes written twice would be read twice)."""
        url = self._url(handle, "processes", process_id, "stdin")
        body = self._http.producer(bytes(data))
        deadline = self._exec_idle_timeout
        response = await self._http.send(
            "POST", url, timeout=deadline, service=False, body=body, content_type=OCTETS
        )
        await self._http.check(response, timeout=deadline, service=False)
        await self._http.read(response, lambda _: None, timeout=deadline, service=False)

    @async_to_deferred
    async def close_stdin(self, handle: Handle, process_id: str) -> None:
        """Close the process's stdin: it reads EOF."""
        url = self._url(handle, "processes", process_id, "stdin")
        await self._once("DELETE", url, None, timeout=self._exec_idle_timeout, service=False)

    @async_to_deferred
    async def signal(self, handle: Handle, process_id: str, signal: str) -> None:
        """Send ``signal`` (``"TERM"``, ``"KILL"``, ``"INT"``, ``"HUP"``, ``"QUIT"``,
        ``"USR1"``, ``"USR2"``, ``"STOP"``, ``"CONT"``) to the process's group."""
        url = self._url(handle, "processes", process_id, "signal")
        payload = {"signal": signal}
        await self._once("POST", url, payload, timeout=self._exec_idle_timeout, service=False)

    @async_to_deferred
    async def watch(
        self,
        handle: Handle,
        root: str = "/",
        recursive: bool = True,
        on_event: Callable[[WatchEvent], object] | None = None,
    ) -> None:
        """Watch the workspace under ``root``: each change to ``on_event`` until the call is
        cancelled (``Deferred.cancel``) or the sandbox dies (``SandboxNotFound``)."""
        url = self._url(handle, "watch").set("root", root)
        url = url.set("recursive", "true" if recursive else "false")
        deadline = self._exec_idle_timeout
        response = await self._http.send("GET", url, timeout=deadline, service=False)
        await self._http.check(response, timeout=deadline, service=False)
        decoder = WatchDecoder(on_event or (lambda event: None), self._max_exec_line)
        await self._http.read(response, decoder.feed, timeout=deadline, service=False)
        raise SandboxNotFound("the watch stream ended: the replica is gone")

    # -- files (uploads and downloads are in ``_transfers``) ------------------------------

    @async_to_deferred
    async def exists(self, handle: Handle, path: str) -> bool:
        """Whether a file or directory exists at ``path``."""
        reply = await self._idempotent("GET", self._url(handle, "exists").set("path", path))
        return wire.decode_field(reply, "exists", bool, "exists")

    @async_to_deferred
    async def size(self, handle: Handle, path: str) -> int | None:
        """Size of the regular file at ``path``, or ``None`` if there is none."""
        reply = await self._idempotent("GET", self._url(handle, "size").set("path", path))
        return wire.decode_size(reply)

    @async_to_deferred
    async def disk_usage(self, handle: Handle) -> int:
        """Bytes used by the whole workspace."""
        reply = await self._idempotent("GET", self._url(handle, "disk-usage"))
        return wire.decode_field(reply, "bytes", int, "disk-usage")

    @async_to_deferred
    async def walk(self, handle: Handle, root: str = "/") -> list[WalkEntry]:
        """Every regular file under ``root``."""
        reply = await self._idempotent("GET", self._url(handle, "walk").set("root", root))
        with collector_paused():  # one entry per file: see ``collector_paused``
            return wire.decode_walk(reply)

    @async_to_deferred
    async def delete(self, handle: Handle, path: str) -> None:
        """Delete the file at ``path`` (``FileNotFoundError`` if missing)."""
        url = self._url(handle, "file").set("path", path)
        await self._idempotent("DELETE", url, gone_ok=FileNotFoundError)

    @async_to_deferred
    async def mkdir(self, handle: Handle, path: str) -> None:
        """Create ``path`` and its parents (``mkdir -p``)."""
        await self._idempotent("POST", self._url(handle, "mkdir"), {"path": path})

    @async_to_deferred
    async def rmdir(self, handle: Handle, path: str) -> None:
        """Remove the directory ``path`` and its contents (``FileNotFoundError`` if missing)."""
        url = self._url(handle, "dir").set("path", path)
        await self._idempotent("DELETE", url, gone_ok=FileNotFoundError)

    @async_to_deferred
    async def rename(self, handle: Handle, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` (replacing it); never retried."""
        url = self._url(handle, "rename")
        payload = {"src": src, "dst": dst}
        await self._once("POST", url, payload, timeout=self._retry.timeout, service=False)

    # -- service-level calls ---------------------------------------------------------------

    @async_to_deferred
    async def resolve_tools(
        self, tools: Mapping[str, str], *, handle: Handle | None = None
    ) -> ToolsResolution:
        """
        Resolve ``{name: manifest_url}`` into installable tools, per tool.

        Tools are installed on the replica that resolves them: pass the ``handle`` of the
        sandbox that will mount them to resolve on its replica (else ``base_url``).
        """
        if handle is not None:
            url, service = decode_handle(handle).base.child("tools", "resolve"), False
        else:
            url, service = self._base.child("tools", "resolve"), True
        payload = {"tools": dict(tools)}
        reply = await self._once("POST", url, payload, timeout=self._tools_timeout, service=service)
        return wire.decode_tools(reply)

    def _service_url(self, pod_url: str | None, *segments: str) -> DecodedURL:
        base = self._base if pod_url is None else check_base_url(pod_url)
        return base.child(*segments)

    @async_to_deferred
    async def health(self, pod_url: str | None = None) -> Health:
        """``GET /healthz`` of ``base_url`` (or of one replica's ``pod_url``)."""
        url = self._service_url(pod_url, "healthz")
        return wire.decode_health(await self._idempotent("GET", url, service=True))

    @async_to_deferred
    async def list_sandboxes(self, pod_url: str | None = None) -> list[SandboxInfo]:
        """Live sandboxes of the replica that answers ``base_url`` (or of ``pod_url``)."""
        url = self._service_url(pod_url, "sandboxes")
        return wire.decode_list(await self._idempotent("GET", url, service=True))

    @async_to_deferred
    async def stats(self, handle: Handle) -> SandboxStats:
        """cgroup counters of one sandbox."""
        return wire.decode_stats(await self._idempotent("GET", self._url(handle, "stats")))

    def close(self) -> Deferred[None]:
        """Close pooled connections; returns a Deferred that fires when they are closed."""
        return self._http.close()
