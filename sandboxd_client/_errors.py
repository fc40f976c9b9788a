"""
Mapping failures to the exceptions of the error model (docs/client.rst, "Errors and retries").

Three sources of failure, one vocabulary:

- an HTTP error status with a JSON body ``{"error": type, "detail": msg}``
  (``error_from_response``), where the body may also be garbage (an HTML 502 from a proxy);
- an in-band ``{"error", "detail"}`` frame at the end of an exec stream (``error_from_frame``);
- a transport failure from Twisted (``error_from_transport``): our own deadline firing is
  ``SandboxBusy``; refused / reset / lost is ``SandboxNotFound`` for a sandbox's replica (or
  ``SandboxUnavailable`` for the load-balanced service address, where no sandbox exists yet).
"""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator, Mapping
from types import MappingProxyType

from twisted.internet import error as ierror
from twisted.internet.defer import CancelledError
from twisted.python.failure import Failure
from twisted.web.client import RequestGenerationFailed, RequestTransmissionFailed, ResponseFailed

from ._twisted import ParseError
from ._types import (
    ContextNotFound,
    ProcessNotFound,
    ProtocolError,
    SandboxBusy,
    SandboxError,
    SandboxNotFound,
    SandboxUnavailable,
    TemplateNotFound,
    TooLarge,
)

WIRE_ERRORS: Mapping[str, int] = MappingProxyType(
    {
        "BadRequest": 400,
        "Unauthorized": 401,
        "SandboxNotFound": 404,
        "FileNotFoundError": 404,
        "NotFound": 404,
        "ProcessNotFound": 404,
        "TemplateNotFound": 404,
        "ContextNotFound": 404,
        "MethodNotAllowed": 405,
        "Conflict": 409,
        "TooLarge": 413,
        "TooMany": 429,
        "InternalError": 500,
        "ArchiveError": 500,
        "NotImplemented": 501,
        "PortClosed": 502,
        "ContextsUnavailable": 501,
        "Draining": 503,
        "NoCapacity": 503,
        "TemplatesUnavailable": 503,
        "InsufficientStorage": 507,
    }
)
"""The contract's error types and the HTTP status each is answered with: exactly the table
``x-error-types`` of ``docs/openapi.yaml`` (a test holds them equal)."""

FOREIGN_ERRORS: Mapping[str, int] = MappingProxyType(
    {
        "PathNotFound": 404,
        "ValueError": 400,
        "PermissionError": 403,
        "Forbidden": 403,
        "SandboxUnavailable": 503,
        "SandboxBusy": 504,
        "Timeout": 504,
    }
)
"""Type names that are not sandboxd's but that a host in front of it, or one naming its own
exception classes, may send in band: understood, never sent by the contract."""

_BY_TYPE: Mapping[str, int] = {**FOREIGN_ERRORS, **WIRE_ERRORS}


def error_for(status: int, error: str | None, detail: str) -> Exception:
    """
    The exception for an HTTP error ``status`` and wire error type ``error``.

    404 is ``FileNotFoundError`` only when the type says so, else ``SandboxNotFound``;
    400 ``ValueError``; 401/403 ``PermissionError``; 413 ``TooLarge``; 503
    ``SandboxUnavailable``; 507 ``OSError(ENOSPC)``; 408/504 ``SandboxBusy``; anything else a
    ``SandboxError`` carrying status, type and detail.
    """
    if status == 404:
        if error == "FileNotFoundError":
            return FileNotFoundError(errno.ENOENT, detail)
        if error == "ProcessNotFound":
            return ProcessNotFound(detail, status=status, error=error)
        if error == "TemplateNotFound":
            return TemplateNotFound(detail, status=status, error=error)
        if error == "ContextNotFound":
            return ContextNotFound(detail, status=status, error=error)
        return SandboxNotFound(detail, status=status, error=error)
    if status == 400:
        return ValueError(detail)
    if status in (401, 403):
        return PermissionError(detail)
    if status == 413:
        return TooLarge(detail, status=status, error=error)
    if status == 503:
        return SandboxUnavailable(detail, status=status, error=error)
    if status == 507:
        return OSError(errno.ENOSPC, detail)
    if status in (408, 504):
        return SandboxBusy(detail, status=status, error=error)
    return SandboxError(detail, status=status, error=error)


def parse_error_body(body: bytes) -> tuple[str | None, str | None]:
    """``(error, detail)`` from a JSON error body, or ``(None, None)`` if it is not one."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, None
    if not isinstance(obj, dict):
        return None, None
    error, detail = obj.get("error"), obj.get("detail")
    return (
        error if isinstance(error, str) else None,
        detail if isinstance(detail, str) else None,
    )


def error_from_response(status: int, body: bytes) -> Exception:
    """The exception for an error response; a non-JSON body still maps by status."""
    error, detail = parse_error_body(body)
    if detail is None:
        snippet = body[:200].decode("utf-8", "replace").strip()
        detail = f"HTTP {status}" + (f": {snippet}" if snippet else "")
    return error_for(status, error, detail)


def error_from_frame(error: object, detail: object) -> Exception:
    """The exception for an in-band exec ``{"error", "detail"}`` frame (HTTP status was 200)."""
    etype = error if isinstance(error, str) else None
    if etype == "PathNotFound":  # a host may name its exception class instead of the wire type
        etype = "FileNotFoundError"
    text = detail if isinstance(detail, str) else f"exec failed on the host: {etype}"
    status = _BY_TYPE.get(etype or "")
    mapped = None if status is None else error_for(status, etype, text)
    if mapped is None or type(mapped) is SandboxError:
        return SandboxError(text, error=etype)  # an in-band error has no status of its own
    return mapped


_WRAPPERS = (RequestGenerationFailed, RequestTransmissionFailed, ResponseFailed)
"""twisted.web's exceptions that carry the real causes in ``reasons`` (a list of Failures)."""


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """The innermost exceptions under Twisted's wrapper exceptions (ResponseFailed, …)."""
    if isinstance(exc, _WRAPPERS):
        for reason in exc.reasons:
            inner = reason.value if isinstance(reason, Failure) else reason
            if isinstance(inner, BaseException):
                yield from _leaves(inner)
    else:
        yield exc


_TIMEOUTS = (ierror.TimeoutError, ierror.TCPTimedOutError, TimeoutError)
_DEAD = (
    ierror.ConnectError,
    ierror.ConnectionClosed,
    ierror.DNSLookupError,
    ConnectionError,
)
_CANCELLED = (CancelledError, ierror.ConnectingCancelledError)


def error_from_transport(exc: BaseException, *, timed_out: bool, service: bool) -> BaseException:
    """
    Map a transport-level exception to the error model.

    ``timed_out`` says our own deadline fired (the cancellation it caused is then
    ``SandboxBusy``, whatever Twisted wrapped it in). ``service`` says the request went to the
    load-balanced base URL rather than a sandbox's replica: a dead address there is
    ``SandboxUnavailable`` instead of ``SandboxNotFound``. A failure of our own request body
    (e.g. reading the local file) is re-raised as it is; exceptions that are not transport
    failures (and a caller's own cancellation) are returned unchanged.
    """
    if timed_out:
        return SandboxBusy("timed out waiting for the sandbox host")
    if isinstance(exc, SandboxError):
        return exc
    leaves = list(_leaves(exc))
    if isinstance(exc, RequestGenerationFailed):
        return leaves[0] if leaves else exc
    if any(isinstance(leaf, _TIMEOUTS) for leaf in leaves):
        return SandboxBusy("timed out connecting to the sandbox host")
    if any(isinstance(leaf, _CANCELLED) for leaf in leaves):
        return exc if isinstance(exc, CancelledError) else CancelledError()
    if any(isinstance(leaf, ParseError) for leaf in leaves):
        return ProtocolError(f"unparseable HTTP response: {leaves[0]!r}")
    if any(type(leaf).__module__.startswith("OpenSSL") for leaf in leaves):
        return SandboxError(f"TLS failure: {leaves[0]!r}")
    if isinstance(exc, _WRAPPERS) or any(isinstance(leaf, _DEAD) for leaf in leaves):
        reason = ", ".join(type(leaf).__name__ for leaf in leaves) or type(exc).__name__
        if service:
            return SandboxUnavailable(f"sandbox service unreachable ({reason})")
        return SandboxNotFound(f"sandbox host unreachable ({reason})")
    return exc
