"""What ``sandboxctl`` takes as HANDLE: a handle (as ``create`` prints it), or a bare
sandbox id (as ``list`` prints it) on the service of ``--url``."""

from __future__ import annotations

from .._handles import decode_handle, encode_handle
from .._types import SandboxHandle


def resolve_handle(text: str, url: str) -> SandboxHandle:
    """``text`` as a handle; a string that is no handle is the id of a sandbox on ``url``
    (``ValueError`` for one that is neither)."""
    try:
        decode_handle(text)
    except ValueError:
        if not text or any(c.isspace() for c in text):
            # An unset variable ($H) or a pasted line: no sandbox id is blank or has spaces.
            raise ValueError(
                f"malformed sandbox handle or id {text[:80]!r}: give what create prints,"
                " or an id as list prints it"
            ) from None
        try:
            return encode_handle(url.rstrip("/"), text)
        except ValueError:
            raise ValueError(f"malformed sandbox handle or id {text[:80]!r}") from None
    return SandboxHandle(text)
