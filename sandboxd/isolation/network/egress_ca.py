"""The daemon's certificate authority for header rules over HTTPS (docs/isolation.rst,
"Header rules over HTTPS"; docs/operating.rst, "The egress network mode").

The egress proxy terminates the TLS of a connection whose name has a header rule, so it shows
the sandbox a certificate for that name: a leaf this CA signs. The CA is made at the daemon's
first start, into ``{root}/.egress-ca/`` (a directory of root's alone, mode 0700: no sandbox
uid can enter it), its key in ``key.pem`` (mode 0600) and its certificate in ``cert.pem``,
and read again at each later start (delete the directory and restart to rotate it). Only
sandboxes whose policy has a rule trust it (the certificate, never the key, is added to the
CA bundle they see).

Leaves are made on demand per name (the SNI the sandbox sent), its only subject alternative
name, valid :data:`LEAF_SECONDS` from the clock's now and made anew past half of that; one key
made at start, in memory only, serves them all. At most ``leaves_max`` names are kept (the
least lately used goes first), so no tenant can make the daemon hold unbounded memory.
"""

import datetime
import os
from collections import OrderedDict
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from twisted.internet.ssl import CertificateOptions

CA_DIR = ".egress-ca"
KEY_FILE = "key.pem"
CERT_FILE = "cert.pem"
"""Where the CA lives in the state root, and its two files."""

CA_DAYS = 3650
"""How long a CA made at start is valid (days)."""

LEAF_SECONDS = 86400.0
"""How long a leaf is valid from when it is made (seconds)."""

LEAVES_MAX = 256
"""The most names whose leaf and TLS context are kept (their memory: docs/performance.rst,
"Egress by name")."""

ALPN = [b"http/1.1"]
"""The one protocol offered on either side (the request rewriter speaks HTTP/1.1)."""


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _when(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC)


def make_ca(now: float) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new CA key and its self-signed certificate, valid :data:`CA_DAYS` from ``now``."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("sandboxd egress CA"))
        .issuer_name(_name("sandboxd egress CA"))
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(_when(now - 3600))
        .not_valid_after(_when(now + CA_DAYS * 86400))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _write(path: str, data: bytes, mode: int) -> None:
    """``data`` into ``path`` whole or not at all (a temporary file renamed)."""
    temporary = path + ".new"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, path)


def load_or_make(root: str, now: float) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The CA of the state root ``root``: read from ``{root}/.egress-ca/``, or made there when
    either file is missing (the key written last: a CA is read only once whole)."""
    directory = os.path.join(root, CA_DIR)
    os.makedirs(directory, 0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    key_path, cert_path = os.path.join(directory, KEY_FILE), os.path.join(directory, CERT_FILE)
    if os.path.exists(key_path) and os.path.exists(cert_path):
        with open(key_path, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), None)
        with open(cert_path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path}: not the EC key of an egress CA this daemon made")
        return key, cert
    key, cert = make_ca(now)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write(key_path, pem, 0o600)
    return key, cert


class EgressCA:
    """Leaves for names, signed by the CA ``key`` and ``cert``, on ``clock``'s time (see
    the module)."""

    def __init__(
        self,
        key: ec.EllipticCurvePrivateKey,
        cert: x509.Certificate,
        clock: Any,
        leaves_max: int = LEAVES_MAX,
    ) -> None:
        self.key = key
        self.cert = cert
        self.clock = clock
        self.leaves_max = leaves_max
        self.leaf_key = ec.generate_private_key(ec.SECP256R1())
        self.leaves: OrderedDict[str, tuple[float, CertificateOptions]] = OrderedDict()
        """Each name's server options and when they are made anew, least lately used first."""

    @classmethod
    def of_root(cls, root: str, clock: Any) -> "EgressCA":
        """The CA of the state root ``root`` (:func:`load_or_make`)."""
        return cls(*load_or_make(root, clock.seconds()), clock)

    @property
    def pem(self) -> bytes:
        """The CA's certificate (what a sandbox with a rule trusts)."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def options_for(self, name: str) -> CertificateOptions:
        """The server side of a TLS connection to ``name``: its leaf, ALPN ``http/1.1``."""
        now = self.clock.seconds()
        found = self.leaves.get(name)
        if found is not None and now < found[0]:
            self.leaves.move_to_end(name)
            return found[1]
        options = CertificateOptions(
            # (pyOpenSSL takes cryptography's objects: its own are deprecated)
            privateKey=cast(Any, self.leaf_key),
            certificate=cast(Any, self.leaf(name, now)),
            acceptableProtocols=ALPN,
        )
        self.leaves[name] = (now + LEAF_SECONDS / 2, options)
        self.leaves.move_to_end(name)
        while len(self.leaves) > self.leaves_max:
            self.leaves.popitem(last=False)
        return options

    def leaf(self, name: str, now: float) -> x509.Certificate:
        """A certificate for ``name`` alone, valid :data:`LEAF_SECONDS` from ``now``."""
        public = self.leaf_key.public_key()
        ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        return (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self.cert.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(_when(now - 300))
            .not_valid_after(_when(now + LEAF_SECONDS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, False, False, False, False),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
