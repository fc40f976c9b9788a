"""Create, kill, list, stats, and the error bodies every sandbox route shares."""

from __future__ import annotations

import os

import pytest

from sandboxd.core.layout import RID_PATTERN
from sandboxd.core.manager import SandboxManager
from sandboxd.errors import BadRequest
from sandboxd.http.parse import check_item_id
from tests.http.http_harness import Harness

SANDBOX_ROUTES = [
    ("DELETE", "/sandboxes/{rid}"),
    ("POST", "/sandboxes/{rid}/exec"),
    ("POST", "/sandboxes/{rid}/persist"),
    ("PUT", "/sandboxes/{rid}/file?path=a"),
    ("GET", "/sandboxes/{rid}/file?path=a"),
    ("DELETE", "/sandboxes/{rid}/file?path=a"),
    ("GET", "/sandboxes/{rid}/exists?path=a"),
    ("GET", "/sandboxes/{rid}/size?path=a"),
    ("GET", "/sandboxes/{rid}/disk-usage"),
    ("GET", "/sandboxes/{rid}/walk"),
    ("POST", "/sandboxes/{rid}/mkdir"),
    ("DELETE", "/sandboxes/{rid}/dir?path=a"),
    ("POST", "/sandboxes/{rid}/rename"),
    ("POST", "/sandboxes/{rid}/mark-ready"),
    ("GET", "/sandboxes/{rid}/ready"),
    ("GET", "/sandboxes/{rid}/stats"),
]

JSON_ROUTES = [
    ("POST", "/sandboxes"),
    ("POST", "/sandboxes/{rid}/exec"),
    ("POST", "/sandboxes/{rid}/persist"),
    ("POST", "/sandboxes/{rid}/mkdir"),
    ("POST", "/sandboxes/{rid}/rename"),
]


def test_create_answers_pod_url_and_remote_id(harness: Harness) -> None:
    reply = harness.call("POST", "/sandboxes", json_body={})
    assert reply.status == 200
    body = reply.json()
    assert set(body) == {"pod_url", "remote_id"}
    assert RID_PATTERN.match(body["remote_id"])
    # No SANDBOXD_POD_URL, no POD_IP: the address the request arrived at.
    assert body["pod_url"] == "http://127.0.0.1:80"
    top = harness.manager.layout.directory(body["remote_id"])
    assert sorted(os.listdir(top)) == ["home", "tmp", "workspace"]


def test_create_accepts_an_absent_body_and_every_field(harness: Harness) -> None:
    assert harness.call("POST", "/sandboxes").status == 200
    body = {
        "image": "python:3.12",
        "env": {"A": "1"},
        "exposed_ports": [8000, 9000],
        "item_id": "item-42",
        "network": "host",
    }
    reply = harness.call("POST", "/sandboxes", json_body=body)
    assert reply.status == 200
    assert harness.manager.sandboxes[reply.json()["remote_id"]].env == {"A": "1"}
    assert harness.manager.sandboxes[reply.json()["remote_id"]].network == "host"


def test_remote_ids_are_distinct(harness: Harness) -> None:
    assert len({harness.create() for _ in range(5)}) == 5


class TestPodUrl:
    @pytest.fixture
    def settings(self, settings: dict[str, str]) -> dict[str, str]:
        return {**settings, "pod-url": "http://10.1.2.3:8080/"}

    def test_configured_pod_url_wins(self, harness: Harness) -> None:
        reply = harness.call("POST", "/sandboxes", json_body={})
        assert reply.json()["pod_url"] == "http://10.1.2.3:8080"


@pytest.mark.parametrize(
    ("ip", "expected"),
    [("10.0.0.7", "http://10.0.0.7:80"), ("fd00::7", "http://[fd00::7]:80")],
)
def test_pod_ip_and_the_port_make_the_pod_url(harness: Harness, ip: str, expected: str) -> None:
    harness.api.pod_ip = ip
    assert harness.call("POST", "/sandboxes", json_body={}).json()["pod_url"] == expected


@pytest.mark.parametrize(
    "body",
    [
        {"image": 3},
        {"env": "A=1"},
        {"env": {"A": 1}},
        {"env": {"A=B": "1"}},
        {"env": {"": "1"}},
        {"env": {"A\u0000": "1"}},
        {"env": {"A": "1\u0000"}},
        {"exposed_ports": 80},
        {"exposed_ports": ["80"]},
        {"exposed_ports": [True]},
        {"item_id": 7},
        {"item_id": ""},
        {"item_id": "a/b"},
        {"item_id": ".."},
        {"item_id": "."},
        {"item_id": "a\u0000"},
        {"item_id": "x" * 256},
        {"network": 3},
        {"network": "wifi"},
        {"network": "none"},
        {"network": "egress"},
    ],
)
def test_create_refuses_bad_fields(harness: Harness, body: object) -> None:
    reply = harness.call("POST", "/sandboxes", json_body=body)
    assert reply.error() == (400, "BadRequest")
    assert harness.manager.sandboxes == {}
    assert harness.manager.isolation.uids.free == 10


def test_kill_removes_everything(harness: Harness) -> None:
    rid = harness.create()
    harness.call("POST", f"/sandboxes/{rid}/mark-ready")
    reply = harness.call("DELETE", f"/sandboxes/{rid}")
    assert (reply.status, reply.body) == (204, b"")
    assert not os.path.exists(harness.manager.layout.directory(rid))
    assert harness.manager.isolation.uids.free == 10


@pytest.mark.parametrize(("method", "path"), SANDBOX_ROUTES)
@pytest.mark.parametrize("rid", ["0123456789abcdef", "killed", "NOT-A-RID", "0123456789ABCDEF"])
def test_unknown_killed_or_malformed_rid_is_404(
    harness: Harness, method: str, path: str, rid: str
) -> None:
    if rid == "killed":
        rid = harness.create()
        assert harness.call("DELETE", f"/sandboxes/{rid}").status == 204
    reply = harness.call(method, path.format(rid=rid), json_body={"cmd": ["true"], "path": "a"})
    assert reply.error() == (404, "SandboxNotFound")


@pytest.mark.parametrize(("method", "path"), JSON_ROUTES)
@pytest.mark.parametrize(
    "raw", [b"{", b"not json", b"[1, 2]", b'"text"', b"42", b"null", b"\xff\xfe{}"]
)
def test_malformed_json_is_400(harness: Harness, method: str, path: str, raw: bytes) -> None:
    rid = harness.create()
    reply = harness.call(method, path.format(rid=rid), data=raw)
    status, kind = reply.error()
    assert (status, kind) == (400, "BadRequest")
    assert "body" in reply.json()["detail"]
    assert list(harness.manager.sandboxes) == [rid]


def test_listing(harness: Harness) -> None:
    assert harness.call("GET", "/sandboxes").json() == {"sandboxes": []}
    rid = harness.create()
    harness.clock.advance(30)
    harness.call("POST", f"/sandboxes/{rid}/mark-ready")
    (entry,) = harness.call("GET", "/sandboxes").json()["sandboxes"]
    assert entry == {
        "remote_id": rid,
        "created": 0.0,
        "last_active": 30.0,
        "ready": True,
        "execs": 0,
        "network": {"mode": "host"},  # no egress mode here: no lists
        "template": None,  # the host's root
    }
    assert harness.call("GET", f"/sandboxes/{rid}/network").json() == {"mode": "host"}


def test_stats(harness: Harness) -> None:
    rid = harness.create()
    reply = harness.call("GET", f"/sandboxes/{rid}/stats")
    assert reply.status == 200
    assert reply.json() == {
        "memory_bytes": 0,
        "memory_peak_bytes": 0,
        "cpu_usec": 0,
        "pids": 0,
        "oom_kills": 0,
        "cpus": None,  # not placed
        "disk_bytes": None,  # no disk limits: nothing counted
        "disk_limit_bytes": None,
        "files": None,
        "files_limit": None,
    }


def test_an_unexpected_failure_is_a_500_json_body(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    rid = harness.create()

    def broken(self: object, sandbox: object) -> bool:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(SandboxManager, "is_ready", broken)
    reply = harness.call("GET", f"/sandboxes/{rid}/ready")
    assert reply.status == 500
    assert reply.json() == {"error": "InternalError", "detail": "disk on fire"}


@pytest.mark.parametrize(
    ("route", "raw"),
    [
        ("/sandboxes", b'{"env": {"A": "\\ud800"}}'),
        ("/sandboxes/{rid}/exec", b'{"cmd": ["echo", "\\udfff"]}'),
        ("/sandboxes/{rid}/mkdir", b'{"path": "a\\ud800"}'),
        ("/sandboxes/{rid}/rename", b'{"src": "a", "dst": "\\ud800"}'),
    ],
)
def test_lone_surrogates_in_json_are_400(harness: Harness, route: str, raw: bytes) -> None:
    rid = harness.create()
    reply = harness.call("POST", route.format(rid=rid), data=raw)
    assert reply.error() == (400, "BadRequest")
    assert "surrogate" in reply.json()["detail"]


def test_item_ids_reserved_for_the_archive_are_400(harness: Harness) -> None:
    reply = harness.call("POST", "/sandboxes", json_body={"item_id": ".sandboxd-staging"})
    assert reply.error() == (400, "BadRequest")


def test_check_item_id() -> None:
    assert check_item_id(None) is None
    assert check_item_id("item-1") == "item-1"
    with pytest.raises(BadRequest, match="not valid Unicode"):
        check_item_id("a\ud800")
