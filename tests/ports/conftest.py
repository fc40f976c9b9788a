"""Real daemons under real isolation (root), each sandbox in its own network namespace, and
the server of :mod:`tests.ports.upstream` run inside a sandbox."""

import http.client
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.security.live_daemon import call, create, new_token, start_daemon, stop_daemon
from tests.support.uids import uid_block

SHARED = Path("/tmp/sandboxd-tests")
UPSTREAM = Path(__file__).with_name("upstream.py")


class Live:
    """A daemon, its token, and helpers to reach its sandboxes' ports."""

    def __init__(self, daemon: Any, token: str) -> None:
        self.daemon = daemon
        self.token = token

    def api(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> Any:
        return call(self.daemon, method, path, body=body, raw=raw, token=self.token)

    def sandbox_with_server(self, port: int = 8000) -> str:
        """A new sandbox whose :mod:`tests.ports.upstream` server listens on ``port``."""
        rid = create(self.daemon, self.token)
        put = self.api("PUT", f"/sandboxes/{rid}/file?path=upstream.py", raw=UPSTREAM.read_bytes())
        assert put.status == 204, put
        started = self.api(
            "POST", f"/sandboxes/{rid}/processes", {"cmd": ["python3", "upstream.py", str(port)]}
        )
        assert started.status == 200, started
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, _, _ = self.get(f"/sandboxes/{rid}/ports/{port}/headers")
            if status == 200:
                return rid
            time.sleep(0.1)
        raise AssertionError("the server in the sandbox never answered through the proxy")

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=30)

    def get(
        self, path: str, token: bool = True, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = self.connection()
        sent = dict(headers or {})
        if token:
            sent["authorization"] = f"Bearer {self.token}"
        try:
            conn.request("GET", path, headers=sent)
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def json_of(self, path: str) -> Any:
        status, _, body = self.get(path)
        assert status == 200, body
        return json.loads(body)


@pytest.fixture
def scratch() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("real isolation needs root")
    SHARED.mkdir(mode=0o711, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="ports-", dir=SHARED))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def live_daemon(
    tmp_path: Path, scratch: Path, *args: str, env: dict[str, str] | None = None
) -> Any:
    token = new_token()
    token_file = scratch / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    low, high = uid_block()
    try:
        daemon = start_daemon(
            tmp_path,
            "--isolation=auto",
            f"--uid-min={low}",
            f"--uid-max={high}",
            f"--token-file={token_file}",
            *args,
            env=env,
        )
    except AssertionError as e:
        pytest.skip(f"the daemon cannot isolate here: {str(e).strip().splitlines()[-1]}")
    return Live(daemon, token)


@pytest.fixture
def live(tmp_path: Path, scratch: Path) -> Iterator[Live]:
    """A daemon under real isolation whose sandboxes may hold 3 proxied connections each."""
    running = live_daemon(tmp_path, scratch, env={"SANDBOXD_PORT_CONNECTIONS_MAX": "3"})
    try:
        yield running
    finally:
        stop_daemon(running.daemon)
