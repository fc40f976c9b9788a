"""The errors the API answers with: each knows its HTTP status and its wire ``error`` type.

The HTTP layer maps them in one place (``SandboxAPI.app.handle_errors``) to
``{"error": <type>, "detail": <msg>}``.
"""

from typing import ClassVar


class APIError(Exception):
    """An error with a fixed HTTP status and wire type; the message is the ``detail``."""

    status: ClassVar[int] = 500
    wire_type: ClassVar[str] = "InternalError"

    @property
    def detail(self) -> str:
        return str(self.args[0]) if self.args else self.wire_type


class BadRequest(APIError):
    """Malformed body, wrong field type, path escaping the workspace, bad item_id."""

    status = 400
    wire_type = "BadRequest"


class Unauthorized(APIError):
    """Missing or wrong bearer token."""

    status = 401
    wire_type = "Unauthorized"


class SandboxNotFound(APIError):
    """Unknown or killed sandbox id."""

    status = 404
    wire_type = "SandboxNotFound"


class PathNotFound(APIError):
    """Download / delete / rmdir / rename of a path that does not exist."""

    status = 404
    wire_type = "FileNotFoundError"


class TooLarge(APIError):
    """A request body over the configured limit."""

    status = 413
    wire_type = "TooLarge"


class InsufficientStorage(APIError):
    """A write failed with ENOSPC or EDQUOT."""

    status = 507
    wire_type = "InsufficientStorage"


class Draining(APIError):
    """The daemon is draining and refuses new sandboxes."""

    status = 503
    wire_type = "Draining"


class NoCapacity(APIError):
    """No uid (or memory) is left for a new sandbox."""

    status = 503
    wire_type = "NoCapacity"
