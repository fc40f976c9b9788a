"""Structured arguments of the MCP tools, whose JSON schemas the model is shown."""

from __future__ import annotations

from pydantic import BaseModel, Field

from .._socks5 import Socks5


class Socks5Proxy(BaseModel):
    """``create_sandbox``'s ``socks5`` (docs/isolation.rst, "A sandbox's own SOCKS5 proxy")."""

    address: str = Field(description="IP:PORT of the proxy (an IP address, not a host name).")
    username: str | None = Field(default=None, description="RFC 1929 user name.")
    password: str | None = Field(default=None, description="RFC 1929 password (needs username).")
    tls: bool = Field(default=False, description="TLS to the proxy.")

    def to_socks5(self) -> Socks5:
        """The client's value (whose ``repr`` leaves the password out)."""
        return Socks5(self.address, self.username, self.password, self.tls)
