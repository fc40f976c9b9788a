"""The client's endpoints: made once per replica, as twisted.web's Agent makes them."""

from __future__ import annotations

import pytest
from twisted.internet import reactor
from twisted.internet.endpoints import HostnameEndpoint
from twisted.web.client import URI
from twisted.web.error import SchemeNotSupported

from sandboxd_client import _endpoints as endpoints
from sandboxd_client._endpoints import ReusedEndpoints


def test_one_endpoint_per_replica_handed_out_again() -> None:
    made = ReusedEndpoints(reactor, connect_timeout=3.0)
    first = made.endpointForURI(URI.fromBytes(b"http://10.0.0.5:8080/sandboxes/a/exec"))
    assert isinstance(first, HostnameEndpoint)
    assert first._timeout == 3.0
    assert made.endpointForURI(URI.fromBytes(b"http://10.0.0.5:8080/healthz")) is first
    other = made.endpointForURI(URI.fromBytes(b"http://10.0.0.6:8080/healthz"))
    assert other is not first


def test_https_goes_over_tls_and_other_schemes_are_refused() -> None:
    made = ReusedEndpoints(reactor)
    tls = made.endpointForURI(URI.fromBytes(b"https://sandboxd.example:8443/healthz"))
    assert not isinstance(tls, HostnameEndpoint)  # TLS wrapped around it
    assert made.endpointForURI(URI.fromBytes(b"https://sandboxd.example:8443/x")) is tls
    with pytest.raises(SchemeNotSupported):
        made.endpointForURI(URI.fromBytes(b"ftp://sandboxd.example/x"))


def test_the_least_recently_used_replica_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoints, "KEPT", 2)
    made = ReusedEndpoints(reactor)

    def endpoint(host: bytes) -> object:
        return made.endpointForURI(URI.fromBytes(b"http://" + host + b":80/"))

    a, b = endpoint(b"a"), endpoint(b"b")
    assert endpoint(b"a") is a  # a used last: b is the one to go
    endpoint(b"c")
    assert endpoint(b"a") is a
    assert endpoint(b"b") is not b
