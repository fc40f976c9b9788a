"""/healthz, /readyz, /drain, routing errors and the bearer token (docs/contract.rst;
docs/extensions.rst, "Auth")."""

from __future__ import annotations

import pytest

import sandboxd
from sandboxd.core.tools.resolver import Resolution, Resolved
from tests.http.http_harness import TOKEN, Harness


def test_healthz_reports_status_version_and_capabilities(harness: Harness) -> None:
    reply = harness.call("GET", "/healthz")
    assert reply.status == 200
    body = reply.json()
    assert body["status"] == "ok"
    assert body["version"] == sandboxd.__version__
    caps = body["capabilities"]
    assert caps == sorted(caps)
    for name in (
        "auth.none",
        "isolation.none",
        "exec.cwd",
        "exec.timeout",
        "exec.stdin",
        "exec.tools",
        "exec.split",
        "exec.keepalive",
        "exec.output-cap",
        "exec.backpressure",
        "sandboxes.list",
        "sandboxes.stats",
        "files.413",
        "files.507",
        "files.tree",
        "processes.stdin-backpressure",
    ):
        assert name in caps


def test_readyz_is_200_with_a_free_uid(harness: Harness) -> None:
    reply = harness.call("GET", "/readyz")
    assert reply.status == 200
    assert reply.json()["ready"] is True


def test_drain_refuses_creates_and_turns_readyz_503(harness: Harness) -> None:
    rid = harness.create()
    reply = harness.call("POST", "/drain")
    assert (reply.status, reply.body) == (204, b"")
    assert harness.call("POST", "/sandboxes", json_body={}).error() == (503, "Draining")
    ready = harness.call("GET", "/readyz")
    assert ready.status == 503
    assert ready.json()["ready"] is False
    assert harness.call("GET", "/healthz").json()["status"] == "draining"
    # Existing sandboxes keep working while draining.
    assert harness.call("GET", f"/sandboxes/{rid}/ready").status == 200


@pytest.fixture
def settings(settings: dict[str, str]) -> dict[str, str]:
    return settings


class TestNoCapacity:
    @pytest.fixture
    def settings(self, settings: dict[str, str]) -> dict[str, str]:
        return {**settings, "uid-min": "5000", "uid-max": "5000"}

    def test_a_pool_of_one_is_exhausted_by_one_sandbox(self, harness: Harness) -> None:
        rid = harness.create()
        assert harness.call("POST", "/sandboxes", json_body={}).error() == (503, "NoCapacity")
        ready = harness.call("GET", "/readyz")
        assert ready.status == 503
        assert ready.json()["ready"] is False
        # The existing sandbox is unaffected; killing it frees the slot.
        assert harness.call("GET", f"/sandboxes/{rid}/disk-usage").status == 200
        assert harness.call("DELETE", f"/sandboxes/{rid}").status == 204
        assert harness.call("GET", "/readyz").status == 200
        harness.create()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/nothing-here"),
        ("GET", "/sandboxes/0123456789abcdef/no-such-call"),
        ("POST", "/sandboxes/0123456789abcdef/exec/more"),
    ],
)
def test_unknown_routes_are_404_json(harness: Harness, method: str, path: str) -> None:
    reply = harness.call(method, path)
    assert reply.status == 404
    body = reply.json()
    assert set(body) == {"error", "detail"}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/healthz"),
        ("DELETE", "/readyz"),
        ("GET", "/drain"),
        ("PUT", "/sandboxes"),
        ("POST", "/sandboxes/0123456789abcdef/file"),
        ("GET", "/sandboxes/0123456789abcdef/exec"),
        ("GET", "/sandboxes/0123456789abcdef/rename"),
    ],
)
def test_wrong_methods_are_405_json(harness: Harness, method: str, path: str) -> None:
    reply = harness.call(method, path)
    assert reply.status == 405
    assert set(reply.json()) == {"error", "detail"}


class TestToken:
    @pytest.fixture
    def token(self) -> bytes:
        return TOKEN

    def test_healthz_and_readyz_stay_open(self, harness: Harness) -> None:
        bare = {"Authorization": "Nope"}
        assert harness.call("GET", "/healthz", headers=bare).status == 200
        assert harness.call("GET", "/readyz", headers=bare).status == 200
        assert "auth.bearer" in harness.call("GET", "/healthz").json()["capabilities"]

    @pytest.mark.parametrize(
        "header",
        [
            None,
            "",
            "Bearer",
            "Bearer wrong",
            "bearer " + TOKEN.decode(),
            "Bearer " + TOKEN.decode() + "x",
            "Basic " + TOKEN.decode(),
        ],
    )
    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("POST", "/sandboxes"),
            ("GET", "/sandboxes"),
            ("POST", "/drain"),
            ("DELETE", "/sandboxes/{rid}"),
            ("POST", "/sandboxes/{rid}/exec"),
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
            ("POST", "/sandboxes/{rid}/persist"),
            ("GET", "/sandboxes/{rid}/stats"),
        ],
    )
    def test_every_other_route_needs_the_token(
        self, harness: Harness, method: str, path: str, header: str | None
    ) -> None:
        rid = harness.create()
        headers = {} if header is None else {"Authorization": header}
        if header is None:
            harness.token, saved = None, harness.token
            reply = harness.call(method, path.format(rid=rid), headers=headers)
            harness.token = saved
        else:
            reply = harness.call(method, path.format(rid=rid), headers=headers)
        assert reply.error() == (401, "Unauthorized")
        # Nothing happened: the sandbox is still there and still alone, not draining.
        assert harness.manager.sandboxes.keys() == {rid}
        assert not harness.manager.draining

    def test_the_right_token_passes(self, harness: Harness) -> None:
        rid = harness.create()
        reply = harness.call("GET", f"/sandboxes/{rid}/ready")
        assert reply.status == 200


def test_readyz_is_503_while_recovering(harness: Harness) -> None:
    harness.manager.recovering = True
    reply = harness.call("GET", "/readyz")
    assert reply.status == 503
    assert reply.json()["ready"] is False


def test_metrics_are_prometheus_text(harness: Harness) -> None:
    harness.create()
    reply = harness.call("GET", "/metrics")
    assert reply.status == 200
    assert (reply.header("content-type") or "").startswith("text/plain")
    assert b"sandboxd_sandboxes 1.0" in reply.body
    assert "metrics" in harness.call("GET", "/healthz").json()["capabilities"]


class FakeTools:
    def __init__(self) -> None:
        self.asked: list[dict[str, str]] = []

    async def resolve(self, wanted: dict[str, str]) -> Resolution:
        self.asked.append(wanted)
        return Resolution(
            tools={"jq": Resolved(sha="ab" * 32, version="1", commands=[])}, refused={}
        )


def test_tools_resolve_answers_per_tool(harness: Harness) -> None:
    tools = FakeTools()
    harness.api.tools = tools  # type: ignore[assignment]
    reply = harness.call(
        "POST", "/tools/resolve", json_body={"tools": {"jq": "https://tools.test/jq.json"}}
    )
    assert reply.status == 200
    assert reply.json()["tools"]["jq"]["sha"] == "ab" * 32
    assert tools.asked == [{"jq": "https://tools.test/jq.json"}]


def test_tools_resolve_without_a_resolver_refuses_each_tool(harness: Harness) -> None:
    harness.api.tools = None
    reply = harness.call("POST", "/tools/resolve", json_body={"tools": {"a": "u", "b": "v"}})
    assert reply.status == 200
    body = reply.json()
    assert body["tools"] == {}
    assert set(body["refused"]) == {"a", "b"}


@pytest.mark.parametrize(
    "body",
    [{}, {"tools": ["a"]}, {"tools": "a"}, {"tools": {f"t{i}": "u" for i in range(65)}}],
)
def test_tools_resolve_bad_bodies(harness: Harness, body: object) -> None:
    reply = harness.call("POST", "/tools/resolve", json_body=body)
    assert reply.error() == (400, "BadRequest")
