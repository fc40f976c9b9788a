"""Fixtures for the client suite: real servers on 127.0.0.1 (port 0) and clients for them."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from attrs import frozen
from twisted.internet import reactor
from twisted.internet.interfaces import IListeningPort
from twisted.web.resource import IResource
from twisted.web.server import Site

sys.path.insert(0, os.path.dirname(__file__))

from client_fakes import FakeSandboxd

from sandboxd_client import HttpSandbox, RetryPolicy

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


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Served]:
    root = tmp_path / "root"
    root.mkdir()
    state = FakeSandboxd(root)
    resource = state.app.resource()
    lb, pod = listen(resource), listen(resource)
    state.pod_url = url_of(pod)
    yield Served(state, url_of(lb), url_of(pod), lb.getHost().port, pod.getHost().port)
    pytest_twisted.blockon(lb.stopListening())
    pytest_twisted.blockon(pod.stopListening())


def make_client(base_url: str, **kwargs: object) -> HttpSandbox:
    kwargs.setdefault("retry", FAST)
    kwargs.setdefault("exec_idle_timeout", 5.0)
    return HttpSandbox(base_url, reactor=reactor, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def client(fake: Served) -> Iterator[HttpSandbox]:
    c = make_client(fake.lb_url)
    yield c
    pytest_twisted.blockon(c.close())


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port
