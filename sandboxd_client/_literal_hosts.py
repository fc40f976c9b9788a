"""
IPv6 literal hosts through treq.

treq turns every URL into a URI with hyperlink's ``to_uri()``, which IDNA-encodes the host and
fails on an IPv6 literal (``http://[fd00::5]:8080``; hyperlink issues #68 and #188, open). A pod
on an IPv6 or dual-stack Kubernetes cluster has exactly such a ``pod_url``. So before handing a
URL to treq we replace an IPv6 host with a stand-in DNS name that spells its bytes in hex
(``v6-<hex>.ipv6.invalid``, split into DNS-sized labels), and ``LiteralHostAgent``, the agent
under treq, turns the stand-in back into ``[addr]`` before Twisted's Agent sees the URI (so the
connection and the ``Host`` header use the real address).
"""

from __future__ import annotations

import re

from hyperlink import DecodedURL
from twisted.internet.defer import Deferred
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IBodyProducer, IResponse
from zope.interface import implementer

SUFFIX = ".ipv6.invalid"
_STANDIN = re.compile(rb"^(https?://)v6-([0-9a-f.]+)\.ipv6\.invalid(?=[:/?]|$)")


def standin_url(url: DecodedURL) -> DecodedURL:
    """``url`` with an IPv6 literal host replaced by its stand-in name; others unchanged.

    The test reads the encoded host: ``DecodedURL.host`` decodes it from IDNA every time
    (a tenth of the client's CPU per call), and no IDNA form holds a colon.
    """
    if ":" not in url.encoded_url.host:
        return url
    hexed = url.host.encode("utf-8").hex()
    labels = [hexed[i : i + 60] for i in range(0, len(hexed), 60)]
    return url.replace(host="v6-" + ".".join(labels) + SUFFIX)


def literal_uri(uri: bytes) -> bytes:
    """Undo ``standin_url`` on an encoded URI (bytes); other URIs are returned unchanged."""
    match = _STANDIN.match(uri)
    if match is None:
        return uri
    host = bytes.fromhex(match.group(2).replace(b".", b"").decode("ascii"))
    return match.group(1) + b"[" + host + b"]" + uri[match.end() :]


@implementer(IAgent)
class LiteralHostAgent:
    """An ``IAgent`` that restores IPv6 literal hosts, then delegates to ``agent``."""

    def __init__(self, agent: IAgent) -> None:
        self._agent = agent

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[IResponse]:
        return self._agent.request(method, literal_uri(uri), headers, bodyProducer)
