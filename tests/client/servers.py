"""Real servers on 127.0.0.1 (port 0) for the client suite, and clients for them."""

from __future__ import annotations

from attrs import frozen
from twisted.internet import reactor
from twisted.internet.interfaces import IListeningPort
from twisted.web.resource import IResource
from twisted.web.server import Site

from sandboxd_client import HttpSandbox, RetryPolicy

from .client_fakes import FakeSandboxd

# Small deadlines keep the stall tests fast; the counts they check do not depend on timing.
FAST = RetryPolicy(
    attempts=3, timeout=0.2, timeout_growth=1.5, max_timeout=0.3, backoff=0.01, max_backoff=0.02
)


def url_of(port: IListeningPort) -> str:
    return f"http://127.0.0.1:{port.getHost().port}"  # type: ignore[attr-defined]


def listen(resource: IResource) -> IListeningPort:
    """Serve ``resource`` on 127.0.0.1, on a free port."""
    return reactor.listenTCP(0, Site(resource), interface="127.0.0.1")  # type: ignore[attr-defined]


@frozen
class Served:
    """The contract fake behind two addresses: a "load balancer" and the replica's own."""

    state: FakeSandboxd
    lb_url: str
    pod_url: str
    lb_port: int
    pod_port: int


def make_client(base_url: str, **kwargs: object) -> HttpSandbox:
    kwargs.setdefault("retry", FAST)
    kwargs.setdefault("exec_idle_timeout", 5.0)
    return HttpSandbox(base_url, reactor=reactor, **kwargs)  # type: ignore[arg-type]
