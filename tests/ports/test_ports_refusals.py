"""Ports' refusals on a development daemon (``--isolation=none``: no network namespace of a
sandbox's own, so every port is refused rather than the host's loopback reached)."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2b.conftest import TOKEN, E2BDaemon, running_front
from tests.security.live_daemon import call, create

DOMAIN = "ports.test"


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BDaemon]:
    tmp = tmp_path_factory.mktemp("ports-refusals")
    with running_front(tmp, "--isolation=none", f"--e2b-domain={DOMAIN}") as running:
        yield running


def native(front: E2BDaemon, method: str, path: str, body: Any = None) -> Any:
    return call(front.daemon, method, path, body, token=TOKEN)


def e2b(front: E2BDaemon, method: str, path: str, body: Any = None, **headers: str) -> Any:
    port = int(front.url.rsplit(":", 1)[1])
    return call(port, method, path, body, headers={"X-API-Key": TOKEN, **headers})


def test_a_sandbox_without_its_own_network_namespace_is_refused(front: E2BDaemon) -> None:
    rid = create(front.daemon, TOKEN)
    reply = native(front, "GET", f"/sandboxes/{rid}/ports/8000/")
    assert reply.status == 409 and reply.json()["error"] == "Conflict"
    assert "host's" in reply.json()["detail"]
    upgrade = native(front, "GET", f"/sandboxes/{rid}/ports/8000/ws")
    assert upgrade.status == 409


def test_the_port_call_checks_its_body_and_port(front: E2BDaemon) -> None:
    rid = create(front.daemon, TOKEN)
    assert native(front, "POST", f"/sandboxes/{rid}/ports/8000", {"public": "yes"}).status == 400
    assert native(front, "POST", f"/sandboxes/{rid}/ports/0", {}).status == 400
    assert native(front, "POST", f"/sandboxes/{rid}/ports/70000", {}).status == 400
    assert native(front, "POST", "/sandboxes/0123456789abcdef/ports/80", {}).status == 404
    assert native(front, "GET", f"/sandboxes/{rid}/ports/70000/").status == 400
    spelled = f"/sandboxes/%{ord(rid[0]):02x}{rid[1:]}/ports/8000/"  # the rid, one byte escaped
    assert native(front, "GET", spelled).status == 400
    absolute = native(front, "GET", f"http://elsewhere/sandboxes/{rid}/ports/8000/x")
    assert absolute.status == 404  # the native front routes origin-form targets alone
    reply = native(front, "POST", f"/sandboxes/{rid}/ports/8000")
    assert reply.json() == {
        "url": f"{front.daemon.url}/sandboxes/{rid}/ports/8000/",
        "public": False,
    }
    assert "ports" in native(front, "GET", "/healthz").json()["capabilities"]
    assert call(front.daemon, "GET", "/sandboxes").status == 401  # not a port: no rule of its
    assert call(front.daemon, "GET", f"/sandboxes/{rid}/ports/8000").status == 401


def test_a_port_host_of_a_sandbox_without_a_namespace_is_refused(front: E2BDaemon) -> None:
    created = e2b(front, "POST", "/sandboxes", {"templateID": "base"})
    assert created.status == 201, created
    sandbox = created.json()
    assert sandbox["domain"] == DOMAIN and sandbox["trafficAccessToken"]
    host = f"8000-{sandbox['sandboxID']}.{DOMAIN}"
    traffic = {"e2b-traffic-access-token": sandbox["trafficAccessToken"]}
    reply = e2b(front, "GET", "/", Host=host, **traffic)
    assert reply.status == 409 and reply.json()["code"] == 409
    # not a port host (no such port): the front's own routes answer
    assert e2b(front, "GET", "/", Host=f"70000-{sandbox['sandboxID']}.{DOMAIN}").status == 404
    assert e2b(front, "GET", "http://elsewhere/x?y", Host=host, **traffic).status == 409
    assert e2b(front, "GET", "http://elsewhere?y", Host=host, **traffic).status == 409
    assert e2b(front, "GET", "/", Host=host.upper() + ":80", **traffic).status == 409  # any case


@pytest.mark.parametrize(
    "network",
    [{"allowPublicTraffic": "yes"}, ["allowPublicTraffic"]],
)
def test_create_refuses_a_network_it_cannot_read(front: E2BDaemon, network: Any) -> None:
    reply = e2b(front, "POST", "/sandboxes", {"templateID": "base", "network": network})
    assert reply.status == 400 and "network" in reply.json()["message"]


def test_without_the_gate_the_route_refuses_alike(tmp_path: Path) -> None:
    """With ``SANDBOXD_AUTH_GATE=off`` the routes judge alone: the same answers."""
    with running_front(
        tmp_path, "--isolation=none", f"--e2b-domain={DOMAIN}", "--auth-gate=off"
    ) as off:
        rid = create(off.daemon, TOKEN)
        assert call(off.daemon, "GET", f"/sandboxes/{rid}/ports/8000/").status == 401
        sandbox = e2b(off, "POST", "/sandboxes", {"templateID": "base"}).json()
        host = f"8000-{sandbox['sandboxID']}.{DOMAIN}"
        assert e2b(off, "GET", "/", Host=host).status == 403
        assert e2b(off, "GET", "/", Host=f"8000-0123456789abcdef.{DOMAIN}").status == 502
        public = e2b(
            off,
            "POST",
            "/sandboxes",
            {"templateID": "base", "network": {"allowPublicTraffic": True}},
        ).json()
        assert e2b(off, "GET", "/", Host=f"8000-{public['sandboxID']}.{DOMAIN}").status == 409
