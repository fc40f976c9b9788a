"""systemd's service notification protocol (``sd_notify``), for ``Type=notify`` units.

systemd passes ``NOTIFY_SOCKET`` (a unix datagram socket: a path, or ``@name`` in the abstract
namespace) to a ``Type=notify`` service. The daemon sends ``READY=1`` once its HTTP endpoint
listens (so ``systemctl start`` returns only when the API answers) and ``STOPPING=1`` when it
starts draining. Outside systemd (no ``NOTIFY_SOCKET``) every call does nothing.

The protocol is a few newline-separated ``KEY=value`` assignments in one datagram; it needs no
library (see ``sd_notify(3)``).
"""

import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.defer import Deferred, FirstError, gatherResults
from twisted.logger import Logger
from twisted.python.failure import Failure

from sandboxd import _twisted

log = Logger()


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to systemd; False when not run by systemd.

    A send that fails is logged, never raised: notification must not stop the daemon.
    """
    environ = os.environ if environ is None else environ
    address = environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        log.warn("sd_notify: ignoring NOTIFY_SOCKET={address!r}", address=address)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode("utf-8"))
    except OSError as e:
        log.warn("sd_notify: cannot send {state!r}: {error}", state=state, error=e)
        return False
    return True


def listening(services: Iterable[Any]) -> "Deferred[None]":
    """Fires once every ``StreamServerEndpointService`` among ``services`` listens.

    Errbacks if one of them failed to listen.
    """
    waits: list[Deferred[Any]] = []
    for service in services:
        if isinstance(service, StreamServerEndpointService):
            waiting = _twisted.waiting_for_port(service)
            if waiting is not None:
                # Chain a fresh Deferred so the service's own result is left untouched.
                mine: Deferred[Any] = Deferred()
                waiting.addBoth(_relay, mine)
                waits.append(mine)
    return gatherResults(waits, consumeErrors=True).addCallback(lambda _: None)


def _relay(result: Any, target: "Deferred[Any]") -> Any:
    # The service logs a failed listen itself and leaves None in place of the port.
    if isinstance(result, Failure):
        target.errback(result)
    elif result is None:
        target.errback(RuntimeError("the endpoint failed to listen (see the log above)"))
    else:
        target.callback(None)
    return result


def ready_when_listening(services: Iterable[Any], environ: Mapping[str, str] | None = None) -> None:
    """Send ``READY=1`` once the HTTP endpoint listens; log (and send nothing) if it cannot."""

    def ready(_: object) -> None:
        notify("READY=1\nSTATUS=listening", environ)

    def failed(failure: Failure) -> None:
        if isinstance(failure.value, FirstError):
            failure = failure.value.subFailure
        log.failure("not ready: the endpoint did not start listening", failure)
        notify(f"STATUS=listen failed: {failure.getErrorMessage()}", environ)

    listening(services).addCallbacks(ready, failed)


def stopping(environ: Mapping[str, str] | None = None) -> None:
    """Tell systemd the daemon is draining and will exit."""
    notify("STOPPING=1\nSTATUS=draining", environ)
