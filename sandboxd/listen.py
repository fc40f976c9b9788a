"""Where the daemon listens: the port claimed on IPv4 and IPv6 alike, and loopback by default.

A sandbox in ``host`` network mode shares the host's addresses. If the daemon listened on one
address family only, a sandbox could bind the same port on the other one (``[::1]:8080`` next
to ``127.0.0.1:8080``) and receive the bearer token of every client whose ``localhost``
resolved to that family first. So a ``tcp:`` (or ``tcp6:``) endpoint is listened on in both
families (:func:`plan`): any address means ``0.0.0.0`` and ``[::]`` (the IPv6 socket
``IPV6_V6ONLY``, so the two never overlap), ``127.0.0.1``/``::1``/``localhost`` means both
loopbacks. A family that cannot be had stops start-up, naming the address; only a kernel
without IPv6 at all (nobody can listen on it) is skipped, and said. ``SANDBOXD_DUAL_STACK=off``
listens exactly as the endpoint string says (Twisted's own parsing: ``tcp:`` is IPv4 only).

Other endpoint types (``systemd:``, ``ssl:``, ``unix:``, …) are Twisted's, unchanged.
"""

import errno
import ipaddress
import socket
from collections.abc import Callable, Iterable
from typing import Any

from attrs import frozen
from twisted.application.service import Service
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IProtocolFactory
from twisted.logger import Logger

from sandboxd import port_remnants

log = Logger()

DUAL_STACK_MODES = ("on", "off")
LOOPBACK_NAMES = frozenset({"127.0.0.1", "::1", "localhost"})
ANY_NAMES = frozenset({"", "0.0.0.0", "::"})
DEFAULT_BACKLOG = 50  # twisted.internet.tcp.Port's own


class CannotListen(Exception):
    """An address of the plan could not be listened on; the message names it."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


@frozen
class Address:
    """One socket to listen on."""

    family: socket.AddressFamily
    host: str
    port: int
    backlog: int = DEFAULT_BACKLOG

    def __str__(self) -> str:
        host = f"[{self.host}]" if self.family == socket.AF_INET6 else self.host
        return f"{host}:{self.port}"


def split_endpoint(description: str) -> tuple[str, list[str], dict[str, str]]:
    """``type:arg:key=value`` → (type, positional args, keyword args), as Twisted splits it
    (``\\:`` is a literal colon, e.g. in an IPv6 address)."""
    parts: list[str] = [""]
    escaped = False
    for char in description:
        if escaped:
            parts[-1] += char
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ":":
            parts.append("")
        else:
            parts[-1] += char
    kind, rest = parts[0].strip().lower(), parts[1:]
    args = [part for part in rest if "=" not in part]
    kwargs = dict(part.split("=", 1) for part in rest if "=" in part)
    return kind, args, kwargs


def interface_of(description: str) -> tuple[str, str] | None:
    """(type, interface) of a ``tcp``/``tcp6``/``ssl`` endpoint; ``None`` for other types."""
    kind, _, kwargs = split_endpoint(description)
    if kind not in ("tcp", "tcp6", "ssl"):
        return None
    default = "::" if kind == "tcp6" else ""
    return kind, kwargs.get("interface", default).strip().strip("[]")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def reaches_beyond_loopback(description: str) -> bool:
    """Whether peers on other hosts can reach this endpoint.

    Only a ``tcp``/``tcp6``/``ssl`` endpoint on a loopback address, and a ``unix`` socket,
    are local; anything else (any address, a host's own address, ``systemd:``, whose address
    is the unit's) is taken to reach beyond loopback.
    """
    if split_endpoint(description)[0] == "unix":
        return False
    found = interface_of(description)
    return found is None or not is_loopback(found[1])


def plan(description: str) -> list[Address] | None:
    """The sockets a ``tcp``/``tcp6`` endpoint is listened on with both families claimed;
    ``None`` for any other endpoint type (listened on through Twisted as it is)."""
    kind, args, kwargs = split_endpoint(description)
    if kind not in ("tcp", "tcp6"):
        return None
    try:
        port = int(kwargs.get("port", args[0] if args else ""))
        backlog = int(kwargs.get("backlog", DEFAULT_BACKLOG))
    except ValueError:
        raise CannotListen(f"{description!r}: the port and backlog must be numbers") from None
    found = interface_of(description)
    assert found is not None
    host = found[1]
    if host in ANY_NAMES:
        pairs = [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")]
    elif host in LOOPBACK_NAMES:
        pairs = [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
    else:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise CannotListen(f"{description!r}: interface {host!r} is not an address") from None
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        pairs = [(family, str(address))]
    return [Address(family, host, port, backlog) for family, host in pairs]


def capabilities(description: str, dual_stack: bool) -> list[str]:
    """``listen.dual-stack`` when both address families are claimed."""
    return (
        ["listen.dual-stack"]
        if dual_stack
        and split_endpoint(description)[0]
        in (
            "tcp",
            "tcp6",
        )
        else []
    )


SocketMaker = Callable[[socket.AddressFamily], socket.socket]


def new_socket(family: socket.AddressFamily) -> socket.socket:
    return socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)


def bind(address: Address, make: SocketMaker = new_socket) -> socket.socket | None:
    """A socket listening on ``address``; ``None`` when the kernel has no such family.

    ``SO_REUSEADDR`` as Twisted sets it (a restart binds past ``TIME_WAIT``; it lets nobody
    bind a port that is listened on); never ``SO_REUSEPORT``. An IPv6 socket is
    ``IPV6_V6ONLY``, so that ``[::]`` leaves ``0.0.0.0`` to its IPv4 twin.
    """
    try:
        sock = make(address.family)
    except OSError as e:
        if e.errno == errno.EAFNOSUPPORT:
            return None
        raise CannotListen(f"{address}: {e.strerror}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if address.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((address.host, address.port))
        sock.listen(address.backlog)
    except OSError as e:
        sock.close()
        raise CannotListen(f"{address}: {e.strerror}", e.errno) from None
    return sock


def bind_all(addresses: Iterable[Address], make: SocketMaker = new_socket) -> list[socket.socket]:
    """Listen on every address, on one port: port 0 takes the port the first socket got.

    Raises :class:`CannotListen` (closing what it opened) when one cannot be had.
    """
    bound: list[socket.socket] = []
    port = None
    try:
        for address in addresses:
            if port is not None:
                address = Address(address.family, address.host, port, address.backlog)
            sock = bind(address, make)
            if sock is None:
                log.warn(
                    "listen: this kernel has no {family}: nothing can listen on {address}",
                    family="IPv6" if address.family == socket.AF_INET6 else "IPv4",
                    address=address,
                )
                continue
            bound.append(sock)
            port = sock.getsockname()[1]
    except CannotListen:
        for sock in bound:
            sock.close()
        raise
    return bound


class Listeners(Service):
    """The daemon's listening ports. Nothing listens when the service starts: the daemon calls
    :meth:`listen` once its predecessor's sandboxes are reclaimed (one of them may hold the
    port). Stopping the service stops listening."""

    def __init__(
        self,
        reactor: Any,
        description: str,
        factory: IProtocolFactory,
        dual_stack: bool = True,
        make: SocketMaker = new_socket,
        destroy_orphans: Callable[[int], int] = port_remnants.destroy_orphans,
    ) -> None:
        self.reactor = reactor
        self.description = description
        self.factory = factory
        self.dual_stack = dual_stack
        self.make = make
        self.destroy_orphans = destroy_orphans
        self.ports: list[IListeningPort] = []

    async def listen(self) -> list[str]:
        """Listen; the addresses listened on. Raises :class:`CannotListen` naming the one that
        could not be had (nothing is left listening then)."""
        addresses = plan(self.description) if self.dual_stack else None
        if addresses is None:
            try:
                endpoint = serverFromString(self.reactor, self.description)
                port: IListeningPort = await endpoint.listen(self.factory)
            except Exception as e:
                raise CannotListen(f"{self.description}: {e}") from None
            self.ports.append(port)
            return [self.description]
        for sock in self._bind(addresses):
            with sock:
                self.ports.append(
                    self.reactor.adoptStreamPort(sock.fileno(), sock.family, self.factory)
                )
        return [shown(port) for port in self.ports]

    def _bind(self, addresses: list[Address]) -> list[socket.socket]:
        """Bind, and once more after destroying the connections that dead processes left
        closing on the port (:mod:`sandboxd.port_remnants`), if that is what held it."""
        try:
            return bind_all(addresses, self.make)
        except CannotListen as e:
            if e.errno != errno.EADDRINUSE:
                raise
            port = addresses[0].port
            try:
                destroyed = self.destroy_orphans(port)
            except OSError as why:
                raise CannotListen(
                    f"{e} (if connections that dead processes left closing hold it, they "
                    f"cannot be removed here: {why.strerror}; they expire within a minute)"
                ) from None
            if not destroyed:
                raise
            log.info(
                "listen: port {port} was held by {count} connections that no process holds"
                " (left by a reclaimed sandbox): destroyed",
                port=port,
                count=destroyed,
            )
            return bind_all(addresses, self.make)

    def stopService(self) -> "Deferred[None]":
        super().stopService()  # type: ignore[no-untyped-call]
        ports, self.ports = self.ports, []
        stops = [maybeDeferred(port.stopListening) for port in ports]
        return gatherResults(stops).addCallback(lambda _: None)


def shown(port: IListeningPort) -> str:
    """``127.0.0.1:8080`` / ``[::1]:8080`` of a listening TCP port."""
    host: Any = port.getHost()
    family = socket.AF_INET6 if ":" in host.host else socket.AF_INET
    return str(Address(family, host.host, host.port))
