"""The errors of the HTTP front (docs/contract.rst, "Errors"): one table,
:data:`ERROR_TYPES`, where a core error (or one of the front's own, below) gives its HTTP status
and its wire ``error`` type; anything not in the table is an ``500 InternalError``.
"""

from collections.abc import Mapping

from sandboxd.errors import (
    ArchiveFailed,
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
    TemplatesUnavailable,
    TemplateTooLarge,
    TerminalsUnavailable,
    TooMany,
    TooManyEntries,
)
from sandboxd.ports.dial import PortClosed, PortsUnavailable
from sandboxd.web.answers import error_body
from sandboxd.web.body import TooLarge


class Unauthorized(SandboxdError):
    """Missing or wrong bearer token (a front's own refusal)."""


INTERNAL = (500, "InternalError")

ERROR_TYPES: Mapping[type[SandboxdError], tuple[int, str]] = {
    BadRequest: (400, "BadRequest"),
    Unauthorized: (401, "Unauthorized"),
    SandboxNotFound: (404, "SandboxNotFound"),
    PathNotFound: (404, "FileNotFoundError"),
    ProcessNotFound: (404, "ProcessNotFound"),
    ContextNotFound: (404, "ContextNotFound"),
    ContextsUnavailable: (501, "ContextsUnavailable"),
    ProcessConflict: (409, "Conflict"),
    TooLarge: (413, "TooLarge"),
    TooManyEntries: (413, "TooLarge"),
    TooMany: (429, "TooMany"),
    ArchiveFailed: (500, "ArchiveError"),
    Draining: (503, "Draining"),
    NoCapacity: (503, "NoCapacity"),
    InsufficientStorage: (507, "InsufficientStorage"),
    # Templates (docs/extensions.rst, "Templates"); BadArchive is a BadRequest
    TemplateNotFound: (404, "TemplateNotFound"),
    TemplateConflict: (409, "Conflict"),
    TemplateTooLarge: (413, "TooLarge"),
    TemplatesUnavailable: (503, "TemplatesUnavailable"),
    TemplateCannotRun: (501, "NotImplemented"),
    # Ports (docs/extensions.rst, "Ports")
    PortClosed: (502, "PortClosed"),
    PortsUnavailable: (409, "Conflict"),
    # Terminals (docs/extensions.rst, "Terminals")
    TerminalsUnavailable: (501, "NotImplemented"),
}
"""Core error → (HTTP status, wire ``error`` type); a subclass answers as its nearest base."""


def status_and_type(error: SandboxdError) -> tuple[int, str]:
    """The HTTP status and wire type of ``error`` (:data:`INTERNAL` when it has none)."""
    for kind in type(error).__mro__:
        if kind in ERROR_TYPES:
            return ERROR_TYPES[kind]
    return INTERNAL


def detail_of(error: SandboxdError) -> str:
    """The ``detail`` of an error body: its message, else its wire type."""
    return str(error.args[0]) if error.args else status_and_type(error)[1]


def core_error_body(error: SandboxdError) -> tuple[int, bytes]:
    """The status and error body answering ``error``."""
    status, kind = status_and_type(error)
    return status, error_body(kind, detail_of(error))


UNAUTHORIZED_DETAIL = "a valid 'Authorization: Bearer <token>' header is required"
"""The ``detail`` of every ``401``."""

BEARER_CHALLENGE = b'Bearer realm="sandboxd"'
"""The ``www-authenticate`` header of every ``401`` (RFC 9110 §11.6.1)."""


def unauthorized_answer() -> bytes:
    """A whole ``401`` answer, status line to body, that closes the connection: the channel's
    own, sent as soon as a request's headers show it lacks the token."""
    body = error_body("Unauthorized", UNAUTHORIZED_DETAIL)
    return (
        b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n"
        b"www-authenticate: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
        % (BEARER_CHALLENGE, len(body), body)
    )
