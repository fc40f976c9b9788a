"""Whether a request's body was stored whole: the one check every route that reads a body
makes first, on either front (each front answers :class:`TooLarge` in its own terms)."""

import errno
import os

from twisted.web.iweb import IRequest

from sandboxd.errors import InsufficientStorage, SandboxdError


class TooLarge(SandboxdError):
    """A request body over the configured limit (a front's own refusal)."""


def refuse_too_large(request: IRequest, limit: int) -> None:
    """``413`` when the body was over the site's limit, or is over ``limit``; ``507`` when it
    could not be stored for want of space (``500`` for any other reason)."""
    if getattr(request, "too_large", False):
        raise TooLarge("the request body is over the configured limit")
    error: OSError | None = getattr(request, "content_error", None)
    if error is not None:
        detail = f"the request body could not be stored: {os.strerror(error.errno or 0)}"
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientStorage(detail)
        raise SandboxdError(detail)
    length = request.getHeader(b"content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise TooLarge(f"the request body is over {limit} bytes")
