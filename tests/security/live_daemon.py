"""Real daemons over real TCP for the security and contract tests.

The daemon itself is started by ``start_daemon`` of ``tests.support.daemon`` (a
``twistd -n sandboxd`` subprocess on a free 127.0.0.1 port). This module
adds what these tests need around it: a bearer token file, raw HTTP requests with headers and
any path bytes, the OpenAPI routes, and a snapshot of everything a request could change.
"""

import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from http.client import HTTPConnection, HTTPResponse
from pathlib import Path
from typing import Any

import yaml

from tests.support import daemon as process  # its free_port is patched by the tests

REPO = Path(__file__).resolve().parents[2]
OPENAPI = REPO / "docs" / "openapi.yaml"
PUBLIC = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/sandboxes/{rid}/terminal")}
"""The only operations served without the token."""

PENDING: dict[tuple[str, str], str] = {}
"""Documented operations not served yet, each with its reason (e.g. ``{("POST",
"/tools/resolve"): "issue 6"}``): they are expected to answer a routing ``404``, and the
contract tests fail once one is served, so that its entry gets removed here."""


Daemon = process.Daemon
stop_daemon = process.stop_daemon


def start_daemon(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    """``tests/process``' ``start_daemon`` (a ``twistd -n sandboxd`` on 127.0.0.1)."""
    return process.start_daemon(tmp_path, *args, env=env)


@contextlib.contextmanager
def running(tmp_path: Path, *args: str) -> Iterator[Any]:
    daemon = start_daemon(tmp_path, *args)
    try:
        yield daemon
    finally:
        stop_daemon(daemon)


@contextlib.contextmanager
def listening_on_all_interfaces() -> Iterator[int]:
    """Make the next ``start_daemon`` listen on every interface (its port is yielded)."""
    port = process.free_port()
    saved = process.free_port
    process.free_port = lambda: port
    try:
        yield port
    finally:
        process.free_port = saved


def new_token() -> str:
    return "sbx-" + secrets.token_urlsafe(32)


def write_token(path: Path, token: str, mode: int = 0o600) -> Path:
    path.write_text(token + "\n")
    path.chmod(mode)
    return path


def twistd_argv(tmp_path: Path, *args: str) -> list[str]:
    """The argv ``start_daemon`` runs, for daemons that are expected not to start."""
    return process.daemon_argv(
        f"--listen=tcp:{process.free_port()}:interface=127.0.0.1",
        f"--root={tmp_path / 'root'}",
        *args,
    )


def daemon_env() -> dict[str, str]:
    return process.daemon_environ()


def refused_start(tmp_path: Path, *args: str, user: int | None = None) -> tuple[int, str]:
    """Run a daemon that must refuse to start; its exit status and its output."""
    result = subprocess.run(
        twistd_argv(tmp_path, *args),
        env=daemon_env(),
        capture_output=True,
        text=True,
        timeout=120,
        user=user,
        group=None if user is None else user,
        extra_groups=None if user is None else [],
        cwd=tmp_path,
    )
    return result.returncode, result.stdout + result.stderr


class Reply:
    def __init__(self, response: HTTPResponse, body: bytes) -> None:
        self.status = response.status
        self.headers = response.headers
        self.body = body

    @property
    def content_type(self) -> str:
        return (self.headers.get("content-type") or "").split(";")[0].strip()

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self) -> str:
        """The ``error`` type of a JSON error body."""
        assert self.content_type == "application/json", (self.status, self.body[:300])
        body = self.json()
        assert set(body) == {"error", "detail"}, body
        return str(body["error"])

    def __repr__(self) -> str:
        return f"<Reply {self.status} {self.body[:200]!r}>"


def call(
    base: Any,
    method: str,
    target: str,
    body: Any = None,
    *,
    raw: Any = None,
    token: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 120,
) -> Reply:
    """One HTTP request; ``target`` is sent as is (any percent-encoding, any query)."""
    port = base if isinstance(base, int) else base.port
    host = "127.0.0.1"
    if isinstance(base, tuple):
        host, port = base
    connection = HTTPConnection(host, port, timeout=timeout)
    sent_headers = dict(headers or {})
    if token is not None:
        sent_headers["Authorization"] = f"Bearer {token}"
    data = raw
    if data is None and body is not None:
        data = json.dumps(body).encode()
        sent_headers.setdefault("Content-Type", "application/json")
    try:
        connection.request(method, target, body=data, headers=sent_headers)
        response = connection.getresponse()
        return Reply(response, response.read())
    finally:
        connection.close()


def create(daemon: Any, token: str | None = None, body: Any = None) -> str:
    reply = call(daemon, "POST", "/sandboxes", body or {}, token=token)
    assert reply.status == 200, reply
    return str(reply.json()["remote_id"])


def exec_frames(
    daemon: Any, rid: str, body: Any, token: str | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """Run one exec; the status and every NDJSON frame."""
    reply = call(daemon, "POST", f"/sandboxes/{rid}/exec", body, token=token)
    if reply.status != 200:
        return reply.status, [reply.json()]
    assert reply.content_type == "application/x-ndjson", reply.headers
    return 200, [json.loads(line) for line in reply.body.splitlines()]


def load_openapi() -> dict[str, Any]:
    with open(OPENAPI, encoding="utf-8") as f:
        document = yaml.safe_load(f)
    assert isinstance(document, dict)
    return document


HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def documented_operations(document: dict[str, Any] | None = None) -> set[tuple[str, str]]:
    """``(METHOD, /path/{param})`` of every operation in ``docs/openapi.yaml``."""
    document = document or load_openapi()
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def served_operations() -> set[tuple[str, str]]:
    """``(METHOD, /path/{param})`` of every rule of the Klein app (HEAD and OPTIONS, which
    werkzeug adds by itself, left out)."""
    from sandboxd.http.api import SandboxAPI

    served = set()
    for rule in SandboxAPI.app.url_map.iter_rules():
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)  # <rid:rid> is {rid}
        for method in rule.methods or ():
            if method not in ("HEAD", "OPTIONS"):
                served.add((method, path))
    return served


def fill(path: str, rid: str, query_path: str = "f") -> str:
    """A request target for a documented path: ``{rid}`` filled, required query given."""
    target = path.replace("{rid}", rid)
    if path.endswith(("/file", "/exists", "/size", "/dir")):
        target += f"?path={query_path}"
    return target


def snapshot(daemon: Any, token: str | None) -> dict[str, Any]:
    """Everything a request could change: live sandboxes (with their ready marks), health,
    and every file and directory under the daemon's root, with sizes and contents' hashes."""
    listing = call(daemon, "GET", "/sandboxes", token=token)
    assert listing.status == 200, listing
    sandboxes = sorted(
        (s["remote_id"], s["ready"], s["execs"]) for s in listing.json()["sandboxes"]
    )
    health = call(daemon, "GET", "/healthz").json()["status"]
    tree = {}
    for top, dirs, files in os.walk(daemon.root):
        for name in dirs + files:
            full = os.path.join(top, name)
            st = os.lstat(full)
            content = None
            if os.path.isfile(full) and not os.path.islink(full):
                content = Path(full).read_bytes()
            tree[os.path.relpath(full, daemon.root)] = (st.st_mode, st.st_size, content)
    return {"sandboxes": sandboxes, "health": health, "tree": tree}


def own_address() -> str:
    """This machine's own non-loopback address (what a pod's IP is), else skip."""
    import pytest

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent for a UDP connect
            address = str(s.getsockname()[0])
        except OSError:
            address = ""
    if not address or address.startswith("127."):
        pytest.skip("no non-loopback IPv4 address on this machine")
    return address


def trickle_headers(port: int, line: bytes, timeout_off: bool) -> tuple[socket.socket, bool]:
    """Open a connection and send ``line``, then a header byte every 0.5 s (for 6 s when no
    header timeout is set, else up to 30 s): the socket, and whether the daemon cut it."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(line + b"\r\n")
    for _ in range(12 if timeout_off else 60):  # 3 and 15 times a 2 s timeout
        time.sleep(0.5)
        try:
            s.sendall(b"x")
        except OSError:
            return s, True
    return s, False
