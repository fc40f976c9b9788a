"""
Handle encoding (docs/contract.rst, "Routing and handles").

``POST /sandboxes`` answers the replica's own ``pod_url`` and its local ``remote_id``; the
handle id is base64 of the JSON object ``{"u": pod_url, "r": remote_id}``. Every later call
decodes it and goes straight to ``pod_url``. We write URL-safe base64 and read both alphabets,
with or without padding. Anything malformed is a ``ValueError`` raised before any request.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json

from attrs import field, frozen
from hyperlink import DecodedURL

from ._types import SandboxHandle


@frozen
class Route:
    """
    Where a handle's calls go: the replica's base URL and the sandbox's remote id there.

    ``base`` is ``pod_url`` parsed; it is left out of comparisons because hyperlink's URL
    equality fails on IPv6 literal hosts.
    """

    pod_url: str
    remote_id: str
    base: DecodedURL = field(eq=False, repr=False)


CACHED = 4096
"""How many parsed base URLs and decoded handles are kept (each call decodes its handle, and
parsing a URL costs tens of microseconds: hyperlink checks the host with IDNA)."""


def check_base_url(url: str) -> DecodedURL:
    """
    Parse an ``http``/``https`` base URL with a host, or raise ``ValueError``.

    Query and fragment are not allowed: calls append path segments to it. Parsed URLs are
    cached (they are immutable); a malformed one raises every time.
    """
    if not isinstance(url, str):
        raise ValueError(f"URL must be a string, not {type(url).__name__}")
    return _parse_base_url(url)


@functools.lru_cache(maxsize=CACHED)
def _parse_base_url(url: str) -> DecodedURL:
    try:
        parsed = DecodedURL.from_text(url)
    except Exception as e:  # hyperlink raises several types for bad text
        raise ValueError(f"malformed URL {url!r}: {e}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"URL {url!r} must be http:// or https:// with a host")
    if parsed.query or parsed.fragment:
        raise ValueError(f"URL {url!r} must not carry a query or fragment")
    return parsed


def _check_remote_id(remote_id: object) -> str:
    if not isinstance(remote_id, str) or remote_id in ("", ".", ".."):
        raise ValueError(f"malformed remote id {remote_id!r}")
    if "/" in remote_id or any(ord(c) < 0x20 or c == "\x7f" for c in remote_id):
        raise ValueError(f"malformed remote id {remote_id!r}")
    return remote_id


def encode_handle(pod_url: str, remote_id: str) -> SandboxHandle:
    """Pack a replica URL and a remote id into a handle; ``ValueError`` if either is malformed."""
    check_base_url(pod_url)
    _check_remote_id(remote_id)
    raw = json.dumps({"u": pod_url, "r": remote_id}, separators=(",", ":"), sort_keys=True)
    return SandboxHandle(base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii"))


def decode_handle(handle: SandboxHandle | str) -> Route:
    """
    Unpack a handle (or its bare id string) into a ``Route``.

    Accepts standard and URL-safe base64, padded or not. Raises ``ValueError`` for anything
    that is not base64 of a JSON object with a string ``u`` (an http(s) URL) and a string ``r``.
    Decoded handles are cached (a ``Route`` is immutable); a malformed one raises every time.
    """
    hid = handle.id if isinstance(handle, SandboxHandle) else handle
    if not isinstance(hid, str) or not hid.strip():
        raise ValueError("empty or non-string sandbox handle")
    return _decode_id(hid)


@functools.lru_cache(maxsize=CACHED)
def _decode_id(hid: str) -> Route:
    text = hid.strip().replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeError, binascii.Error, ValueError):
        raise ValueError(f"malformed sandbox handle {hid[:80]!r}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("u"), str):
        raise ValueError(f"malformed sandbox handle {hid[:80]!r}")
    return Route(obj["u"], _check_remote_id(obj.get("r")), check_base_url(obj["u"]))
