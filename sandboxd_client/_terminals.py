"""
The terminal calls of ``HttpSandbox`` (docs/extensions.rst, "Terminals"): start, list,
resize, kill, and attach to a terminal's WebSocket (``autobahn``, the ``terminal`` extra,
imported only to attach: :mod:`sandboxd_client._terminal_socket`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import define, field
from twisted.internet.defer import Deferred

from . import _wire as wire
from ._base import ClientBase, Handle
from ._deferreds import async_to_deferred
from ._types import ProcessInfo

TERMINAL_MISSING = (
    "attaching to a terminal needs the terminal extra: pip install 'sandboxd-client[terminal]'"
)


@define
class TerminalConnection:
    """A client attached to a terminal: :meth:`type` sends keystrokes, :meth:`resize` the
    window size, :meth:`close` detaches (the terminal runs on); :attr:`ended` fires with the
    terminal's exit code once it has ended (``None``: the socket closed first)."""

    ended: Deferred[int | None] = field(factory=Deferred)
    _protocol: Any = None
    _pending: list[tuple[bytes, bool]] = field(factory=list)

    def _send(self, payload: bytes, binary: bool) -> None:
        if self._protocol is None:
            self._pending.append((payload, binary))
        elif self._protocol.state == self._protocol.STATE_OPEN:
            self._protocol.sendMessage(payload, isBinary=binary)
        # else closing or closed: what is typed now goes nowhere (autobahn would raise)

    def type(self, data: bytes) -> None:
        if data:  # empty input is not sent
            self._send(data, True)

    def resize(self, rows: int, cols: int) -> None:
        self._send(json.dumps({"resize": {"rows": rows, "cols": cols}}).encode(), False)

    def close(self) -> None:
        if self._protocol is not None:
            self._protocol.sendClose(1000)

    def _opened(self, protocol: Any) -> None:
        self._protocol = protocol
        pending, self._pending = self._pending, []
        for payload, binary in pending:
            protocol.sendMessage(payload, isBinary=binary)

    def _end(self, code: int | None) -> None:
        if not self.ended.called:
            self.ended.callback(code)


class Terminals(ClientBase):
    """Start terminals in a sandbox and attach to them."""

    @async_to_deferred
    async def start_terminal(
        self,
        handle: Handle,
        cmd: Sequence[str] | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        term: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ProcessInfo:
        """Start ``cmd`` (``sh`` when ``None``) on a terminal of ``rows`` x ``cols``; return
        at once with its record (its id works with the background-process calls too). Never
        retried."""
        payload: dict[str, Any] = {"rows": rows, "cols": cols}
        if cmd is not None:
            payload["cmd"] = list(cmd)
        if term is not None:
            payload["term"] = term
        if env:
            payload["env"] = dict(env)
        if cwd is not None:
            payload["cwd"] = cwd
        url = self._url(handle, "terminals")
        reply = await self._once(
            "POST", url, payload, timeout=self._exec_idle_timeout, service=False
        )
        started = wire.decode_started(reply)
        return ProcessInfo(started[0], started[1], None, tuple(cmd or ("sh",)), 0.0, True, None)

    @async_to_deferred
    async def resize_terminal(self, handle: Handle, terminal_id: str, rows: int, cols: int) -> None:
        """Give the terminal the window size ``rows`` x ``cols``."""
        url = self._url(handle, "terminals", terminal_id, "resize")
        await self._idempotent("POST", url, {"rows": rows, "cols": cols})

    @async_to_deferred
    async def kill_terminal(self, handle: Handle, terminal_id: str) -> None:
        """SIGKILL the terminal's process group (its record stays, with its exit)."""
        await self._idempotent("DELETE", self._url(handle, "terminals", terminal_id))

    def attach_terminal(
        self, handle: Handle, terminal_id: str, on_output: Callable[[bytes], object]
    ) -> TerminalConnection:
        """Attach to the terminal's WebSocket: ``on_output`` is told what it prints (its
        scrollback first); see :class:`TerminalConnection`."""
        try:
            from ._terminal_socket import TerminalFactory, connectWS
        except ImportError:  # pragma: no cover - the tests' venv has autobahn
            raise RuntimeError(TERMINAL_MISSING) from None
        url = self._url(handle, "terminals", terminal_id)
        scheme = "wss" if url.scheme == "https" else "ws"
        text = url.replace(scheme=scheme).to_uri().to_text()
        headers = {} if self._token is None else {"Authorization": f"Bearer {self._token}"}
        factory = TerminalFactory(text, headers, on_output)
        if scheme == "wss":
            # Verified as the HTTP calls are: against ca_file when given (the token is never
            # sent to a server showing another certificate), else the system's trust.
            from twisted.web.client import BrowserLikePolicyForHTTPS

            policy = self._tls if self._tls is not None else BrowserLikePolicyForHTTPS()
            netloc = (url.host.encode("idna"), url.port or 443)
            connectWS(factory, policy.creatorForNetloc(*netloc))
        else:
            connectWS(factory)
        return factory.connection
