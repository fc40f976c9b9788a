"""
The interpreter-context calls of ``HttpSandbox`` (docs/extensions.rst, "Contexts"): a kernel
that keeps its variables between cells, one cell streamed at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attrs import define, field, frozen

from ._base import ClientBase, Handle
from ._deferreds import async_to_deferred
from ._follow import _frame
from ._ndjson import DEFAULT_MAX_LINE, LineSplitter
from ._types import ProtocolError, SandboxNotFound
from ._wire import JSON, json_bytes


@frozen
class ContextInfo:
    """One interpreter context of a sandbox."""

    id: str
    language: str
    cwd: str


@frozen
class CellError:
    """The exception a cell raised (``KernelDied``: its kernel ended; the next cell gets a
    fresh one)."""

    name: str
    value: str
    traceback: tuple[str, ...]


@define
class Execution:
    """What one cell did: its output, its results (MIME bundles), its error."""

    stdout: list[str] = field(factory=list)
    stderr: list[str] = field(factory=list)
    results: list[Mapping[str, Any]] = field(factory=list)
    """Each result's MIME bundle (``text/plain``, ``image/png`` in base64, ``text/html``...)."""
    main_result: Mapping[str, Any] | None = None
    """The value of the cell's trailing expression, if it has one."""
    error: CellError | None = None
    execution_count: int | None = None

    @property
    def text(self) -> str | None:
        """The main result as text (``run_code("1 + 1").text == "2"``)."""
        if self.main_result is None:
            return None
        value = self.main_result.get("text/plain")
        return None if value is None else str(value)


def _info(value: Any) -> ContextInfo:
    if not isinstance(value, dict) or not all(
        isinstance(value.get(k), str) for k in ("id", "language", "cwd")
    ):
        raise ProtocolError(f"bad context: {value!r}")
    return ContextInfo(value["id"], value["language"], value["cwd"])


def _listing(value: Any) -> list[ContextInfo]:
    if not isinstance(value, list):
        raise ProtocolError(f"bad contexts listing: {value!r}")
    return [_info(item) for item in value]


class CellDecoder:
    """Feeds the frames of ``POST …/contexts/{id}/run`` into an :class:`Execution`."""

    def __init__(
        self,
        on_stdout: Callable[[str], object] | None,
        on_stderr: Callable[[str], object] | None,
        max_line: int = DEFAULT_MAX_LINE,
    ) -> None:
        self.execution = Execution()
        self.ended = False
        self._on = {"stdout": on_stdout, "stderr": on_stderr}
        self._lines = LineSplitter(max_line)

    def feed(self, data: bytes) -> None:
        for line in self._lines.feed(data):
            self._frame(line)

    def _frame(self, line: bytes) -> None:
        frame = _frame(line)
        kind = frame.get("type")
        execution = self.execution
        if kind in ("stdout", "stderr"):
            text = str(frame.get("text", ""))
            (execution.stdout if kind == "stdout" else execution.stderr).append(text)
            callback = self._on[kind]
            if callback is not None:
                callback(text)
        elif kind == "result":
            data = frame.get("data") or {}
            execution.results.append(data)
            if frame.get("is_main_result"):
                execution.main_result = data
        elif kind == "count":
            execution.execution_count = int(frame["execution_count"])
        elif kind == "error":
            traceback = tuple(str(line) for line in frame.get("traceback") or ())
            execution.error = CellError(str(frame["name"]), str(frame["value"]), traceback)
        elif kind == "end":
            self.ended = True


class Contexts(ClientBase):
    """Interpreter contexts: create, list, run a cell, restart, remove."""

    @async_to_deferred
    async def create_context(
        self, handle: Handle, language: str | None = None, cwd: str | None = None
    ) -> ContextInfo:
        """A new context, its kernel ready (about a second). ``SandboxError`` (``501
        ContextsUnavailable``) where the host has no kernel; never retried."""
        payload = {k: v for k, v in (("language", language), ("cwd", cwd)) if v is not None}
        url = self._url(handle, "contexts")
        reply = await self._once(
            "POST", url, payload, timeout=self._exec_idle_timeout, service=False
        )
        return _info(reply)

    @async_to_deferred
    async def contexts(self, handle: Handle) -> list[ContextInfo]:
        """Every context of the sandbox."""
        return _listing(await self._idempotent("GET", self._url(handle, "contexts")))

    @async_to_deferred
    async def run_code(
        self,
        handle: Handle,
        context_id: str,
        code: str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
    ) -> Execution:
        """Run ``code`` in the context; its output to the callbacks as it comes. Cancelling
        the call interrupts the cell. ``ContextNotFound`` for an unknown context."""
        payload: dict[str, Any] = {"code": code}
        if env:
            payload["env"] = dict(env)
        if timeout is not None:
            payload["timeout"] = timeout
        url = self._url(handle, "contexts", context_id, "run")
        deadline = self._exec_idle_timeout
        body = self._http.producer(json_bytes(payload))
        response = await self._http.send(
            "POST", url, timeout=deadline, service=False, body=body, content_type=JSON
        )
        await self._http.check(response, timeout=deadline, service=False)
        decoder = CellDecoder(on_stdout, on_stderr, self._max_exec_line)
        await self._http.read(response, decoder.feed, timeout=deadline, service=False)
        if not decoder.ended:  # pragma: no cover - the replica died mid-cell (no test kills it)
            raise SandboxNotFound("the cell's stream ended before its end: the replica is gone")
        return decoder.execution

    @async_to_deferred
    async def restart_context(self, handle: Handle, context_id: str) -> None:
        """A fresh kernel for the context (its variables are gone)."""
        url = self._url(handle, "contexts", context_id, "restart")
        await self._once("POST", url, {}, timeout=self._exec_idle_timeout, service=False)

    @async_to_deferred
    async def remove_context(self, handle: Handle, context_id: str) -> None:
        """Kill the context's kernel and forget it."""
        url = self._url(handle, "contexts", context_id)
        await self._once("DELETE", url, None, timeout=self._exec_idle_timeout, service=False)
