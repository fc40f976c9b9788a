"""The sandboxes the E2B front created: their access tokens, metadata and end times.

Each E2B sandbox is a core sandbox (same manager, same isolation, same limits) plus what the
E2B protocol adds: its own ``envdAccessToken`` (checked on every envd call of that sandbox and
useless for any other), its metadata, its template name, and its end time (``timeout``
seconds after create, moved by ``set_timeout``): when it passes, the sandbox is killed. The
end time governs the sandbox's life: the idle reaper leaves it alone until then (as E2B keeps
an idle sandbox until its timeout).
Sandboxes of the native API are not listed here and cannot be reached through this front.
"""

import hmac
import secrets
from contextlib import suppress
from typing import Any

from attrs import define, field
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from sandboxd.core import Sandbox, SandboxManager
from sandboxd.e2b.wire import ConnectError
from sandboxd.errors import SandboxNotFound

log = Logger()

TIMEOUT_DEFAULT = 300
"""Seconds a sandbox lives when create names no ``timeout`` (the SDK's documented default)."""


@define(eq=False)
class E2BSandbox:
    """One sandbox of the E2B front."""

    sandbox: Sandbox
    token: str
    template: str
    metadata: dict[str, str]
    started_at: float
    end_at: float
    processes: dict[str, dict[str, Any]] = field(factory=dict)
    """Each process's ``ProcessConfig`` as the SDK sent it (by core process id)."""
    watchers: dict[str, Any] = field(factory=dict)
    """Polling watchers (``CreateWatcher``) by id."""
    default_contexts: dict[str, str] = field(factory=dict)
    """The code interpreter's default context of each language, by id."""
    expiry: IDelayedCall | None = None
    serial: int = 0
    """The order of its create among the front's sandboxes (1, 2, ...): a listing's order."""
    # Ports (docs/e2b.rst, "Ports")
    traffic_token: str = field(factory=lambda: secrets.token_urlsafe(24))
    """What a call to one of its ports carries (``e2b-traffic-access-token``)."""
    public_traffic: bool = False
    """Its ports are served without the traffic token (``network.allowPublicTraffic``)."""

    @property
    def id(self) -> str:
        return self.sandbox.rid


class Registry:
    """The E2B sandboxes of one daemon, each found by id and checked by its token."""

    def __init__(self, manager: SandboxManager, clock: IReactorTime) -> None:
        self.manager = manager
        self.clock = clock
        self._sandboxes: dict[str, E2BSandbox] = {}
        self._created = 0

    def add(
        self, sandbox: Sandbox, template: str, metadata: dict[str, str], timeout: float
    ) -> E2BSandbox:
        now = self.clock.seconds()
        self._created += 1
        entry = E2BSandbox(
            sandbox,
            secrets.token_urlsafe(24),
            template,
            metadata,
            started_at=now,
            end_at=now,
            serial=self._created,
        )
        self._sandboxes[sandbox.rid] = entry
        self.set_timeout(entry, timeout)
        return entry

    def get(self, sandbox_id: str) -> E2BSandbox:
        """The live E2B sandbox ``sandbox_id``, else ``SandboxNotFound`` (a sandbox killed by
        other means, e.g. the idle reaper, is forgotten here)."""
        entry = self._sandboxes.get(sandbox_id)
        if entry is None or entry.sandbox.rid not in self.manager.sandboxes:
            if entry is not None:
                self.forget(entry)
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        self.manager.get(sandbox_id)  # its last activity is now
        return entry

    def holds(self, sandbox_id: str, token: str) -> bool | None:
        """Whether ``token`` is the access token of the sandbox ``sandbox_id`` (compared in
        constant time); ``None`` when no such sandbox is known. Nothing is touched: no
        activity, no forgetting."""
        entry = self._sandboxes.get(sandbox_id)
        if entry is None:
            return None
        return hmac.compare_digest(entry.token.encode(), token.encode())

    def opens_interpreter(self, entry: E2BSandbox, access: str | None, traffic: str | None) -> bool:
        """Whether a code-interpreter call carrying these tokens is ``entry``'s: its access
        token, or its traffic token (each compared in constant time)."""
        return (
            access is not None and hmac.compare_digest(entry.token.encode(), access.encode())
        ) or (
            traffic is not None
            and hmac.compare_digest(entry.traffic_token.encode(), traffic.encode())
        )

    def named_or_all(self, sandbox_id: str) -> list[E2BSandbox]:
        """The sandbox ``sandbox_id`` (none if unknown), or every sandbox for ``""``; nothing
        is touched (no activity, no forgetting)."""
        if not sandbox_id:
            return list(self._sandboxes.values())
        entry = self._sandboxes.get(sandbox_id)
        return [] if entry is None else [entry]

    def authorised(self, sandbox_id: str, token: str) -> E2BSandbox:
        """The sandbox whose access token is ``token``; ``unauthenticated`` for another
        token (compared in constant time)."""
        entry = self.get(sandbox_id)
        if not hmac.compare_digest(entry.token.encode(), token.encode()):
            raise ConnectError("unauthenticated", "the access token is not this sandbox's")
        return entry

    def all(self) -> list[E2BSandbox]:
        live = []
        for entry in list(self._sandboxes.values()):
            with suppress(SandboxNotFound):
                live.append(self.get(entry.id))
        return live

    def set_timeout(self, entry: E2BSandbox, timeout: float) -> None:
        """The sandbox ends ``timeout`` seconds from now, idle or not."""
        entry.end_at = self.clock.seconds() + timeout
        entry.sandbox.lives_until = entry.end_at
        if entry.expiry is not None and entry.expiry.active():
            entry.expiry.cancel()
        entry.expiry = self.clock.callLater(timeout, self._expire, entry)

    def extend(self, entry: E2BSandbox, timeout: float) -> None:
        """The sandbox ends ``timeout`` seconds from now, unless it was to end later already
        (E2B's connect: a running sandbox's life is extended, never shortened)."""
        if self.clock.seconds() + timeout > entry.end_at:
            self.set_timeout(entry, timeout)

    def _expire(self, entry: E2BSandbox) -> None:
        entry.expiry = None
        log.info("E2B sandbox {id} reached its timeout: killing it", id=entry.id)
        Deferred.fromCoroutine(self.kill(entry)).addErrback(
            lambda f: log.failure("killing {id} at its timeout failed", f, id=entry.id)
        )

    async def kill(self, entry: E2BSandbox) -> None:
        self.forget(entry)
        with suppress(SandboxNotFound):
            await self.manager.kill(entry.id)

    def forget(self, entry: E2BSandbox) -> None:
        """Drop ``entry``: its expiry and its polling watchers go with it."""
        self._sandboxes.pop(entry.id, None)
        if entry.expiry is not None and entry.expiry.active():
            entry.expiry.cancel()
        entry.expiry = None
        for watcher in entry.watchers.values():
            watcher.close()
        entry.watchers.clear()
