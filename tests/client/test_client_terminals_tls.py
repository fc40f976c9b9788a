"""A terminal's WebSocket over TLS (``wss``), verified as the client's HTTP calls are: against
the operator's CA named by ``ca_file`` (``--cacert``), so ``sandboxctl shell`` reaches a daemon
on ``ssl:``; a client trusting another CA never completes the handshake, so no token is sent
(docs/client.rst; docs/extensions.rst, "Terminals")."""

from __future__ import annotations

import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from sandboxd_client import HttpSandbox
from tests.security.live_daemon import new_token, write_token
from tests.security.test_tls import make_ca
from tests.support.daemon import (
    SHARED_ROOTS,
    daemon_argv,
    daemon_environ,
    free_port,
    reachable_root,
    unisolated_uids,
)

pytestmark = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v openssl"], capture_output=True).returncode != 0,
    reason="needs openssl to make the certificates",
)
WAIT_TURNS = 3000


@pytest.fixture(scope="module")
def tls_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """A daemon on ``ssl:`` with a certificate of the operator's CA: (url, token, the CA)."""
    base = tmp_path_factory.mktemp("tls")
    ca, key, cert = make_ca(base / "operator", "operator")
    token, port = new_token(), free_port()
    root = reachable_root(base)  # the sandboxes' uids pass through every directory above it
    argv = daemon_argv(
        f"--listen=ssl:{port}:interface=127.0.0.1:privateKey={key}:certKey={cert}",
        f"--root={root}",
        "--isolation=none",
        *unisolated_uids(["--isolation=none"]),
        f"--token-file={write_token(base / 'token', token)}",
    )
    log = base / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=daemon_environ({})
        )
    url = f"https://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=str(ca))
    try:
        for _ in range(600):
            assert process.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(url + "/healthz", context=context, timeout=5):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError(log.read_text())
        yield url, token, ca
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if root.parent == SHARED_ROOTS:
            shutil.rmtree(root, ignore_errors=True)


async def turn() -> None:
    await deferLater(reactor, 0.01, lambda: None)


@pytest_twisted.ensureDeferred
async def test_a_terminal_over_wss_trusting_the_operators_ca(
    tls_daemon: tuple[str, str, Path],
) -> None:
    url, token, ca = tls_daemon
    client = HttpSandbox(url, token=token, reactor=reactor, ca_file=str(ca))
    try:
        handle = await client.create()
        started = await client.start_terminal(handle, ["sh"])
        seen: list[bytes] = []
        connection = client.attach_terminal(handle, started.id, seen.append)
        connection.type(b"echo over-$((20+22))-tls; exit 4\n")
        for _ in range(WAIT_TURNS):
            if connection.ended.called:
                break
            await turn()
        code = await connection.ended
        assert (code, b"over-42-tls" in b"".join(seen)) == (4, True), b"".join(seen)
    finally:
        await client.close()


@pytest.mark.parametrize("trust", ["another CA", "the system's"])
@pytest_twisted.ensureDeferred
async def test_a_client_trusting_another_ca_never_attaches(
    tls_daemon: tuple[str, str, Path], tmp_path: Path, trust: str
) -> None:
    url, token, ca = tls_daemon
    trusted = HttpSandbox(url, token=token, reactor=reactor, ca_file=str(ca))
    other_ca = make_ca(tmp_path / "other", "other")[0] if trust == "another CA" else None
    wary = HttpSandbox(
        url, token=token, reactor=reactor, ca_file=None if other_ca is None else str(other_ca)
    )
    try:
        handle = await trusted.create()
        started = await trusted.start_terminal(handle, ["sh"])
        seen: list[bytes] = []
        connection = wary.attach_terminal(handle, started.id, seen.append)
        connection.type(b"echo never-typed\n")
        for _ in range(WAIT_TURNS):
            if connection.ended.called:
                break
            await turn()
        # The TLS handshake failed: the socket closed before it opened, nothing was typed
        assert await connection.ended is None and seen == []
        check = trusted.attach_terminal(handle, started.id, seen.append)
        for _ in range(WAIT_TURNS):
            if b"$" in b"".join(seen):
                break
            await turn()
        check.close()
        assert b"never-typed" not in b"".join(seen)
    finally:
        await trusted.close()
        await wary.close()
