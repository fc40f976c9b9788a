"""
``HttpSandbox``: the application's side of the sandboxd wire contract (docs/contract.rst,
docs/client.rst).

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

from collections.abc import Mapping, Sequence
from typing import Any

from hyperlink import DecodedURL
from twisted.internet.defer import Deferred

from . import _wire as wire
from ._base import Handle
from ._contexts import Contexts
from ._deferreds import async_to_deferred
from ._execstream import ExecStreamDecoder, OutputCallback
from ._files import Files
from ._handles import check_base_url, decode_handle
from ._processes import Processes
from ._socks5 import Socks5
from ._templates import Templates
from ._terminals import Terminals
from ._transfers import Transfers
from ._trees import Trees
from ._types import (
    ExecResult,
    Health,
    NetworkInfo,
    SandboxHandle,
    SandboxInfo,
    SandboxNotFound,
    SandboxSpec,
    SandboxStats,
    ToolsResolution,
    rules_body,
)


class HttpSandbox(Processes, Contexts, Files, Transfers, Trees, Templates, Terminals):
    """
    A client for one sandboxd service.

    :param base_url: the load-balanced service URL ``create`` (and ``health``, ``list``,
        ``resolve_tools``) are sent to.
    :param token: bearer token sent on every request (docs/extensions.rst, "Auth").
    :param reactor: the reactor to connect with; the global reactor if ``None``.
    :param clock: what deadlines and backoffs are timed with; ``reactor`` if ``None``.
    :param pool: / :param agent: inject connection handling (tests, custom TLS). By default a
        persistent ``HTTPConnectionPool`` that ``close()`` closes.
    :param ca_file: a PEM file of the certificate authorities to trust for ``https`` URLs
        instead of the system's (the operator's own CA, as ``curl --cacert``).
    :param retry: attempts, read deadlines and backoffs of idempotent calls.
    :param exec_idle_timeout: seconds ``exec`` waits without receiving a byte before raising
        ``SandboxBusy`` (the host sends keepalives every few seconds while a command is quiet).
    :param create_timeout: / :param persist_timeout: / :param tools_timeout: deadlines of the
        calls that are sent once and may legitimately take long (restore, rsync, downloads).
    """

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
    async def fork(self, handle: Handle) -> SandboxHandle:
        """A new sandbox whose files are a copy of ``handle``'s, on its replica
        (docs/extensions.rst, "Fork"); never retried (it could make a second one)."""
        url = self._url(handle, "fork")
        reply = await self._once("POST", url, {}, timeout=self._create_timeout, service=False)
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
    async def expose_port(self, handle: Handle, port: int, public: bool = False) -> str:
        """
        The URL that reaches ``port`` inside the sandbox through the replica holding it (the
        ``ports`` extension, docs/extensions.rst): calls to it need the token unless
        ``public``. A replica without the extension raises ``NotImplementedError``, as wire
        contract v1 does.
        """
        if "ports" not in await self.capabilities(handle):
            raise NotImplementedError(
                "the replica holding this sandbox does not expose ports (no 'ports' capability)"
            )
        url = self._url(handle, "ports", str(port))
        reply = await self._idempotent("POST", url, {"public": bool(public)})
        return wire.decode_field(reply, "url", str, "url")

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

    @async_to_deferred
    async def network(self, handle: Handle) -> NetworkInfo:
        """The sandbox's network mode and egress lists."""
        return wire.decode_network(await self._idempotent("GET", self._url(handle, "network")))

    @async_to_deferred
    async def set_network(
        self,
        handle: Handle,
        allow_out: Sequence[str] | None = None,
        deny_out: Sequence[str] = (),
        rules: Mapping[str, Mapping[str, str]] | None = None,
        socks5: Socks5 | None = None,
    ) -> NetworkInfo:
        """Replace an ``egress`` sandbox's lists, header rules and SOCKS5 proxy
        (docs/isolation.rst, "Egress policy per sandbox", "Header rules", "A sandbox's own
        SOCKS5 proxy"; ``rules`` as :attr:`SandboxSpec.rules`, ``None``: none; ``socks5``
        ``None``: no proxy of its own, it stops tunneling): its next new connection obeys
        them. ``allow_out`` ``None``: everything the operator permits. ``BadRequest`` names
        an entry the host refuses (never a header's value nor a password)."""
        body: dict[str, Any] = {"deny_out": list(deny_out)}
        if allow_out is not None:
            body["allow_out"] = list(allow_out)
        if rules:
            body["rules"] = rules_body(rules)
        if socks5 is not None:
            body["socks5"] = socks5.to_json()
        url = self._url(handle, "network")
        return wire.decode_network(await self._idempotent("PUT", url, body))

    def close(self) -> Deferred[None]:
        """Close pooled connections; returns a Deferred that fires when they are closed."""
        return self._http.close()
