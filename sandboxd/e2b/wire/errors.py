"""The E2B front's errors (docs/e2b.rst): the exceptions its routes raise, Connect's codes and
their statuses, and one table searched along the class hierarchy, :data:`ERROR_ANSWERS`, that
makes a core error a Connect code and a REST status."""

from collections.abc import Mapping

from attrs import frozen

from sandboxd.errors import (
    BadRequest,
    ContextNotFound,
    ContextsUnavailable,
    Draining,
    InsufficientStorage,
    NoCapacity,
    PathNotFound,
    ProcessConflict,
    ProcessNotFound,
    SandboxdError,
    SandboxNotFound,
    TemplateCannotRun,
    TemplateConflict,
    TemplateNotFound,
    TooMany,
)


class ConnectError(Exception):
    """An error answered as Connect ``code`` (``invalid_argument``, ``not_found``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class RestError(Exception):
    """A control-plane or ``/files`` error: its HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


STATUS_OF_CODE = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}
"""The HTTP status of each Connect code (the Connect protocol's table)."""


@frozen
class ErrorAnswer:
    """How the front answers one kind of core error."""

    code: str
    """Its Connect code (the RPC routes; its HTTP status: :data:`STATUS_OF_CODE`)."""
    status: int
    """Its HTTP status on the REST routes (the control plane, ``/files``, ``/health``)."""
    gone: bool = False
    """It means the sandbox is not running: envd's routes say so in the SDK's words
    (:func:`not_running`; ``502`` on ``/files`` and ``/health``)."""


ERROR_ANSWERS: Mapping[type[SandboxdError], ErrorAnswer] = {
    BadRequest: ErrorAnswer("invalid_argument", 400),
    PathNotFound: ErrorAnswer("not_found", 404),
    ProcessNotFound: ErrorAnswer("not_found", 404),
    ContextNotFound: ErrorAnswer("not_found", 404),
    TemplateNotFound: ErrorAnswer("not_found", 404),
    TemplateConflict: ErrorAnswer("already_exists", 409),
    TemplateCannotRun: ErrorAnswer("unimplemented", 501),
    ContextsUnavailable: ErrorAnswer("unimplemented", 501),
    ProcessConflict: ErrorAnswer("failed_precondition", 400),
    InsufficientStorage: ErrorAnswer("resource_exhausted", 507),  # NotEnoughSpaceException
    TooMany: ErrorAnswer("resource_exhausted", 429),
    NoCapacity: ErrorAnswer("unavailable", 503),
    Draining: ErrorAnswer("unavailable", 503),
    SandboxNotFound: ErrorAnswer("unavailable", 404, gone=True),
    SandboxdError: ErrorAnswer("internal", 500),
}
"""Core error → how it is answered; a subclass answers as its nearest base (any other core
error as :class:`~sandboxd.errors.SandboxdError`: ``internal``, ``500``)."""


def answer_of(error: SandboxdError) -> ErrorAnswer:
    """How ``error`` is answered: the entry of its class, or of its nearest base, in
    :data:`ERROR_ANSWERS`."""
    return next(ERROR_ANSWERS[kind] for kind in type(error).__mro__ if kind in ERROR_ANSWERS)


def connect_error_of(error: Exception) -> ConnectError:
    """The Connect error a core (or front) error is answered with."""
    if isinstance(error, ConnectError):
        return error
    if isinstance(error, SandboxdError):
        return ConnectError(answer_of(error).code, error.detail)
    return ConnectError("internal", str(error) or type(error).__name__)


def not_running(sandbox_id: str) -> ConnectError:
    """A sandbox unknown or killed: the SDK matches ``was not found`` (not running)."""
    return ConnectError("unavailable", f"The sandbox {sandbox_id} was not found")


def no_sandbox_named() -> ConnectError:
    """An envd call without the ``E2b-Sandbox-Id`` header."""
    return ConnectError("invalid_argument", "the E2b-Sandbox-Id header is required")


def events_dropped() -> ConnectError:
    """How a ``WatchDir`` stream ends when its client read too slowly to be told every change
    (what it was not told is gone: it must list the directory again)."""
    return ConnectError(
        "data_loss",
        "events were dropped: the client read the watch stream too slowly (watch again and "
        "list the directory)",
    )


def error_json(error: ConnectError) -> dict[str, str]:
    """A Connect error as JSON (a unary call's body, a stream's last envelope's ``error``)."""
    return {"code": error.code, "message": error.message}
