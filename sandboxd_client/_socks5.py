"""A sandbox's own SOCKS5 proxy as the client sends and reads it (docs/extensions.rst, the
``network`` object's ``socks5``; docs/isolation.rst, "A sandbox's own SOCKS5 proxy").

The password is a secret: it is never in a :class:`Socks5`'s ``repr`` (nor its ``str``), and
the host never shows it back (``_wire.decode_network`` reads the listing's address, user
name and TLS). Nor does it show a :class:`Socks5TLS`'s CA back: a listed one has only its
server name.
"""

from __future__ import annotations

from typing import Any

from attrs import field, frozen


@frozen
class Socks5TLS:
    """TLS to the proxy with settings of its own: ``server_name`` the name its certificate is
    verified for (and sent as SNI; ``None``: its IP address), ``ca_cert`` PEM certificates it
    must chain to, replacing the host's trust store (``None``: the host's). The CA is not in
    the ``repr``; a sandbox as listed has it ``None``."""

    server_name: str | None = None
    ca_cert: str | None = field(default=None, repr=False)

    def to_json(self) -> bool | dict[str, Any]:
        """The wire's ``tls``: ``true`` when no field is set, else the object."""
        if self.server_name is None and self.ca_cert is None:
            return True
        body: dict[str, Any] = {"enabled": True}
        if self.server_name is not None:
            body["server_name"] = self.server_name
        if self.ca_cert is not None:
            body["ca_cert"] = self.ca_cert
        return body


@frozen
class Socks5:
    """The SOCKS5 proxy all of an ``egress`` sandbox's TCP leaves through, after its lists
    (never directly): ``address`` an IP address and a port (``"203.0.113.80:1080"``,
    ``"[2001:db8::1]:1080"``; a host name is refused by the host), ``username`` and
    ``password`` the RFC 1929 credentials (a password needs a user name), ``tls`` TLS to the
    proxy: ``False`` off, ``True`` on (its certificate verified for its IP address against
    the host's trust store), a :class:`Socks5TLS` on with its server name (the certificate
    verified for that name) or CA. The password is not in the ``repr``; a sandbox as listed
    has it ``None``, and its ``tls`` a :class:`Socks5TLS` when the host shows a server name."""

    address: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool | Socks5TLS = False

    def to_json(self) -> dict[str, Any]:
        """The wire's object: fields left at their defaults are not sent."""
        body: dict[str, Any] = {"address": self.address}
        if self.username is not None:
            body["username"] = self.username
        if self.password is not None:
            body["password"] = self.password
        if isinstance(self.tls, Socks5TLS):
            body["tls"] = self.tls.to_json()
        elif self.tls:
            body["tls"] = True
        return body
