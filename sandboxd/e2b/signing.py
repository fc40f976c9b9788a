"""envd's signed ``/files`` URLs: ``download_url()`` and ``upload_url()`` of the SDK.

A signed URL carries, instead of the ``X-Access-Token`` header, ``signature=v1_<b64>`` (and
optionally ``signature_expiration=<unix seconds>``): ``<b64>`` is the unpadded base64 of
SHA-256 over ``<path>:<read|write>:<username or empty>:<access token>[:<expiration>]``, the
path and username exactly as the query gives them. It is checked as envd checks it: a wrong
signature is ``invalid signature``, a right one past its expiration ``signature is already
expired`` (both ``401``).

The SDK builds these URLs from ``E2B_SANDBOX_URL`` alone, so they name no sandbox (no
``E2b-Sandbox-Id`` header: a browser or ``curl`` sends none): the sandbox is the one whose
access token makes the signature, each known sandbox tried in turn (a hash of a few dozen
bytes each). With the header, only that sandbox is tried.
"""

import base64
import hashlib
import hmac
from collections.abc import Mapping

from sandboxd.e2b.registry import E2BSandbox, Registry
from sandboxd.e2b.wire import RestError
from sandboxd.errors import SandboxNotFound

READ = "read"
WRITE = "write"
PREFIX = "v1_"


def signature(path: str, operation: str, user: str, token: str, expiration: int | None) -> str:
    """The ``v1`` signature of an operation on ``path`` as ``user`` with ``token``."""
    fields = [path, operation, user, token]
    if expiration is not None:
        fields.append(str(expiration))
    digest = hashlib.sha256(":".join(fields).encode()).digest()
    return PREFIX + base64.b64encode(digest).rstrip(b"=").decode("ascii")


def is_signed(query: Mapping[str, str]) -> bool:
    """Whether the query carries a signature (it is then judged by :func:`signed_sandbox`)."""
    return "signature" in query


def expiration_of(query: Mapping[str, str]) -> int | None:
    """The signature's expiration (unix seconds; ``None``: none); ``RestError(400)`` if it is
    not an integer."""
    if "signature_expiration" not in query:
        return None
    try:
        return int(query["signature_expiration"])
    except ValueError:
        raise RestError(400, "signature_expiration: must be an integer") from None


def _signer(
    registry: Registry, sandbox_id: str, query: Mapping[str, str], operations: tuple[str, ...]
) -> E2BSandbox | None:
    """The sandbox (``sandbox_id`` only, when given) whose access token signed the query for
    one of ``operations`` (``None``: none did); a malformed expiration is
    :func:`expiration_of`'s ``RestError``."""
    given = query.get("signature", "").encode()
    path, user = query.get("path", ""), query.get("username", "")
    expiration = expiration_of(query)
    for entry in registry.named_or_all(sandbox_id):
        for operation in operations:
            wanted = signature(path, operation, user, entry.token, expiration)
            if hmac.compare_digest(wanted.encode(), given):
                return entry
    return None


def signer_of(registry: Registry, sandbox_id: str, query: Mapping[str, str]) -> E2BSandbox | None:
    """The sandbox (``sandbox_id`` only, when given) that signed the query, to read or to
    write (``None``: none did); a malformed expiration is :func:`expiration_of`'s
    ``RestError``."""
    return _signer(registry, sandbox_id, query, (READ, WRITE))


def signs_any(registry: Registry, sandbox_id: str, query: Mapping[str, str]) -> bool:
    """Whether a sandbox (``sandbox_id`` only, when given) signed the query, to read or to
    write: judged at the headers, before a byte of the body is stored. The operation and the
    expiration are judged by the route (:func:`signed_sandbox`); a malformed expiration is
    :func:`expiration_of`'s ``RestError``."""
    return signer_of(registry, sandbox_id, query) is not None


def signed_sandbox(
    registry: Registry, sandbox_id: str, query: Mapping[str, str], operation: str, now: float
) -> E2BSandbox:
    """The sandbox whose access token signed the query for ``operation`` (``sandbox_id``
    only, when given); ``RestError(401)`` in envd's words otherwise."""
    entry = _signer(registry, sandbox_id, query, (operation,))
    if entry is None:
        if sandbox_id and not registry.named_or_all(sandbox_id):
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        raise RestError(401, "invalid signature")
    expiration = expiration_of(query)
    if expiration is not None and expiration < now:
        raise RestError(401, "signature is already expired")
    return registry.get(entry.id)
