"""
sandboxd_client: the client of a sandboxd host (docs/client.rst), built on treq.

``HttpSandbox`` is the whole API; every method returns a Deferred. Its docstring has the
asyncio recipe; ``SandboxError`` and its subclasses say what each failure means to an
application. Everything this package offers is named here; its ``_``-prefixed modules are
its implementation and may change at any release. ``sandboxctl`` lives in
``sandboxd_client.cli``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._client import HttpSandbox
    from ._contexts import CellError, ContextInfo, Execution
    from ._handles import Route, decode_handle, encode_handle
    from ._retry import RetryPolicy
    from ._socks5 import Socks5, Socks5TLS
    from ._types import (
        ContextNotFound,
        ExecResult,
        Health,
        NetworkInfo,
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
        TemplateBuildFailed,
        TemplateInfo,
        TemplateNotFound,
        TooLarge,
        ToolsResolution,
        WalkEntry,
        WatchEvent,
    )

_LAZY = {
    "HttpSandbox": "._client",
    "RetryPolicy": "._retry",
    "Route": "._handles",
    "decode_handle": "._handles",
    "encode_handle": "._handles",
    "ContextNotFound": "._types",
    "CellError": "._contexts",
    "ContextInfo": "._contexts",
    "Execution": "._contexts",
    "ExecResult": "._types",
    "Health": "._types",
    "OutputChunk": "._types",
    "ProcessInfo": "._types",
    "NetworkInfo": "._types",
    "ProcessNotFound": "._types",
    "ProcessOutput": "._types",
    "ProtocolError": "._types",
    "ResolvedTool": "._types",
    "SandboxBusy": "._types",
    "SandboxError": "._types",
    "SandboxHandle": "._types",
    "SandboxInfo": "._types",
    "SandboxNotFound": "._types",
    "SandboxSpec": "._types",
    "SandboxStats": "._types",
    "SandboxUnavailable": "._types",
    "Socks5": "._socks5",
    "Socks5TLS": "._socks5",
    "TemplateBuildFailed": "._types",
    "TemplateInfo": "._types",
    "TemplateNotFound": "._types",
    "TooLarge": "._types",
    "ToolsResolution": "._types",
    "WalkEntry": "._types",
    "WatchEvent": "._types",
}
"""Where each name lives; a module is imported on the first use of one of its names, so that
``sandboxctl --help`` (which imports this package) pays for none of them."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "CellError",
    "ContextInfo",
    "ContextNotFound",
    "ExecResult",
    "Execution",
    "Health",
    "HttpSandbox",
    "NetworkInfo",
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
    "Socks5",
    "Socks5TLS",
    "TemplateBuildFailed",
    "TemplateInfo",
    "TemplateNotFound",
    "TooLarge",
    "ToolsResolution",
    "WalkEntry",
    "WatchEvent",
    "decode_handle",
    "encode_handle",
]
