"""Connecting to ``127.0.0.1:PORT`` inside a sandbox's network namespace.

A socket belongs to the network namespace of the thread that created it. Each dial starts a
thread of its own that enters the sandbox's pinned network namespace
(:mod:`sandboxd.isolation.namespaces.pins`) with ``setns(2)``, connects, and ends: no thread
of the daemon ever comes back from a sandbox's namespace, and the reactor's thread never enters
one. The connected socket is handed to the reactor (``adoptStreamConnection``).
"""

import ctypes
import errno
import os
import socket
import threading
from collections.abc import Callable

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFromThreads

from sandboxd.errors import SandboxdError, SandboxNotFound

CLONE_NEWNET = 0x40000000
CONNECT_TIMEOUT = 5.0
"""Seconds a connect inside the namespace may take (a loopback connect takes microseconds;
a full listen backlog is what makes it wait)."""

REFUSED = {errno.ECONNREFUSED: "nothing listens on port {port} inside the sandbox"}
"""A connect's errors with words of their own (any other: its own words)."""

_libc = ctypes.CDLL(None, use_errno=True)


class PortClosed(SandboxdError):
    """Nothing listens on the port inside the sandbox (answered ``502``)."""


class PortsUnavailable(SandboxdError):
    """The sandbox has no network namespace of its own: its ports cannot be reached without
    reaching the host's (answered ``409``)."""


def setns_net(fd: int) -> None:
    """Move the calling thread into the network namespace ``fd`` names (``setns(2)``)."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns: {os.strerror(code)}")


def connect_inside(pin: str, port: int, timeout: float = CONNECT_TIMEOUT) -> socket.socket:
    """A TCP socket connected to ``127.0.0.1:port`` in the network namespace pinned at
    ``pin``; run it in a thread that ends after (it stays in that namespace).
    :class:`PortClosed` when nothing listens there."""
    try:
        fd = os.open(pin, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SandboxNotFound("the sandbox's network namespace is gone (killed)") from None
    try:
        setns_net(fd)
    finally:
        os.close(fd)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(("127.0.0.1", port))
    except OSError as e:
        sock.close()
        why = REFUSED.get(e.errno or 0, f"cannot connect to port {{port}} inside the sandbox: {e}")
        raise PortClosed(why.format(port=port)) from None
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


Connector = Callable[[str, int], socket.socket]


def dial(
    reactor: IReactorFromThreads, pin: str, port: int, connect: Connector = connect_inside
) -> Deferred[socket.socket]:
    """Fires with a socket connected to ``port`` inside the namespace pinned at ``pin``,
    made by ``connect`` in a thread of its own (see the module's doc)."""
    done: Deferred[socket.socket] = Deferred()

    def work() -> None:
        try:
            sock = connect(pin, port)
        except BaseException as e:
            reactor.callFromThread(done.errback, e)
        else:
            reactor.callFromThread(done.callback, sock)

    threading.Thread(target=work, name=f"dial-{port}", daemon=True).start()
    return done
