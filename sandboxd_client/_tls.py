"""Trusting a certificate authority of the operator's (``ca_file``, ``--cacert``).

A daemon on ``ssl:`` usually carries a certificate of the operator's own CA, not one a public
authority signed: the client then verifies the daemon against that CA alone, as ``curl
--cacert`` does, and never sends its token to a server that shows another certificate.
"""

from __future__ import annotations

import re

from twisted.web.client import BrowserLikePolicyForHTTPS
from twisted.web.iweb import IPolicyForHTTPS

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def trusting(ca_file: str) -> IPolicyForHTTPS:
    """The TLS policy trusting only the certificates in the PEM file ``ca_file`` (a bundle may
    hold several); ``OSError`` when it cannot be read, ``ValueError`` when it holds none.
    Needs pyOpenSSL (``Twisted[tls]``), as every ``https`` URL does."""
    from twisted.internet import ssl  # imports OpenSSL: only when a CA is named

    with open(ca_file, "rb") as f:
        pem = f.read()
    certificates = [ssl.Certificate.loadPEM(block) for block in _PEM.findall(pem)]
    if not certificates:
        raise ValueError(f"no PEM certificate in the CA file {ca_file}")
    return BrowserLikePolicyForHTTPS(trustRoot=ssl.trustRootFromCertificates(certificates))
