"""A sandbox's own SOCKS5 proxy ("bring your own proxy"): the ``socks5`` of a native policy
and E2B's ``egressProxy`` (docs/isolation.rst, "A sandbox's own SOCKS5 proxy").

Pure values only. Both fronts send the same object, ``{"address": "ADDRESS:PORT",
"username": ..., "password": ..., "tls": ...}``; it becomes the policy's
:class:`~sandboxd.isolation.network.egress_socks.SocksUpstream`, which the egress proxy asks
for that sandbox's connections instead of the operator's (``SANDBOXD_EGRESS_SOCKS5``, the
fallback). The address must be an IP address: the operator's check of it
(:func:`~sandboxd.isolation.network.egress_policy.check_allowed`) is made once, when the
policy is given, and a name could resolve elsewhere later. The user name and password go as
RFC 1929 says (1 to 255 bytes each; a password needs a user name). ``tls`` asks for TLS to
the proxy (:mod:`.egress_socks_tls`). The password is a secret: no error names it,
:func:`own_socks_json` leaves it out (and the ``ca_cert``), and :class:`SocksUpstream`
keeps it out of its ``repr``.
"""

import ipaddress
from typing import Any

from sandboxd.isolation.network.egress_socks import SocksUpstream, parse_socks_address
from sandboxd.isolation.network.egress_socks_tls import (
    NAMES,
    parse_socks_tls,
    socks_tls_json,
)

FIELDS = ("address", "username", "password", "tls")

SECRET_MAX = 255
"""Longest user name and password, in bytes (RFC 1929)."""


def parse_own_socks(value: object, where: str, tls_names: tuple[str, str] = NAMES) -> SocksUpstream:
    """A request's SOCKS5 proxy object as an upstream; ``ValueError`` naming the field
    (``where`` its name in the request) and never a user name's or password's value
    (``tls_names``: how its ``tls`` fields are spelt, :mod:`.egress_socks_tls`)."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: must be an object with an address")
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}")
    text = value.get("address")
    if not isinstance(text, str):
        raise ValueError(f"{where}.address: must be a string, ADDRESS:PORT")
    try:
        address = parse_socks_address(text)
        ipaddress.ip_address(address.host)
    except ValueError as e:
        raise ValueError(
            f"{where}.address: {e} (an IP address and a port: a host name is not supported)"
        ) from None
    user = _secret(value, "username", where)
    password = _secret(value, "password", where)
    if password is not None and user is None:
        raise ValueError(f"{where}.password: needs a username")
    tls = parse_socks_tls(value.get("tls"), f"{where}.tls", tls_names)
    return SocksUpstream(address, user, password, tls)


def _secret(value: dict[str, Any], name: str, where: str) -> bytes | None:
    """A user name or password: ``None`` when absent, else 1 to 255 bytes of UTF-8."""
    text = value.get(name)
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"{where}.{name}: must be a string")
    raw = text.encode()
    if not 0 < len(raw) <= SECRET_MAX:
        raise ValueError(f"{where}.{name}: must be 1 to {SECRET_MAX} bytes (RFC 1929)")
    return raw


def own_socks_json(upstream: SocksUpstream, tls_names: tuple[str, str] = NAMES) -> dict[str, Any]:
    """The proxy as a listing shows it: its address, user name and TLS, never the password
    (nor the CA)."""
    shown: dict[str, Any] = {"address": str(upstream.address)}
    if upstream.user is not None:
        shown["username"] = upstream.user.decode()
    if upstream.tls is not None:
        shown["tls"] = socks_tls_json(upstream.tls, tls_names)
    return shown
