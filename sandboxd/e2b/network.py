"""The E2B front's ``network`` options: ``Sandbox.create(network={...})`` and
``update_network`` onto the daemon's per-sandbox egress policies (docs/e2b.rst, "Networking").

E2B's reading is kept: ``allowOut`` lists exceptions to ``denyOut`` (an address in both is
reached), ``allowOut`` alone restricts nothing, ``allow_internet_access=False`` is
``denyOut: ["0.0.0.0/0"]``. E2B sandboxes have IPv4 alone; here ``0.0.0.0/0`` in ``denyOut``
also denies ``::/0``, so "all traffic" stays all of it. Host names (``example.com``,
``*.example.com``) may stand in either list: they are matched by the TLS SNI or HTTP
``Host`` of web traffic (docs/isolation.rst, "Egress by name"). Per-host ``rules`` with a
static ``transform`` of ``headers`` become the policy's header rules (docs/isolation.rst,
"Header rules"; plain HTTP only: a TLS connection to a name with a rule is refused); a
callable transform reaches the wire as workload-identity placeholders
(``${e2b.identity...}``), which have no counterpart: ``400``. An ``egressProxy`` becomes the
policy's own SOCKS5 proxy (docs/isolation.rst, "A sandbox's own SOCKS5 proxy": an IP
address, no TLS); the detail shows it without its password. What has no counterpart yet
is refused with ``400``: a ``maskRequestHost``,
``httpsPorts`` (``allowPublicTraffic`` is the ports', read by :mod:`sandboxd.e2b.ports`).
``dnsServers`` is accepted and has no effect: the daemon resolves names with its own
resolver (``SANDBOXD_EGRESS_DNS``), whatever the sandbox uses.
"""

from typing import TYPE_CHECKING, Any

from sandboxd.e2b.wire import RestError
from sandboxd.errors import BadRequest
from sandboxd.isolation.network.egress_policy import EgressPolicy, parse_list
from sandboxd.isolation.network.egress_rules import HeaderRule, parse_rules
from sandboxd.isolation.network.egress_socks_own import own_socks_json, parse_own_socks
from sandboxd.isolation.network.egress_socks_tls import E2B_NAMES

if TYPE_CHECKING:
    from sandboxd.e2b.api import E2BFront
    from sandboxd.e2b.registry import E2BSandbox

ALL_TRAFFIC = "0.0.0.0/0"
"""The SDK's ``ctx.all_traffic``."""

EVERYTHING = parse_list("all traffic", [ALL_TRAFFIC, "::/0"])[0]

KNOWN = ("allowOut", "denyOut", "dnsServers", "allowPublicTraffic", "rules", "egressProxy")

IDENTITY_PLACEHOLDER = "${e2b."
"""What a callable transform's workload-identity tokens look like on the wire."""

HIDDEN = "***"
"""What a detail shows for a rule's header value (never the value)."""


def e2b_policy(network: object, internet: object) -> EgressPolicy | None:
    """The policy for a ``network`` body and ``allow_internet_access`` (``None``: one that
    restricts nothing, or ``allow_internet_access=False`` with no ``allowOut``, which the
    caller reads); ``400`` naming a field that cannot be honoured or a bad entry."""
    if internet not in (None, True, False):
        raise RestError(400, "allow_internet_access: must be true or false")
    if network is None:
        network = {}
    if not isinstance(network, dict):
        raise RestError(400, "network: must be an object")
    for name, value in network.items():
        if name not in KNOWN and value not in (None, {}, []):
            raise RestError(400, f"network.{name}: not supported by sandboxd")
    try:
        denied, deny_names = parse_list("network.denyOut", network.get("denyOut") or [])
        allowed, allow_names = parse_list("network.allowOut", network.get("allowOut") or [])
        rules = e2b_rules(network.get("rules"))
        proxy = network.get("egressProxy")
        socks = None if proxy is None else parse_own_socks(proxy, "network.egressProxy", E2B_NAMES)
    except ValueError as e:
        raise RestError(400, str(e)) from None
    if internet is False:
        if not allowed and not allow_names:
            return None  # the caller's choice: no network at all, or all of it denied
        denied = (*denied, *EVERYTHING)
    if not denied and not deny_names and not rules and socks is None:
        return None
    if any(str(net) == ALL_TRAFFIC for net in denied):
        denied = (*denied, *EVERYTHING)
    return EgressPolicy(
        allowed,
        tuple(dict.fromkeys(denied)),
        allow_wins=True,
        allow_names=allow_names,
        deny_names=deny_names,
        rules=rules,
        socks5=socks,
    )


def e2b_rules(value: object) -> tuple[HeaderRule, ...]:
    """E2B's ``rules`` (``{host: [{"transform": {"headers": {...}}}]}``) as header rules;
    ``ValueError`` naming what is refused, never a value."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ValueError("network.rules: must be an object mapping hosts to lists of rules")
    native: dict[str, Any] = {}
    for host, entries in value.items():
        if not isinstance(entries, list):
            raise ValueError(f"network.rules.{host}: must be a list of rules")
        native[host] = []
        for entry in entries:
            if not isinstance(entry, dict) or set(entry) - {"transform"}:
                raise ValueError(f'network.rules.{host}: a rule is {{"transform": {{...}}}}')
            transform = entry.get("transform") or {}
            if not isinstance(transform, dict) or set(transform) - {"headers"}:
                raise ValueError(f"network.rules.{host}: a transform sets headers alone")
            headers = transform.get("headers")
            if isinstance(headers, dict) and any(
                IDENTITY_PLACEHOLDER in str(v) for v in headers.values()
            ):
                raise ValueError(
                    f"network.rules.{host}: workload identity tokens (a callable transform)"
                    " are not supported by sandboxd: give the header's value itself"
                )
            native[host].append({"headers": headers})
    return parse_rules(native, "network.rules")


def update_network(front: "E2BFront", entry: "E2BSandbox", body: dict[str, Any]) -> None:
    """``PUT /sandboxes/{id}/network``: replace the sandbox's lists (omitted fields clear,
    as in E2B); ``400`` when its mode takes none (created with ``allow_internet_access=False``
    and no lists: its own loopback alone) or an entry is refused."""
    internet = body.pop("allow_internet_access", None)
    policy = e2b_policy(body, internet)
    if policy is None:
        policy = EgressPolicy((), EVERYTHING if internet is False else (), allow_wins=True)
    try:
        front.manager.set_egress(entry.sandbox.rid, policy)
    except BadRequest as e:
        raise RestError(400, e.detail) from None


def network_json(policy: EgressPolicy | None) -> dict[str, Any] | None:
    """A ``SandboxDetail``'s ``network``: the lists of a sandbox that has any (``None``: it
    has none, or its mode takes none)."""
    if policy is None or policy.empty:
        return None
    shown: dict[str, Any] = {
        "allowOut": [str(n) for n in policy.allow_out or ()] + list(policy.allow_names),
        "denyOut": [str(n) for n in policy.deny_out] + list(policy.deny_names),
    }
    if policy.rules:
        shown["rules"] = {
            rule.pattern: [{"transform": {"headers": dict.fromkeys(rule.names, HIDDEN)}}]
            for rule in policy.rules
        }
    if policy.socks5 is not None:
        shown["egressProxy"] = own_socks_json(policy.socks5, E2B_NAMES)
    return shown
