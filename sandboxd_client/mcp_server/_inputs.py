"""Structured arguments of the MCP tools, whose JSON schemas the model is shown."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .._socks5 import Socks5, Socks5TLS


class Socks5ProxyTLS(BaseModel):
    """``socks5``'s ``tls`` as an object, as the host takes it (docs/extensions.rst)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="TLS on (false: plain SOCKS5, no field).")
    server_name: str | None = Field(
        default=None, description="The name the proxy's certificate is verified for (and SNI)."
    )
    ca_cert: str | None = Field(
        default=None, description="PEM certificates the proxy's must chain to (not the host's)."
    )

    def to_tls(self) -> bool | Socks5TLS:
        """The client's value; ``ValueError`` when off with a field set (as the host says)."""
        if not self.enabled:
            if self.server_name is not None or self.ca_cert is not None:
                raise ValueError("socks5.tls: takes no other field when enabled is false")
            return False
        return Socks5TLS(self.server_name, self.ca_cert)


class Socks5Proxy(BaseModel):
    """``create_sandbox``'s ``socks5`` (docs/isolation.rst, "A sandbox's own SOCKS5 proxy")."""

    address: str = Field(description="IP:PORT of the proxy (an IP address, not a host name).")
    username: str | None = Field(default=None, description="RFC 1929 user name.")
    password: str | None = Field(default=None, description="RFC 1929 password (needs username).")
    tls: bool | Socks5ProxyTLS = Field(
        default=False,
        description="TLS to the proxy: true, or {enabled, server_name, ca_cert}.",
    )

    def to_socks5(self) -> Socks5:
        """The client's value (whose ``repr`` leaves the password and the CA out)."""
        tls = self.tls if isinstance(self.tls, bool) else self.tls.to_tls()
        return Socks5(self.address, self.username, self.password, tls)
