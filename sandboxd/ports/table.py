"""What the proxy keeps per sandbox: its open proxied connections (capped) and its public
ports, and where its network namespace is pinned."""

from collections.abc import Callable
from typing import TYPE_CHECKING

from attrs import define, field

from sandboxd.errors import TooMany
from sandboxd.ports.dial import PortsUnavailable

if TYPE_CHECKING:
    from sandboxd.core.manager import SandboxManager

PORT_MIN = 1
PORT_MAX = 65535


class Closable:
    """A proxied connection, as the table closes it (the sandbox is killed)."""

    def close(self) -> None:
        raise NotImplementedError


@define
class PortTable:
    """The sandboxes' proxied connections (at most ``connections_max`` open at once per
    sandbox) and public ports. ``net_pin`` gives a sandbox's pinned network namespace
    (``None``: it has none of its own)."""

    net_pin: Callable[[str], str | None]
    connections_max: int
    _open: dict[str, set[Closable]] = field(factory=dict)
    _public: set[tuple[str, int]] = field(factory=set)

    def pin_of(self, rid: str) -> str:
        """Where ``rid``'s network namespace is pinned; :class:`PortsUnavailable` when it has
        none of its own (connecting to ``127.0.0.1`` would reach the host's ports)."""
        pin = self.net_pin(rid)
        if pin is None:
            raise PortsUnavailable(
                "this sandbox has no network namespace of its own (isolation off, namespaces "
                "off, or network mode 'host'): its ports cannot be reached without reaching "
                "the host's, so the proxy refuses"
            )
        return pin

    def opened(self, rid: str, connection: Closable) -> None:
        """Count ``connection`` open for ``rid``; :class:`~sandboxd.errors.TooMany` past the
        cap (``SANDBOXD_PORT_CONNECTIONS_MAX``)."""
        held = self._open.setdefault(rid, set())
        if len(held) >= self.connections_max:
            raise TooMany(
                f"{len(held)} proxied connections are open to this sandbox already "
                f"(SANDBOXD_PORT_CONNECTIONS_MAX={self.connections_max})"
            )
        held.add(connection)

    def closed(self, rid: str, connection: Closable) -> None:
        """``connection`` of ``rid`` is closed (no error if it was not counted)."""
        held = self._open.get(rid)
        if held is None:
            return
        held.discard(connection)
        if not held:
            del self._open[rid]

    def forget(self, rid: str) -> None:
        """``rid`` is killed: close its proxied connections and forget its public ports."""
        for connection in list(self._open.pop(rid, ())):
            connection.close()
        self._public = {(r, p) for r, p in self._public if r != rid}

    def set_public(self, rid: str, port: int, public: bool) -> None:
        if public:
            self._public.add((rid, port))
        else:
            self._public.discard((rid, port))

    def is_public(self, rid: str, port: int) -> bool:
        return (rid, port) in self._public


def table_for(manager: "SandboxManager") -> PortTable:
    """The table of ``manager``'s sandboxes: their pins from its isolation's namespaces, the
    cap from its configuration (``SANDBOXD_PORT_CONNECTIONS_MAX``)."""
    return PortTable(manager.isolation.namespaces.net_pin, manager.config.port_connections_max)
