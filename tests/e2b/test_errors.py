"""Bad input to the E2B front, straight over HTTP (and through the SDK where it can say it):
each gets the error the SDK maps, and nothing runs."""

import base64
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from e2b import Sandbox

from tests.e2b.conftest import TOKEN, E2BDaemon


def call(
    front: E2BDaemon,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(
        front.url + path, data=body, method=method, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            data, status, got = response.read(), response.status, dict(response.headers)
    except urllib.error.HTTPError as e:
        data, status, got = e.read(), e.code, dict(e.headers)
    try:
        return status, got, json.loads(data) if data else None
    except ValueError:
        return status, got, data


def envd(sbx: Sandbox, **more: str) -> dict[str, str]:
    return {
        "E2b-Sandbox-Id": sbx.sandbox_id,
        "X-Access-Token": sbx._envd_access_token or "",
        "Content-Type": "application/json",
        **more,
    }


def rpc(front: E2BDaemon, sbx: Sandbox, name: str, message: Any, **more: str) -> Any:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return call(front, "POST", "/" + name, body, envd(sbx, **more))


def stream_error(status: int, headers: dict[str, str], body: bytes) -> Any:
    """The error a streaming call ended with at once: HTTP 200, one end-of-stream envelope
    (as Connect servers answer, and both SDKs read)."""
    assert status == 200 and headers["Content-Type"] == "application/connect+json"
    assert body[0] == 0x02 and int.from_bytes(body[1:5], "big") == len(body) - 5
    return json.loads(body[5:])["error"]


def api(front: E2BDaemon, method: str, path: str, body: Any = None) -> Any:
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    return call(front, method, path, data, {"X-API-Key": TOKEN, "Content-Type": "application/json"})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "not JSON"),
        ({"timeout": "soon"}, "timeout"),
        ({"autoPause": True}, "autoPause"),
        ({"metadata": {"a": 1}}, "metadata"),
        ({"envVars": {"A=B": "x"}}, "not a valid variable name"),
    ],
)
def test_bad_creates(e2b_daemon: E2BDaemon, body: Any, message: str) -> None:
    status, _, answer = api(e2b_daemon, "POST", "/v2/sandboxes", body)
    assert status == 400 and message in answer["message"] and answer["code"] == 400


def test_control_plane_errors(e2b_daemon: E2BDaemon) -> None:
    assert api(e2b_daemon, "GET", "/sandboxes/nope")[0] == 404
    assert api(e2b_daemon, "GET", "/v2/sandboxes?nextToken=x")[0] == 400
    assert api(e2b_daemon, "PATCH", "/v2/sandboxes")[0] == 405
    status, _, _answer = api(e2b_daemon, "GET", "/sandboxes/metrics")
    assert status in (404, 501)
    assert call(e2b_daemon, "GET", "/v2/sandboxes")[0] == 401  # no key at all


def test_envd_errors(e2b_daemon: E2BDaemon) -> None:
    sbx = Sandbox.create(timeout=60)
    try:
        front = e2b_daemon
        assert api(front, "POST", f"/sandboxes/{sbx.sandbox_id}/timeout", {})[0] == 400
        assert call(front, "GET", "/health")[0] == 400  # no sandbox id
        status, _, answer = rpc(front, sbx, "process.Process/Nope", {})
        assert (status, answer["code"]) == (501, "unimplemented")
        status, _, answer = rpc(front, sbx, "process.Process/List", {}, Authorization="Basic !!")
        assert (status, answer["code"]) == (401, "unauthenticated")
        root = "Basic " + base64.b64encode(b"root:").decode()
        status, _, answer = rpc(front, sbx, "process.Process/List", {}, Authorization=root)
        assert answer["code"] == "permission_denied"
        for message, expected in (
            ({"process": {"cmd": 3}}, "cmd"),
            ({"process": {"cmd": "x", "args": [1]}}, "args"),
            ({"process": {"cmd": "x", "envs": {"": "x"}}}, "envs"),
            ({"process": {"cmd": "x"}, "tag": 5}, "tag"),
            ({"process": {"cmd": "x"}, "pty": {"size": {"rows": 0, "cols": 1}}}, "pty.size"),
        ):
            envelope = json.dumps(message).encode()
            framed = b"\x00" + len(envelope).to_bytes(4, "big") + envelope
            answer = stream_error(
                *rpc(
                    front,
                    sbx,
                    "process.Process/Start",
                    framed,
                    **{"Content-Type": "application/connect+json"},
                )
            )
            assert expected in answer["message"], answer
        answer = stream_error(
            *rpc(front, sbx, "process.Process/Start", b"", **{"Connect-Timeout-Ms": "soon"})
        )
        assert answer["code"] == "invalid_argument"
        unaries: list[tuple[str, dict[str, Any]]] = [
            ("process.Process/SendSignal", {"process": {"pid": 1}, "signal": "SIGNAL_SIGHUP"}),
            ("process.Process/SendInput", {"process": {"pid": 1}, "input": {"pty": "eA=="}}),
            ("process.Process/Update", {"process": {"pid": 1}}),
            ("filesystem.Filesystem/Move", {"source": "a", "destination": "/tmp/a"}),
            ("filesystem.Filesystem/CreateWatcher", {"path": "/tmp"}),
            ("filesystem.Filesystem/GetWatcherEvents", {"watcherId": "nope"}),
        ]
        for name, unary in unaries:
            status, _, answer = rpc(front, sbx, name, unary)
            assert status >= 400 and answer["code"] in (
                "invalid_argument",
                "not_found",
                "unimplemented",
            ), (name, answer)
        status, _, answer = call(front, "POST", "/files", b"x", envd(sbx))
        assert status == 400 and "path" in answer["message"]
        bad = envd(sbx, **{"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
        status, _, answer = call(front, "POST", "/files?path=a", b"not gzip", bad)
        assert status == 400 and "gzip" in answer["message"]
        status, _, answer = call(front, "GET", "/files?path=/etc/passwd", None, envd(sbx))
        assert status == 400
        status, _, answer = call(front, "GET", "/files?path=a&username=root", None, envd(sbx))
        assert status == 403
    finally:
        sbx.kill()
    status, _, answer = call(e2b_daemon, "GET", "/health", None, envd(sbx))
    assert status == 502 and "was not found" in answer["message"]


def test_stream_input_and_tags(e2b_daemon: E2BDaemon) -> None:
    sbx = Sandbox.create(timeout=60)
    try:
        handle = sbx.commands.run("cat", background=True, stdin=True)
        framed = b""
        events: list[dict[str, Any]] = [
            {"start": {"process": {"pid": handle.pid}}},
            {"data": {"input": {"stdin": base64.b64encode(b"streamed").decode()}}},
            {"keepalive": {}},
        ]
        for event in events:
            data = json.dumps(event).encode()
            framed += b"\x00" + len(data).to_bytes(4, "big") + data
        status, _headers, _answer = rpc(
            e2b_daemon,
            sbx,
            "process.Process/StreamInput",
            framed,
            **{"Content-Type": "application/connect+json"},
        )
        assert status == 200
        sbx.commands.close_stdin(handle.pid)
        assert handle.wait().stdout == "streamed"
        data = json.dumps({"data": {"input": {"stdin": "eA=="}}}).encode()
        answer = stream_error(
            *rpc(
                e2b_daemon,
                sbx,
                "process.Process/StreamInput",
                b"\x00" + len(data).to_bytes(4, "big") + data,
                **{"Content-Type": "application/connect+json"},
            )
        )
        assert answer["code"] == "invalid_argument"
    finally:
        sbx.kill()


def test_a_start_stream_on_the_wire(e2b_daemon: E2BDaemon) -> None:
    """Start, envelope by envelope: the start event, keepalives while the command is
    silent, its output, its end, then the end-of-stream envelope."""
    from sandboxd.e2b.wire import read_envelopes

    sbx = Sandbox.create(timeout=60)
    try:
        message = {"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 1; echo x; exit 4"]}}
        data = json.dumps(message).encode()
        status, headers, body = rpc(
            e2b_daemon,
            sbx,
            "process.Process/Start",
            b"\x00" + len(data).to_bytes(4, "big") + data,
            **{"Content-Type": "application/connect+json", "Keepalive-Ping-Interval": "0.2"},
        )
        assert status == 200 and headers["Content-Type"] == "application/connect+json"
        assert body[-7:-2] == b"\x02\x00\x00\x00\x02"  # end-of-stream, then {}
        events = [m["event"] for m in read_envelopes(body)]
        assert "start" in events[0] and {"keepalive": {}} in events
        assert {"data": {"stdout": "eAo="}} in events
        assert events[-1]["end"] == {
            "exitCode": 4,
            "exited": True,
            "status": "exit status 4",
            "error": "exit status 4",
        }
    finally:
        sbx.kill()
