"""
The endpoints the client connects through, made once per replica.

twisted.web's ``Agent`` makes a new ``HostnameEndpoint`` for every request, and checks its
host's IDNA form each time: a tenth of the client's CPU for a short ``exec``. ``ReusedEndpoints``
makes the same endpoints (TCP for ``http``, TLS over TCP for ``https``, as ``Agent`` does) once
per scheme, host and port, and hands them out again; an endpoint connects as often as asked.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.web.client import URI, BrowserLikePolicyForHTTPS
from twisted.web.error import SchemeNotSupported
from twisted.web.iweb import IAgentEndpointFactory, IPolicyForHTTPS
from zope.interface import implementer

KEPT = 1024
"""Endpoints remembered (one per replica the client talks to), least recently used dropped."""


@implementer(IAgentEndpointFactory)
class ReusedEndpoints:
    """``Agent``'s standard endpoints, one per (scheme, host, port), the last :data:`KEPT`."""

    def __init__(
        self,
        reactor: Any,
        connect_timeout: float | None = None,
        tls: IPolicyForHTTPS | None = None,
    ) -> None:
        self._reactor = reactor
        self._connect_timeout = connect_timeout
        self._tls: IPolicyForHTTPS = tls if tls is not None else BrowserLikePolicyForHTTPS()
        self._endpoints: OrderedDict[tuple[bytes, bytes, int], IStreamClientEndpoint] = (
            OrderedDict()
        )

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        """The endpoint for ``uri``'s replica; ``SchemeNotSupported`` but for http(s)."""
        key = (uri.scheme, uri.host, uri.port)
        endpoint = self._endpoints.get(key)
        if endpoint is not None:
            self._endpoints.move_to_end(key)
            return endpoint
        if uri.scheme not in (b"http", b"https"):
            raise SchemeNotSupported(f"unsupported scheme: {uri.scheme!r}")
        kwargs: dict[str, Any] = {}
        if self._connect_timeout is not None:
            kwargs["timeout"] = self._connect_timeout
        endpoint = HostnameEndpoint(self._reactor, uri.host.decode("ascii"), uri.port, **kwargs)
        if uri.scheme == b"https":
            endpoint = wrapClientTLS(self._tls.creatorForNetloc(uri.host, uri.port), endpoint)
        self._endpoints[key] = endpoint
        if len(self._endpoints) > KEPT:
            self._endpoints.popitem(last=False)
        return endpoint
