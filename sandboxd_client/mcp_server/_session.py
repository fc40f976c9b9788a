"""
The sandboxes of MCP sessions: short names for the model, handles kept by the server.

A model names a sandbox ``sb1``, ``sb2``, … and never sees or sends a handle, so it cannot
point the server (and its bearer token) at another URL by forging one. Each session's
sandboxes are killed when it ends, except those created with ``keep``. Requests without a
session (protocol 2026-07-28 has none) share the server's own sandboxes, which outlive every
request. Whatever no session's end killed (the server's own, or the process is stopping) is
swept by ``Registry.take_unkept`` at exit.
"""

from __future__ import annotations

import itertools

from attrs import define, field, frozen

from .. import SandboxHandle


class UnknownSandbox(LookupError):
    """A sandbox name this session did not create (or already killed)."""


@frozen
class Created:
    """One sandbox a session created: its handle, whether it outlives the session, and its
    workspace's absolute path as its commands see it."""

    handle: SandboxHandle
    keep: bool
    workspace: str


@define(eq=False)
class Sandboxes:
    """The sandboxes one session created, by name."""

    by_name: dict[str, Created] = field(factory=dict)
    _numbers: itertools.count[int] = field(factory=lambda: itertools.count(1))

    def add(self, handle: SandboxHandle, keep: bool, workspace: str) -> str:
        """Remember a new sandbox; return its name."""
        name = f"sb{next(self._numbers)}"
        self.by_name[name] = Created(handle, keep, workspace)
        return name

    def get(self, name: str) -> Created:
        """The sandbox ``name``; ``UnknownSandbox`` if this session has none by that name."""
        created = self.by_name.get(name)
        if created is None:
            known = ", ".join(sorted(self.by_name)) or "none yet"
            raise UnknownSandbox(
                f"no sandbox named {name!r} in this session (known: {known}); "
                "create one with create_sandbox"
            )
        return created

    def forget(self, name: str) -> None:
        """Drop ``name`` (it was killed)."""
        self.by_name.pop(name, None)

    def take_unkept(self) -> list[SandboxHandle]:
        """Forget and return every sandbox not created with ``keep``."""
        unkept = [name for name, created in self.by_name.items() if not created.keep]
        return [self.by_name.pop(name).handle for name in unkept]


@define
class Registry:
    """Every session's sandboxes, for the sweep when the server stops."""

    sessions: list[Sandboxes] = field(factory=list)
    shared: dict[str, object] = field(factory=dict)
    """State of the server's own sandboxes: those of requests without a session."""

    def open(self) -> Sandboxes:
        """A new session's (empty) sandboxes."""
        sandboxes = Sandboxes()
        self.sessions.append(sandboxes)
        return sandboxes

    def close(self, sandboxes: Sandboxes) -> None:
        """A session ended (its own sandboxes already taken)."""
        if sandboxes in self.sessions:
            self.sessions.remove(sandboxes)

    def take_unkept(self) -> list[SandboxHandle]:
        """Forget and return the unkept sandboxes of every session still open."""
        return [h for sandboxes in self.sessions for h in sandboxes.take_unkept()]
