"""docs/contract.rst, "Bad input and faults": bad input gets its documented answer and changes
nothing.

Real ``twistd -n sandboxd`` daemons over real TCP. "Changes nothing" is checked with a
snapshot of the live sandboxes and of every file under the daemon's root, before and after.
"""

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.core.exec.spec import ARG_STRLEN_MAX, exec_args_limit
from sandboxd.core.files.paths import NAME_MAX, PATH_MAX
from tests.security.live_daemon import (
    Reply,
    call,
    create,
    exec_frames,
    running,
    snapshot,
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One development daemon for the module; every test leaves it as it found it."""
    with running(tmp_path_factory.mktemp("bad-input"), "--isolation=none") as live:
        yield live


@pytest.fixture(scope="module")
def rid(daemon: Any) -> str:
    rid = create(daemon)
    assert call(daemon, "PUT", f"/sandboxes/{rid}/file?path=keep/me.txt", raw=b"kept").status
    return rid


def refused(reply: Reply, field: str, status: int = 400, error: str = "BadRequest") -> None:
    assert (reply.status, reply.error()) == (status, error), reply
    assert reply.json()["detail"].startswith(f"{field}:"), reply.json()


def workspace(daemon: Any, rid: str) -> Path:
    return Path(daemon.root) / rid / "workspace"


def execs(daemon: Any, rid: str) -> int:
    (entry,) = [s for s in call(daemon, "GET", "/sandboxes").json()["sandboxes"]
                if s["remote_id"] == rid]  # fmt: skip
    return int(entry["execs"])


def in_flight(daemon: Any) -> float:
    for line in call(daemon, "GET", "/metrics").body.decode().splitlines():
        if line.startswith("sandboxd_execs_in_flight "):
            return float(line.split()[1])
    raise AssertionError("no sandboxd_execs_in_flight in /metrics")


# Malformed JSON, wrong types


JSON_ROUTES = [
    "/sandboxes",
    "/sandboxes/{rid}/exec",
    "/sandboxes/{rid}/mkdir",
    "/sandboxes/{rid}/rename",
    "/sandboxes/{rid}/persist",
    "/tools/resolve",
]
MALFORMED = [
    b"{",
    b'{"cmd": ["true"]',
    b"[]",
    b'["cmd"]',
    b'"text"',
    b"1",
    b"null",
    b"true",
    b"{'cmd': ['true']}",
    b'{"cmd": ["true"]} {"cmd": ["true"]}',
    b'{"cmd": ["tr\xffue"]}',
    b"\xff\xfe{\x00}",
    b'{"cmd": ["true"], }',
]


@pytest.mark.parametrize("path", JSON_ROUTES)
def test_malformed_json_is_400_and_changes_nothing(daemon: Any, rid: str, path: str) -> None:
    before = snapshot(daemon, None)
    for raw in MALFORMED:
        reply = call(daemon, "POST", path.replace("{rid}", rid), raw=raw)
        refused(reply, "body")
    assert snapshot(daemon, None) == before


WRONG_TYPES: list[tuple[str, dict[str, Any], str]] = [
    ("/sandboxes/{rid}/exec", {}, "cmd"),
    ("/sandboxes/{rid}/exec", {"cmd": "ls"}, "cmd"),
    ("/sandboxes/{rid}/exec", {"cmd": None}, "cmd"),
    ("/sandboxes/{rid}/exec", {"cmd": []}, "cmd"),
    ("/sandboxes/{rid}/exec", {"cmd": [1]}, "cmd"),
    ("/sandboxes/{rid}/exec", {"cmd": [["ls"]]}, "cmd"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "env": []}, "env"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "env": "A=1"}, "env"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "env": {"A": 1}}, "env"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "env": {"A": None}}, "env"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "cwd": 5}, "cwd"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "cwd": ["a"]}, "cwd"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "cwd": "../.."}, "cwd"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "timeout": "1"}, "timeout"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "timeout": True}, "timeout"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "timeout": -1}, "timeout"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "timeout": 0}, "timeout"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "stdin": 5}, "stdin"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "stdin": "not base64!"}, "stdin"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "tools": "abc"}, "tools"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "tools": ["abc"]}, "tools"),
    ("/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "tools": [1]}, "tools"),
    ("/sandboxes", {"env": 5}, "env"),
    ("/sandboxes", {"env": {"A": 1}}, "env"),
    ("/sandboxes", {"image": 5}, "image"),
    ("/sandboxes", {"exposed_ports": "80"}, "exposed_ports"),
    ("/sandboxes", {"exposed_ports": [True]}, "exposed_ports"),
    ("/sandboxes", {"item_id": 5}, "item_id"),
    ("/sandboxes", {"item_id": ""}, "item_id"),
    ("/sandboxes", {"item_id": "a/b"}, "item_id"),
    ("/sandboxes", {"item_id": ".."}, "item_id"),
    ("/sandboxes", {"item_id": "a\u0000b"}, "item_id"),
    ("/sandboxes", {"item_id": "x" * 256}, "item_id"),
    ("/sandboxes/{rid}/mkdir", {}, "path"),
    ("/sandboxes/{rid}/mkdir", {"path": None}, "path"),
    ("/sandboxes/{rid}/mkdir", {"path": 5}, "path"),
    ("/sandboxes/{rid}/mkdir", {"path": ["a"]}, "path"),
    ("/sandboxes/{rid}/mkdir", {"path": "../x"}, "path"),
    ("/sandboxes/{rid}/rename", {"src": "keep/me.txt"}, "dst"),
    ("/sandboxes/{rid}/rename", {"dst": "x"}, "src"),
    ("/sandboxes/{rid}/rename", {"src": 5, "dst": "x"}, "src"),
    ("/sandboxes/{rid}/rename", {"src": "keep/me.txt", "dst": {"a": 1}}, "dst"),
    ("/sandboxes/{rid}/rename", {"src": "keep/me.txt", "dst": "../../x"}, "dst"),
    ("/sandboxes/{rid}/persist", {"delete": "yes"}, "delete"),
    ("/sandboxes/{rid}/persist", {"delete": None}, "delete"),
    ("/sandboxes/{rid}/persist", {"delete": 1}, "delete"),
    ("/tools/resolve", {}, "tools"),
    ("/tools/resolve", {"tools": ["http://x"]}, "tools"),
]


@pytest.mark.parametrize(("path", "body", "field"), WRONG_TYPES)
def test_a_wrong_field_is_400_naming_it_and_changes_nothing(
    daemon: Any, rid: str, path: str, body: dict[str, Any], field: str
) -> None:
    before = snapshot(daemon, None)
    refused(call(daemon, "POST", path.replace("{rid}", rid), body), field)
    assert snapshot(daemon, None) == before


# NUL bytes and text that is not UTF-8


QUERY_OPERATIONS = [
    ("PUT", "/file", "path"),
    ("GET", "/file", "path"),
    ("DELETE", "/file", "path"),
    ("GET", "/exists", "path"),
    ("GET", "/size", "path"),
    ("DELETE", "/dir", "path"),
    ("GET", "/walk", "root"),
]
BAD_QUERY_TEXT = [
    "%00",
    "keep%00",
    "keep/me.txt%00.png",
    "%FF",
    "keep%FE/me.txt",
    "a%C0%AFb",  # an overlong "/"
    "%ED%A0%80",  # a UTF-16 surrogate, UTF-8 encoded
    "%F8%88%80%80%80",  # a 5-byte sequence
    "%E2%82",  # truncated
]


@pytest.mark.parametrize(("method", "suffix", "name"), QUERY_OPERATIONS)
def test_nul_and_invalid_utf8_in_a_query_path_are_400(
    daemon: Any, rid: str, method: str, suffix: str, name: str
) -> None:
    before = snapshot(daemon, None)
    for text in BAD_QUERY_TEXT:
        target = f"/sandboxes/{rid}{suffix}?{name}={text}"
        reply = call(daemon, method, target, raw=b"x" if method == "PUT" else None)
        refused(reply, name)
    assert snapshot(daemon, None) == before


def test_nul_and_invalid_utf8_in_the_url_path_are_answered_in_json(daemon: Any) -> None:
    for target, status, error in [
        ("/sandboxes/%FF/exists?path=a", 400, "BadRequest"),
        ("/sandboxes/%ED%A0%80/walk", 400, "BadRequest"),
        ("/%C0%AF", 400, "BadRequest"),
        ("/sandboxes/%00/exists?path=a", 404, "SandboxNotFound"),
        ("/sandboxes/a%00b", 405, "MethodNotAllowed"),
    ]:
        reply = call(daemon, "GET", target)
        assert (reply.status, reply.error()) == (status, error), (target, reply)


NUL_AND_SURROGATES: list[tuple[str, str, str]] = [
    # (route, raw JSON body, field): raw, so that lone surrogates reach the daemon as sent
    ("/mkdir", r'{"path": "a\u0000b"}', "path"),
    ("/mkdir", r'{"path": "\ud800"}', "path"),
    ("/mkdir", r'{"path": "a/\udfffb"}', "path"),
    ("/rename", r'{"src": "keep/me.txt\u0000", "dst": "x"}', "src"),
    ("/rename", r'{"src": "keep/me.txt", "dst": "x\u0000"}', "dst"),
    ("/rename", r'{"src": "keep/me.txt", "dst": "\udc80"}', "dst"),
    ("/exec", r'{"cmd": ["touch", "x\u0000y"]}', "cmd"),
    ("/exec", r'{"cmd": ["touch", "\ud800"]}', "cmd"),
    ("/exec", r'{"cmd": ["touch", "x"], "cwd": "a\u0000"}', "cwd"),
    ("/exec", r'{"cmd": ["touch", "x"], "cwd": "\ud800"}', "cwd"),
    ("/exec", r'{"cmd": ["touch", "x"], "env": {"A\u0000": "1"}}', "env"),
    ("/exec", r'{"cmd": ["touch", "x"], "env": {"A": "1\u0000"}}', "env"),
    ("/exec", r'{"cmd": ["touch", "x"], "env": {"\ud800": "1"}}', "env"),
    ("/exec", r'{"cmd": ["touch", "x"], "env": {"A": "\udfff"}}', "env"),
    ("", r'{"env": {"A\u0000": "1"}}', "env"),
    ("", r'{"env": {"\ud800": "1"}}', "env"),
    ("", r'{"env": {"A": "\ud800"}}', "env"),
    ("", r'{"item_id": "\ud800"}', "item_id"),
]


@pytest.mark.parametrize(("suffix", "raw", "field"), NUL_AND_SURROGATES)
def test_nul_and_lone_surrogates_in_json_are_400(
    daemon: Any, rid: str, suffix: str, raw: str, field: str
) -> None:
    """A lone surrogate (``"\\ud800"``) is valid JSON but has no UTF-8 form: it is refused
    up front, never a ``500`` later, and never stored (a create ``env`` holding one used to
    make every later exec of that sandbox fail)."""
    before = snapshot(daemon, None)
    target = f"/sandboxes/{rid}{suffix}" if suffix else "/sandboxes"
    refused(call(daemon, "POST", target, raw=raw.encode()), field)
    assert snapshot(daemon, None) == before


@pytest.mark.parametrize(
    "env",
    [{"A=B": "1"}, {"=": "1"}, {"=A": "1"}, {"": "1"}, {"PATH=/tmp:": "1"}],
)
def test_env_keys_containing_equals_or_empty_are_400(
    daemon: Any, rid: str, env: dict[str, str]
) -> None:
    before = snapshot(daemon, None)
    refused(call(daemon, "POST", f"/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "env": env}),
            "env")  # fmt: skip
    refused(call(daemon, "POST", "/sandboxes", {"env": env}), "env")
    assert snapshot(daemon, None) == before


def test_equals_in_an_env_value_is_fine(daemon: Any, rid: str) -> None:
    status, frames = exec_frames(
        daemon, rid, {"cmd": ["sh", "-c", 'printf %s "$A"'], "env": {"A": "b=c=d"}}
    )
    assert status == 200 and frames[-1]["exit"] == 0
    assert base64.b64decode(frames[-1]["out"]) == b"b=c=d"


# Paths at and beyond PATH_MAX


def long_path(size: int) -> str:
    """A path of exactly ``size`` bytes made of NAME_MAX-byte components."""
    component = "p" * NAME_MAX
    text = "/".join([component] * (size // (NAME_MAX + 1) + 1))[:size]
    return text.rstrip("/") + "q" * (size - len(text.rstrip("/")))


@pytest.mark.parametrize("size", [PATH_MAX, PATH_MAX + 1, 5000, 16000])
def test_a_path_at_or_beyond_path_max_is_400(daemon: Any, rid: str, size: int) -> None:
    before = snapshot(daemon, None)
    text = long_path(size)
    assert len(text.encode()) == size
    for method, suffix, name in QUERY_OPERATIONS:
        reply = call(daemon, method, f"/sandboxes/{rid}{suffix}?{name}={text}",
                     raw=b"x" if method == "PUT" else None)  # fmt: skip
        refused(reply, name)
    refused(call(daemon, "POST", f"/sandboxes/{rid}/mkdir", {"path": text}), "path")
    refused(call(daemon, "POST", f"/sandboxes/{rid}/rename", {"src": text, "dst": "x"}), "src")
    refused(call(daemon, "POST", f"/sandboxes/{rid}/exec", {"cmd": ["touch", "x"], "cwd": text}),
            "cwd")  # fmt: skip
    assert snapshot(daemon, None) == before


def test_a_path_far_beyond_any_limit_is_400(daemon: Any, rid: str) -> None:
    """Longer than twisted.web's 16 KiB request line: still a JSON 400, not a dropped
    connection (which a client takes for a dead replica)."""
    before = snapshot(daemon, None)
    reply = call(daemon, "GET", f"/sandboxes/{rid}/exists?path={'a' * 40000}")
    assert (reply.status, reply.error()) == (400, "BadRequest"), reply
    refused(call(daemon, "POST", f"/sandboxes/{rid}/mkdir", {"path": "a/" * 100_000}), "path")
    assert snapshot(daemon, None) == before


def test_a_path_just_under_path_max_works(daemon: Any, rid: str) -> None:
    text = long_path(PATH_MAX - 1)
    s = f"/sandboxes/{rid}"
    assert call(daemon, "PUT", f"{s}/file?path={text}", raw=b"deep").status == 204
    assert call(daemon, "GET", f"{s}/file?path={text}").body == b"deep"
    walked = call(daemon, "GET", f"{s}/walk?root=/{text.split('/')[0]}").json()["entries"]
    assert [e["path"] for e in walked] == ["/" + text]
    too_long_name = "n" * (NAME_MAX + 1)
    refused(call(daemon, "PUT", f"{s}/file?path={too_long_name}", raw=b"x"), "path")
    assert call(daemon, "PUT", f"{s}/file?path={'n' * NAME_MAX}", raw=b"x").status == 204
    assert call(daemon, "DELETE", f"{s}/file?path={'n' * NAME_MAX}").status == 204
    assert call(daemon, "DELETE", f"{s}/dir?path={text.split('/')[0]}").status == 204


DEEP_TREE = r"""
import os
for _ in range(3000):
    os.mkdir("d")
    os.chdir("d")
with open("f", "wb") as f:
    f.write(b"bottom")
"""


def test_trees_deeper_than_path_max_and_the_recursion_limit_work(tmp_path: Path) -> None:
    """A sandbox can nest directories far beyond PATH_MAX (and Python's recursion limit):
    walk, disk-usage, rmdir and kill still work; kill used to fail with a 500 and leak the
    sandbox's files and uid."""

    with running(tmp_path, "--isolation=none") as daemon:
        rid = create(daemon)
        s = f"/sandboxes/{rid}"
        status, frames = exec_frames(daemon, rid, {"cmd": ["python3", "-c", DEEP_TREE]})
        assert status == 200 and frames[-1]["exit"] == 0, frames[-1]
        (entry,) = call(daemon, "GET", f"{s}/walk").json()["entries"]
        assert entry["path"] == "/d" * 3000 + "/f" and entry["size"] == 6
        assert call(daemon, "GET", f"{s}/disk-usage").json() == {"bytes": 6}
        assert call(daemon, "POST", f"{s}/rename", {"src": "d", "dst": "e"}).status == 204
        assert call(daemon, "DELETE", f"{s}/dir?path=e").status == 204
        assert call(daemon, "GET", f"{s}/walk").json() == {"entries": []}
        status, frames = exec_frames(daemon, rid, {"cmd": ["python3", "-c", DEEP_TREE]})
        assert status == 200 and frames[-1]["exit"] == 0
        assert call(daemon, "DELETE", s).status == 204
        assert not (Path(daemon.root) / rid).exists()
        assert call(daemon, "GET", "/readyz").status == 200


# A cmd of 100 000 arguments, and E2BIG


def test_a_cmd_of_100000_arguments_runs(daemon: Any, rid: str) -> None:
    before = execs(daemon, rid)
    status, frames = exec_frames(daemon, rid, {"cmd": ["echo", *(["x"] * 100_000)]})
    assert status == 200, frames
    assert frames[-1]["exit"] == 0
    assert base64.b64decode(frames[-1]["out"]) == b" ".join([b"x"] * 100_000) + b"\n"
    assert execs(daemon, rid) == before + 1
    assert in_flight(daemon) == 0


def test_an_argument_list_execve_cannot_take_is_400_before_anything_runs(
    daemon: Any, rid: str
) -> None:
    """E2BIG is decided up front: ``400`` naming the field, nothing started, nothing counted
    as running (it used to be a 500 that left the exec counted as in flight forever, which
    made every drain wait for its deadline)."""
    marker = workspace(daemon, rid) / "ran"
    before_execs = execs(daemon, rid)
    before = snapshot(daemon, None)
    per_arg = 40
    count = exec_args_limit() // (per_arg + 9) + 1000
    bodies: list[tuple[dict[str, Any], str]] = [
        ({"cmd": ["touch", "ran", *(["a" * per_arg] * count)]}, "cmd"),
        ({"cmd": ["touch", "ran", "a" * ARG_STRLEN_MAX]}, "cmd"),
        ({"cmd": ["touch", "ran"], "env": {"BIG": "v" * ARG_STRLEN_MAX}}, "env"),
        ({"cmd": ["touch", "ran"], "env": {f"V{i}": "v" * 1000 for i in range(3000)}}, "cmd"),
    ]
    for body, field in bodies:
        reply = call(daemon, "POST", f"/sandboxes/{rid}/exec", body)
        refused(reply, field)
    refused(call(daemon, "POST", "/sandboxes", {"env": {"BIG": "v" * ARG_STRLEN_MAX}}), "env")
    assert not marker.exists()
    assert snapshot(daemon, None) == before
    assert execs(daemon, rid) == before_execs
    assert in_flight(daemon) == 0
    status, frames = exec_frames(daemon, rid, {"cmd": ["true"]})
    assert status == 200 and frames[-1]["exit"] == 0


def test_a_create_env_and_an_exec_env_together_over_the_limit_are_400(daemon: Any) -> None:
    half = {f"C{i}": "c" * 1000 for i in range(exec_args_limit() // 1040 // 2 + 200)}
    rid = create(daemon, body={"env": half})
    other = {f"E{i}": "e" * 1000 for i in range(exec_args_limit() // 1040 // 2 + 200)}
    refused(call(daemon, "POST", f"/sandboxes/{rid}/exec", {"cmd": ["true"], "env": other}),
            "cmd")  # fmt: skip
    status, frames = exec_frames(daemon, rid, {"cmd": ["true"]})
    assert status == 200 and frames[-1]["exit"] == 0
    assert call(daemon, "DELETE", f"/sandboxes/{rid}").status == 204
    assert in_flight(daemon) == 0


# Malformed HTTP


def raw_exchange(daemon: Any, data: bytes) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", daemon.port), timeout=60) as s:
        s.sendall(data)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


MALFORMED_HTTP = [
    b"GARBAGE\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-%d: v\r\n" % i for i in range(600))
    + b"\r\n",  # too many headers
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * 20000 + b"\r\n\r\n",
    b"GET /healthz?" + b"q" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
    b"POST /sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}",
    b"POST /sandboxes HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n",
]


@pytest.mark.parametrize("data", MALFORMED_HTTP, ids=range(len(MALFORMED_HTTP)))
def test_malformed_http_is_a_json_400_and_changes_nothing(daemon: Any, data: bytes) -> None:
    """Answered, in the error model, before the connection closes: a silently dropped
    connection would make a client take this replica for dead (``SandboxNotFound``)."""
    before = snapshot(daemon, None)
    head, _, body = raw_exchange(daemon, data).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert b"content-type: application/json" in head.lower(), head
    assert json.loads(body)["error"] == "BadRequest"
    assert snapshot(daemon, None) == before


# Bodies over the limit


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A daemon whose request bodies are limited to 1 MiB."""
    with running(tmp_path_factory.mktemp("max-body"), "--isolation=none", "--max-body=1M") as d:
        yield d


def upload_chunked(daemon: Any, target: str, data: bytes) -> Reply:
    def chunks() -> Iterator[bytes]:
        for start in range(0, len(data), 64 << 10):
            yield data[start : start + (64 << 10)]

    return call(daemon, "PUT", target, raw=chunks())  # no length: http.client sends chunks


def test_a_body_over_the_limit_is_413_and_nothing_is_written(small: Any) -> None:
    rid = create(small)
    ws = workspace(small, rid)
    before = snapshot(small, None)
    big = os.urandom((1 << 20) + 1)
    s = f"/sandboxes/{rid}"
    for reply in (
        call(small, "PUT", f"{s}/file?path=big.bin", raw=big),
        upload_chunked(small, f"{s}/file?path=big.bin", big),
        call(small, "PUT", f"{s}/file?path=big.bin", raw=os.urandom(8 << 20)),
    ):
        assert (reply.status, reply.error()) == (413, "TooLarge"), reply
    padding = "x" * (1 << 20)
    reply = call(small, "POST", f"{s}/exec", {"cmd": ["touch", "ran"], "pad": padding})
    assert (reply.status, reply.error()) == (413, "TooLarge"), reply
    reply = call(small, "POST", f"{s}/mkdir", {"path": "made", "pad": padding})
    assert (reply.status, reply.error()) == (413, "TooLarge"), reply
    reply = call(small, "POST", "/sandboxes", {"pad": padding})
    assert (reply.status, reply.error()) == (413, "TooLarge"), reply
    assert sorted(os.listdir(ws)) == []  # no file, no hidden temporary file
    assert snapshot(small, None) == before
    exact = os.urandom(1 << 20)
    assert call(small, "PUT", f"{s}/file?path=exact.bin", raw=exact).status == 204
    assert (ws / "exact.bin").read_bytes() == exact
    assert upload_chunked(small, f"{s}/file?path=chunked.bin", exact).status == 204
    assert (ws / "chunked.bin").read_bytes() == exact
    assert sorted(os.listdir(ws)) == ["chunked.bin", "exact.bin"]


def test_the_daemon_keeps_serving_after_all_of_it(daemon: Any, rid: str) -> None:
    health = call(daemon, "GET", "/healthz")
    assert health.status == 200 and health.json()["status"] == "ok"
    status, frames = exec_frames(daemon, rid, {"cmd": ["cat", "keep/me.txt"]})
    assert status == 200 and base64.b64decode(frames[-1]["out"]) == b"kept"
    assert in_flight(daemon) == 0
    log = Path(daemon.log).read_text(errors="replace")
    assert "unexpected error answering" not in log
    assert not [line for line in log.splitlines() if '" 500 ' in line]
    assert json.loads(call(daemon, "GET", "/readyz").body)["ready"] is True
