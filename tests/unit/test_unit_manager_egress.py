"""The manager's part of per-sandbox egress policies (docs/isolation.rst, "Egress policy per
sandbox"): checked before a create, staged for the mode's attach, replaced on a live sandbox,
shown in the listing, and the HTTP bodies that carry them; with a recording mode in place of
the egress layer (the real one: ``tests/kernel/test_egress_policy.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from sandboxd.core.sandbox import CreateRequest
from sandboxd.core.templates.store import TemplateRoot
from sandboxd.errors import BadRequest
from sandboxd.http import parse, wire
from sandboxd.isolation.namespaces.pins import Namespaces
from sandboxd.isolation.network.egress_policy import OPEN, TRUST_ENV, EgressPolicy, parse_policy
from sandboxd.isolation.network.modes import HostNetwork, NetworkPolicy
from tests.support.fakes import fake_isolation
from tests.unit.test_unit_manager import World


@attrs.define
class PolicedMode:
    """An ``egress`` mode that records the policies it is given; refuses ``127.0.0.1``."""

    name: str = "egress"
    own_namespace: bool = False
    trusted: bool = True
    """Whether the proxy terminates TLS (every sandbox then gets a bundle)."""
    staged: dict[str, EgressPolicy] = attrs.field(factory=dict)
    policies: dict[str, EgressPolicy] = attrs.field(factory=dict)

    def prepare(self) -> None: ...
    def close(self) -> None: ...
    def attach(self, rid: str, netns: str) -> None: ...
    def detach(self, rid: str, netns: str) -> None: ...

    def check_policy(self, policy: EgressPolicy) -> None:
        if any(str(n) == "127.0.0.1/32" for n in policy.allow_out or ()):
            raise ValueError("allow_out: 127.0.0.1/32 is inside 127.0.0.0/8")

    def stage_policy(self, rid: str, policy: EgressPolicy | None) -> None:
        if policy is None:
            self.staged.pop(rid)
        else:
            self.staged[rid] = policy

    def set_policy(self, rid: str, policy: EgressPolicy) -> None:
        self.policies[rid] = policy

    def policy(self, rid: str) -> EgressPolicy:
        return self.policies.get(rid, self.staged.get(rid, OPEN))

    def trust_bundle(self, policy: EgressPolicy, base: bytes | None = None) -> bytes:
        if not self.trusted:
            return b""
        return (b"HOST" if base is None else base) + (b"+CA" if policy.rules else b"")


@pytest.fixture
def world(tmp_path: Path) -> Any:
    mode = PolicedMode()
    offered = {"egress": mode, "host": HostNetwork()}
    network = NetworkPolicy(offered, ("egress", "host"), "egress")  # type: ignore[arg-type]
    isolation = attrs.evolve(fake_isolation(), namespaces=Namespaces(network=network))
    w = World(tmp_path, isolation)
    w.start()
    yield w, mode
    w.close()


def test_a_create_stages_a_checked_policy_and_the_listing_shows_it(world: Any) -> None:
    w, mode = world
    strict = parse_policy(["192.0.2.1"], None)
    sandbox = w.manager.create(CreateRequest(network="egress", egress=strict))
    assert mode.staged == {sandbox.rid: strict}
    plain = w.manager.create(CreateRequest(network="host"))
    shown = {s.rid: (s.network, s.egress) for s in w.manager.listing()}
    assert shown == {sandbox.rid: ("egress", strict), plain.rid: ("host", None)}
    body = wire.sandboxes_body(w.manager.listing())["sandboxes"]
    assert {s["remote_id"]: s["network"] for s in body} == {
        sandbox.rid: {"mode": "egress", "allow_out": ["192.0.2.1/32"], "deny_out": []},
        plain.rid: {"mode": "host"},
    }


def test_a_sandbox_with_a_header_rule_is_told_where_its_bundle_is(world: Any) -> None:
    w, _ = world
    ruled = parse_policy(None, None, {"api.example": [{"headers": {"X-Key": "k"}}]})
    request = CreateRequest(egress=ruled, env={"CURL_CA_BUNDLE": "/mine.pem"})
    sandbox = w.manager.create(request)
    assert sandbox.env == {**TRUST_ENV, "CURL_CA_BUNDLE": "/mine.pem"}  # (its own wins)
    assert w.manager.create(CreateRequest(egress=OPEN)).env == TRUST_ENV  # (a rule may come)
    assert not w.manager.create(CreateRequest(network="host")).env


def test_without_tls_termination_no_sandbox_is_told_of_a_bundle(world: Any) -> None:
    w, mode = world
    mode.trusted = False
    ruled = parse_policy(None, None, {"api.example": [{"headers": {"X-Key": "k"}}]})
    assert not w.manager.create(CreateRequest(egress=ruled)).env


def test_a_live_sandboxs_bundle_follows_its_rules(world: Any, monkeypatch: Any) -> None:
    w, mode = world
    rewritten: list[tuple[str, bytes]] = []
    monkeypatch.setattr(
        Namespaces, "retrust", lambda _, rid, bundle: rewritten.append((rid, bundle))
    )
    rid = w.manager.create().rid
    ruled = parse_policy(None, None, {"api.example": [{"headers": {"X-Key": "k"}}]})
    w.manager.set_egress(rid, ruled)
    w.manager.set_egress(rid, OPEN)
    mode.trusted = False
    w.manager.set_egress(rid, ruled)  # (no termination: nothing to rewrite)
    assert rewritten == [(rid, b"HOST+CA"), (rid, b"HOST")]


def test_a_templated_sandboxs_bundle_extends_its_templates(
    world: Any, monkeypatch: Any, tmp_path: Path
) -> None:
    w, _ = world
    rewritten: list[bytes] = []
    monkeypatch.setattr(Namespaces, "retrust", lambda _, rid, bundle: rewritten.append(bundle))
    (tmp_path / "t/etc/ssl/certs").mkdir(parents=True)
    (tmp_path / "t/etc/ssl/certs/ca-certificates.crt").write_bytes(b"TEMPLATE'S")
    sandbox = w.manager.create()
    sandbox.template = TemplateRoot("t", str(tmp_path / "t"), {}, "/")
    ruled = parse_policy(None, None, {"api.example": [{"headers": {"X-Key": "k"}}]})
    w.manager.set_egress(sandbox.rid, ruled)
    assert rewritten == [b"TEMPLATE'S+CA"]


def test_policies_the_mode_or_operator_refuses_are_400s(world: Any) -> None:
    w, mode = world
    with pytest.raises(BadRequest, match="need mode egress, not host"):
        w.manager.create(CreateRequest(network="host", egress=OPEN))
    with pytest.raises(BadRequest, match=r"^network: allow_out: 127\.0\.0\.1/32"):
        w.manager.create(CreateRequest(egress=parse_policy(["127.0.0.1"], None)))
    assert w.isolation.uids.free == 4 and not mode.staged


def test_a_failed_create_forgets_its_staged_policy(world: Any) -> None:
    w, mode = world
    w.cgroups.create_error = OSError("no cgroup")
    with pytest.raises(OSError):
        w.manager.create(CreateRequest(egress=parse_policy(None, ["192.0.2.0/24"])))
    assert not mode.staged


def test_a_live_sandboxs_policy_is_replaced(world: Any) -> None:
    w, mode = world
    rid = w.manager.create().rid  # the default mode, egress, with no policy
    wider = parse_policy(None, ["192.0.2.9"])
    assert w.manager.set_egress(rid, wider) == wider == mode.policies[rid]
    with pytest.raises(BadRequest, match="127"):
        w.manager.set_egress(rid, parse_policy(["127.0.0.1"], None))
    host = w.manager.create(CreateRequest(network="host")).rid
    with pytest.raises(BadRequest, match="need mode egress"):
        w.manager.set_egress(host, wider)


@pytest.mark.parametrize(
    ("network", "wanted"),
    [
        (None, (None, None)),
        ("none", ("none", None)),
        ({"mode": "host"}, ("host", None)),
        ({"allow_out": ["192.0.2.1"]}, ("egress", parse_policy(["192.0.2.1"], None))),
        ({"mode": "egress", "deny_out": []}, ("egress", OPEN)),
        (
            {"socks5": {"address": "203.0.113.80:1080"}},
            ("egress", parse_policy(None, None, None, {"address": "203.0.113.80:1080"})),
        ),
    ],
)
def test_the_create_bodys_network(network: object, wanted: tuple[Any, Any]) -> None:
    assert parse.network_request(network) == wanted
    request = parse.create_request({"network": network})
    assert (request.network, request.egress) == wanted


@pytest.mark.parametrize(
    ("network", "message"),
    [
        (3, "a network mode's name or an object"),
        ({"mode": "egress", "rulez": {}}, "unknown field 'rulez'"),
        ({"mode": 1}, "mode must be a string"),
        ({"allow_out": ["example..com"]}, "'example..com' is not an address, CIDR or host"),
        ({"socks5": {"address": "p.example:1"}}, "network: socks5.address: .* host name is not"),
    ],
)
def test_bad_network_bodies_are_400s(network: object, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse.network_request(network)


def test_the_update_body() -> None:
    assert parse.network_update({}) == OPEN
    assert parse.network_update({"allow_out": []}) == EgressPolicy((), ())
    with pytest.raises(BadRequest, match="unknown field 'mode'"):
        parse.network_update({"mode": "egress"})


def test_a_sandboxs_own_socks5_is_listed_without_its_password(world: Any) -> None:
    w, mode = world
    own = {"address": "203.0.113.80:1080", "username": "me", "password": "pr0xy-s3cret"}
    policy = parse.network_request({"socks5": own})[1]
    sandbox = w.manager.create(CreateRequest(network="egress", egress=policy))
    body = wire.sandboxes_body(w.manager.listing())["sandboxes"]
    assert body[0]["network"]["socks5"] == {"address": "203.0.113.80:1080", "username": "me"}
    assert "pr0xy-s3cret" not in str(body) and mode.staged[sandbox.rid].socks5 is not None
    assert parse.network_update({"socks5": own}) == policy
