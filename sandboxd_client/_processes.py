"""
The background-process calls of ``HttpSandbox`` (docs/extensions.rst, "Background processes"),
and the workspace watch: each streamed or sent once, under ``exec_idle_timeout``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from . import _wire as wire
from ._base import OCTETS, ClientBase, Handle
from ._deferreds import async_to_deferred
from ._follow import OutputDecoder, WatchDecoder
from ._types import OutputChunk, ProcessInfo, ProcessOutput, SandboxNotFound, WatchEvent


class Processes(ClientBase):
    """Start background processes, read their output, write their stdin, signal them; watch
    the workspace."""

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
