"""A sandbox's own SOCKS5 proxy as the client sends and reads it (docs/extensions.rst, the
``network`` object's ``socks5``; docs/isolation.rst, "A sandbox's own SOCKS5 proxy").

The password is a secret: it is never in a :class:`Socks5`'s ``repr`` (nor its ``str``), and
the host never shows it back (``_wire.decode_network`` reads the listing's address, user
name and TLS).
"""

from __future__ import annotations

from typing import Any

from attrs import field, frozen


@frozen
class Socks5:
    """The SOCKS5 proxy all of an ``egress`` sandbox's TCP leaves through, after its lists
    (never directly): ``address`` an IP address and a port (``"203.0.113.80:1080"``,
    ``"[2001:db8::1]:1080"``; a host name is refused by the host), ``username`` and
    ``password`` the RFC 1929 credentials (a password needs a user name), ``tls`` TLS to the
    proxy (its certificate verified for its IP address). The password is not in the
    ``repr``; a sandbox as listed has it ``None``."""

    address: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False

    def to_json(self) -> dict[str, Any]:
        """The wire's object: fields left at their defaults are not sent."""
        body: dict[str, Any] = {"address": self.address}
        if self.username is not None:
            body["username"] = self.username
        if self.password is not None:
            body["password"] = self.password
        if self.tls:
            body["tls"] = True
        return body
