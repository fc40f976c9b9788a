"""The egress proxy's connection to a sandbox's upstream (docs/isolation.rst, "Egress by
name"): made once the proxy let the connection pass, handed to the sandbox's side
(:class:`~sandboxd.isolation.network.egress_proxy.SandboxSide`) as soon as it is up, or the
sandbox's connection refused when it cannot be made."""

from typing import Any, Protocol

from twisted.internet import protocol


class Sandbox(Protocol):
    """What the upstream asks of the sandbox's side."""

    def relay_to(self, upstream: Any, answered: bytes = b"") -> None:
        """The upstream (its transport) is up."""

    def fail(self, reason: str, name: str) -> None:
        """Refuse the sandbox's connection for ``reason``."""


class UpstreamFactory(protocol.ClientFactory):
    noisy = False  # (no log line per connection)

    def __init__(self, sandbox: Sandbox, name: str, unreachable: str) -> None:
        self.sandbox = sandbox
        self.name = name
        self.unreachable = unreachable

    def buildProtocol(self, addr: Any) -> "UpstreamSide":
        return UpstreamSide(self.sandbox)

    def clientConnectionFailed(self, connector: Any, reason: Any) -> None:
        self.sandbox.fail(self.unreachable, self.name)


class UpstreamSide(protocol.Protocol):
    """The proxy's connection to the address the name resolved to, until it is relayed."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def connectionMade(self) -> None:
        self.sandbox.relay_to(self.transport)
