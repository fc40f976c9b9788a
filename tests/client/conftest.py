"""Fixtures for the client suite: real servers on 127.0.0.1 (port 0) and clients for them."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted

from sandboxd_client import HttpSandbox

from .client_fakes import FakeSandboxd
from .servers import Served, listen, make_client, url_of


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
