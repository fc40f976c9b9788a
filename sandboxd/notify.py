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
from collections.abc import Mapping

from twisted.logger import Logger

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


def stopping(environ: Mapping[str, str] | None = None) -> None:
    """Tell systemd the daemon is draining and will exit."""
    notify("STOPPING=1\nSTATUS=draining", environ)
