"""TLS keeps the token from a squatter (docs/operating.rst, *Who holds the port*): the daemon
listens on Twisted's ``ssl:`` endpoint with its own key, and a client that verifies the server
(``sandboxd_client`` with an agent trusting the operator's CA) talks to it; the same client
pointed at a squatter that holds the port with any other certificate fails the handshake and
never sends the token. Without verification (the attack succeeding) the squatter reads it."""

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet import ssl as twisted_ssl
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS

from sandboxd_client import HttpSandbox, SandboxError
from tests.security.live_daemon import new_token, write_token
from tests.support.coverage import coverage_env
from tests.support.daemon import REPO, daemon_argv, daemon_environ, free_port, unisolated_uids

pytestmark = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v openssl"], capture_output=True).returncode != 0,
    reason="needs openssl to make the certificates",
)


def make_ca(where: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA and a server certificate it signed for 127.0.0.1: (ca.pem, key.pem, cert.pem)."""
    where.mkdir()

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            f"/CN={name} CA", "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "key.pem", "-out", "server.csr")  # fmt: skip
    (where / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "cert.pem")  # fmt: skip
    return where / "ca.pem", where / "key.pem", where / "cert.pem"


@pytest.fixture
def tls_daemon(tmp_path: Path) -> Iterator[tuple[int, str, Path]]:
    """A daemon on ``ssl:`` with the operator's certificate: (port, token, the CA)."""
    ca, key, cert = make_ca(tmp_path / "operator", "operator")
    token = new_token()
    port = free_port()
    env = daemon_environ({"SANDBOXD_DRAIN_IDLE": "0s"})
    argv = daemon_argv(f"--listen=ssl:{port}:interface=127.0.0.1:privateKey={key}:certKey={cert}",
                       f"--root={tmp_path / 'root'}", "--isolation=none",
                       *unisolated_uids(["--isolation=none"]),
                       f"--token-file={write_token(tmp_path / 'token', token)}")  # fmt: skip
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    context = ssl.create_default_context(cafile=str(ca))
    try:
        for _ in range(600):
            assert process.poll() is None, log.read_text()
            try:
                url = f"https://127.0.0.1:{port}/healthz"
                with urllib.request.urlopen(url, context=context, timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError(log.read_text())
        yield port, token, ca
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Squatter:
    """A TLS server on a port with a certificate of its own that records what it is sent."""

    def __init__(self, tmp_path: Path) -> None:
        self.ca, key, cert = make_ca(tmp_path / "squatter", "squatter")
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(30)
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            try:
                with self.context.wrap_socket(raw, server_side=True) as conn:
                    conn.settimeout(5)
                    self.received += conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 503 x\r\ncontent-length: 0\r\n\r\n")
            except (OSError, ssl.SSLError):
                continue

    def close(self) -> None:
        self.listener.close()


def verifying_agent(ca: Path) -> Agent:
    trusted = twisted_ssl.Certificate.loadPEM(ca.read_bytes())
    return Agent(reactor, contextFactory=BrowserLikePolicyForHTTPS(trustRoot=trusted))


def client_trusting(url: str, token: str, ca: Path, trust: str) -> HttpSandbox:
    """A client of ``url`` that verifies its server against ``ca``: through an ``Agent`` built
    by hand, or by naming the file (``ca_file``)."""
    if trust == "agent":
        return HttpSandbox(url, token=token, agent=verifying_agent(ca))
    return HttpSandbox(url, token=token, ca_file=str(ca))


TRUSTS = pytest.mark.parametrize("trust", ["agent", "ca_file"])


@TRUSTS
@pytest_twisted.ensureDeferred
async def test_a_verifying_client_talks_to_the_daemon(
    tls_daemon: tuple[int, str, Path], trust: str
) -> None:
    port, token, ca = tls_daemon
    client = client_trusting(f"https://127.0.0.1:{port}", token, ca, trust)
    handle = await client.create()
    result = await client.exec(handle, ["echo", "over tls"])
    assert (result.exit_code, result.stdout) == (0, b"over tls\n")
    await client.kill(handle)
    await client.close()


@TRUSTS
@pytest.mark.parametrize("verify", [True, False], ids=["verified", "unverified"])
@pytest_twisted.ensureDeferred
async def test_a_squatter_gets_no_token_from_a_verifying_client(
    tls_daemon: tuple[int, str, Path], tmp_path: Path, verify: bool, trust: str
) -> None:
    _, token, ca = tls_daemon
    squatter = Squatter(tmp_path)
    # Unverified, the attack succeeding: a client that trusts what the squatter presents.
    trusted = ca if verify else squatter.ca
    client = client_trusting(f"https://127.0.0.1:{squatter.port}", token, trusted, trust)
    try:
        # Verified: the handshake fails, nothing is sent. Unverified: the squatter's 503.
        with pytest.raises(SandboxError, match="TLS failure" if verify else None):
            await client.create()
    finally:
        squatter.close()
        squatter.thread.join(10)
        await client.close()
    assert (token.encode() in squatter.received) is not verify


def test_a_ca_file_without_a_certificate_is_refused_by_name(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_text("no certificate here\n")
    with pytest.raises(ValueError, match=f"no PEM certificate in the CA file {empty}"):
        HttpSandbox("https://127.0.0.1:1", ca_file=str(empty))


def test_sandboxctl_verifies_against_cacert_or_sandboxd_ca_file(
    tls_daemon: tuple[int, str, Path], tmp_path: Path
) -> None:
    port, token, ca = tls_daemon
    token_file = write_token(tmp_path / "client-token", token)
    env = {
        **coverage_env(),
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "SANDBOXD_URL": f"https://127.0.0.1:{port}",
        "SANDBOXD_TOKEN_FILE": str(token_file),
    }

    def ctl(*argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandboxd_client.cli", *argv],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    assert ctl("--cacert", str(ca), "list").returncode == 0
    assert ctl("list", SANDBOXD_CA_FILE=str(ca)).returncode == 0
    refused = ctl("list")  # the system's authorities know nothing of the operator's CA
    assert refused.returncode == 1 and "TLS failure" in refused.stderr, refused.stderr
