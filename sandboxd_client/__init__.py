"""
sandboxd_client: the client of a sandboxd host (SPEC §6), built on treq.

``HttpSandbox`` is the whole API; every method returns a Deferred. Its docstring has the
asyncio recipe; ``SandboxError`` and its subclasses say what each failure means to an
application. Everything this package offers is named here; its ``_``-prefixed modules are
its implementation and may change at any release. ``sandboxctl`` lives in
``sandboxd_client.cli``.
"""

from ._client import HttpSandbox
from ._handles import Route, decode_handle, encode_handle
from ._retry import RetryPolicy
from ._types import (
    ExecResult,
    Health,
    OutputChunk,
    ProcessInfo,
    ProcessNotFound,
    ProcessOutput,
    ProtocolError,
    ResolvedTool,
    SandboxBusy,
    SandboxError,
    SandboxHandle,
    SandboxInfo,
    SandboxNotFound,
    SandboxSpec,
    SandboxStats,
    SandboxUnavailable,
    TooLarge,
    ToolsResolution,
    WalkEntry,
    WatchEvent,
)

__all__ = [
    "ExecResult",
    "Health",
    "HttpSandbox",
    "OutputChunk",
    "ProcessInfo",
    "ProcessNotFound",
    "ProcessOutput",
    "ProtocolError",
    "ResolvedTool",
    "RetryPolicy",
    "Route",
    "SandboxBusy",
    "SandboxError",
    "SandboxHandle",
    "SandboxInfo",
    "SandboxNotFound",
    "SandboxSpec",
    "SandboxStats",
    "SandboxUnavailable",
    "TooLarge",
    "ToolsResolution",
    "WalkEntry",
    "WatchEvent",
    "decode_handle",
    "encode_handle",
]
