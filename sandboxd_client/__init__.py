"""
sandboxd_client: the client of a sandboxd host (SPEC §6), built on treq.

``HttpSandbox`` is the whole API; every method returns a Deferred. See ``client`` for the
asyncio recipe and ``types`` for what each exception means to an application.
"""

from .client import HttpSandbox
from .handles import decode_handle, encode_handle
from .retry import RetryPolicy
from .types import (
    ExecResult,
    Health,
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
)

__all__ = [
    "ExecResult",
    "Health",
    "HttpSandbox",
    "ProtocolError",
    "ResolvedTool",
    "RetryPolicy",
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
    "decode_handle",
    "encode_handle",
]
