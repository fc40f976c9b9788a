"""A sandbox's own egress policy: ``allow_out`` and ``deny_out`` lists of addresses and CIDRs.

Pure values only (docs/isolation.rst, "Egress policy per sandbox"). A policy narrows what the
operator's plan (:class:`sandboxd.isolation.network.egress_plan.EgressPlan`) permits, never
widens it: the plan's denied ranges and the host's own addresses are refused before a
sandbox's policy is looked at, so an ``allow_out`` entry can only choose among what the
operator lets through. ``deny_out`` wins over ``allow_out``; no ``allow_out`` (``None``) means
everything the operator permits, an empty one nothing (but DNS to the host's nameservers,
which the plan lets through before any policy).

An ``allow_out`` entry that lies wholly inside a range the operator denies (loopback,
link-local and the metadata address, the sandbox pools, the private ranges unless the
operator allowed them), or that is one of the host's own addresses (where the daemon's API
listens), can never be honoured: :func:`check_allowed` refuses it, naming it, rather than
accept a rule that silently does nothing. A wider entry (``0.0.0.0/0``) is fine: the
operator's ranges stay denied inside it. ``deny_out`` entries are never refused (denying a
denied range again is harmless).

Host names (``example.com``, ``*.example.com``) may stand in either list beside addresses
(:func:`parse_list`). A sandbox whose policy holds a name has its TCP to ports 80 and 443
handed to the daemon's egress proxy (:mod:`sandboxd.isolation.network.egress_proxy`), which
matches the TLS SNI or HTTP ``Host`` the connection carries; its UDP other than DNS is
refused (QUIC carries its name encrypted: nothing to match).

A policy may name a SOCKS5 proxy of the sandbox's own (``socks5``,
:mod:`~sandboxd.isolation.network.egress_socks_own`): then all its TCP is handed to the
egress proxy, which sends what its lists allow through that SOCKS5 proxy alone (its
forwarded TCP is refused: never direct); its address is checked as an ``allow_out`` entry is
(:func:`check_allowed`).
"""

import ipaddress
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from attrs import frozen

from sandboxd.isolation.network.egress_judge_plan import WEB_PORTS
from sandboxd.isolation.network.egress_names import parse_pattern
from sandboxd.isolation.network.egress_plan import Address, EgressPlan, Network
from sandboxd.isolation.network.egress_rules import HeaderRule, parse_rules, rules_json
from sandboxd.isolation.network.egress_socks import SocksUpstream
from sandboxd.isolation.network.egress_socks_own import own_socks_json, parse_own_socks

DEFAULT_ENTRIES_MAX = 1024
"""The default of ``SANDBOXD_EGRESS_POLICY_MAX``: entries per list of one sandbox's policy."""

REJECT = "reject with icmpx type admin-prohibited"


@frozen
class EgressPolicy:
    """What one sandbox may reach among what the operator permits (see the module docstring)."""

    allow_out: tuple[Network, ...] | None = None
    """``None``: everything the operator permits; else only these (an empty tuple: nothing)."""
    deny_out: tuple[Network, ...] = ()
    allow_wins: bool = False
    """E2B's reading (docs/e2b.rst, "Networking"): ``allow_out`` lists exceptions to
    ``deny_out`` rather than all that may be reached; a destination is refused when it is in
    ``deny_out`` and not in ``allow_out``."""
    allow_names: tuple[str, ...] = ()
    """Name patterns of ``allow_out`` (then ``allow_out`` is a tuple, empty when it held
    names alone)."""
    deny_names: tuple[str, ...] = ()
    """Name patterns of ``deny_out``."""
    rules: tuple[HeaderRule, ...] = ()
    """Headers set on the way out per host (:mod:`.egress_rules`); a policy with rules is
    one by name (its web traffic goes through the proxy, which applies them)."""
    socks5: SocksUpstream | None = None
    """The sandbox's own SOCKS5 proxy, all its TCP's only way out (see the module)."""

    @property
    def empty(self) -> bool:
        """True when the policy restricts nothing, sets no header and names no proxy."""
        if self.rules or self.socks5 is not None:
            return False
        if self.allow_wins:
            return not self.deny_out and not self.deny_names
        return self.allow_out is None and not self.deny_out and not self.deny_names

    @property
    def by_name(self) -> bool:
        """Whether the policy names hosts (its web traffic then goes through the proxy)."""
        return bool(self.allow_names or self.deny_names or self.rules)

    def to_json(self) -> dict[str, Any]:
        """The policy as the API shows it (``allow_out`` is ``null`` when not restricted)."""
        allow = None
        if self.allow_out is not None:
            allow = [str(n) for n in self.allow_out] + list(self.allow_names)
        deny = [str(n) for n in self.deny_out] + list(self.deny_names)
        shown: dict[str, Any] = {"allow_out": allow, "deny_out": deny}
        if self.allow_wins:
            shown["allow_wins"] = True
        if self.rules:
            shown["rules"] = rules_json(self.rules)
        if self.socks5 is not None:
            shown["socks5"] = own_socks_json(self.socks5)
        return shown


OPEN = EgressPolicy()
"""The policy of a sandbox that asked for none."""

TRUST_PATH = "/etc/ssl/certs/ca-certificates.crt"
"""The CA bundle a sandbox's programs read (the host's, seen in the sandbox)."""

TRUST_ENV = {
    "SSL_CERT_FILE": TRUST_PATH,
    "REQUESTS_CA_BUNDLE": TRUST_PATH,
    "CURL_CA_BUNDLE": TRUST_PATH,
    "NODE_EXTRA_CA_CERTS": TRUST_PATH,
}
"""The environment of a sandbox with its own bundle, for runtimes that read no system bundle
by default (Python's requests, Node.js): all name :data:`TRUST_PATH`."""


@runtime_checkable
class PolicyHolder(Protocol):
    """A network mode that enforces per-sandbox egress policies (the ``egress`` mode)."""

    def check_policy(self, policy: EgressPolicy) -> None:
        """``ValueError`` naming what of ``policy`` the operator forbids."""

    def stage_policy(self, rid: str, policy: EgressPolicy | None) -> None:
        """Keep ``policy`` for the sandbox ``rid`` about to be attached (``None``: forget it)."""

    def set_policy(self, rid: str, policy: EgressPolicy) -> None:
        """Give the attached sandbox ``rid`` this policy (``OSError`` when it cannot)."""

    def policy(self, rid: str) -> EgressPolicy:
        """The policy of the attached sandbox ``rid``."""

    def trust_bundle(self, policy: EgressPolicy, base: bytes | None = None) -> bytes:
        """The CA bundle a sandbox with ``policy`` sees at :data:`TRUST_PATH`, bound there at
        its create and rewritten when its policy changes: while the egress proxy terminates
        TLS, ``base`` (a template's own bundle; ``None``: the host's), and the proxy's CA
        when the policy has a header rule; else nothing (the file untouched)."""


def parse_list(name: str, value: object) -> tuple[tuple[Network, ...], tuple[str, ...]]:
    """One list of a request holding addresses, CIDRs and host names (exact or ``*.`` and a
    name): its networks and its name patterns; ``ValueError`` naming the list and the entry."""
    if not isinstance(value, list) or not all(isinstance(entry, str) for entry in value):
        raise ValueError(f"{name}: must be a list of addresses, CIDRs or host names")
    found: list[Network] = []
    names: list[str] = []
    for entry in value:
        try:
            found.append(ipaddress.ip_network(entry.strip(), strict=False))
            continue
        except ValueError:
            pass
        try:
            names.append(parse_pattern(entry))
        except ValueError:
            raise ValueError(
                f"{name}: {entry!r} is not an address, CIDR or host name"
                " (a name is example.com or *.example.com)"
            ) from None
    return tuple(dict.fromkeys(found)), tuple(dict.fromkeys(names))


def parse_policy(
    allow_out: object, deny_out: object, rules: object = None, socks5: object = None
) -> EgressPolicy:
    """A policy from a request's two lists, its header rules and its SOCKS5 proxy (``None``:
    absent)."""
    allow, allow_names = (None, ()) if allow_out is None else parse_list("allow_out", allow_out)
    deny, deny_names = ((), ()) if deny_out is None else parse_list("deny_out", deny_out)
    parsed = () if rules is None else parse_rules(rules)
    socks = None if socks5 is None else parse_own_socks(socks5, "socks5")
    return EgressPolicy(
        allow, deny, allow_names=allow_names, deny_names=deny_names, rules=parsed, socks5=socks
    )


def is_host_address(address: Address) -> bool:
    """Whether ``address`` is one of this host's own (it can be bound without ``IP_FREEBIND``)."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


def check_allowed(
    plan: EgressPlan,
    policy: EgressPolicy,
    entries_max: int,
    is_host: Callable[[Address], bool] = is_host_address,
) -> None:
    """``ValueError`` naming the first thing of ``policy`` the operator's ``plan`` forbids: a
    list longer than ``entries_max``, an ``allow_out`` entry inside a denied range, or one
    that is a single address of the host itself; or a SOCKS5 proxy at such an address."""
    for name, count in (
        ("allow_out", len(policy.allow_out or ()) + len(policy.allow_names)),
        ("deny_out", len(policy.deny_out) + len(policy.deny_names)),
    ):
        if count > entries_max:
            raise ValueError(
                f"{name}: {count} entries, at most {entries_max} (SANDBOXD_EGRESS_POLICY_MAX)"
            )
    deny4, deny6 = plan.denied()
    denied = [ipaddress.ip_network(text) for text in deny4 + deny6]
    for entry in policy.allow_out or ():
        for net in denied:
            if entry.version == net.version and entry.subnet_of(net):  # type: ignore[arg-type]
                raise ValueError(
                    f"allow_out: {entry} is inside {net}, which the operator denies"
                    " to every sandbox (SANDBOXD_EGRESS_DENY and the built-in ranges)"
                )
        if entry.num_addresses == 1 and is_host(entry.network_address):
            raise ValueError(
                f"allow_out: {entry.network_address} is an address of the host itself"
                " (the daemon's API), which no sandbox reaches"
            )
    if policy.socks5 is not None:
        check_proxy(ipaddress.ip_address(policy.socks5.address.host), denied, is_host)


def check_proxy(
    address: Address, denied: Sequence[Network], is_host: Callable[[Address], bool]
) -> None:
    """``ValueError`` when a sandbox's own SOCKS5 proxy is at ``address`` in a range the
    operator denies (loopback, link-local and the metadata address, the pools, the private
    ranges unless allowed) or one of the host's own (the daemon's): the daemon connects to
    it from the host, where the sandbox must reach nothing it could not reach itself."""
    for net in denied:
        if address in net:
            raise ValueError(
                f"the SOCKS5 proxy's address {address} is inside {net}, which the operator"
                " denies to every sandbox (SANDBOXD_EGRESS_DENY and the built-in ranges)"
            )
    if is_host(address):
        raise ValueError(
            f"the SOCKS5 proxy's address {address} is an address of the host itself"
            " (the daemon's API), which no sandbox reaches"
        )


def chain_name(slot: int) -> str:
    """The chain holding one slot's policy."""
    return f"policy{slot}"


PROXIED_PORTS = WEB_PORTS
"""The TCP ports a policy by name hands to the proxy, or the judge (HTTP by ``Host``, TLS by
SNI)."""


def judged(plan: EgressPlan, policy: EgressPolicy) -> bool:
    """Whether the judge, not the proxy, reads ``policy``'s names (the plan's judge runs, and
    the policy names hosts but sets no header and names no SOCKS5 proxy)."""
    return plan.judge and policy.by_name and not policy.rules and policy.socks5 is None


def policy_script(plan: EgressPlan, slot: int, policy: EgressPolicy) -> str:
    """``nft -f`` input replacing the slot's policy chain by ``policy``, in one transaction
    (connections already open are not touched: the ruleset accepts them before any policy).

    The slot's veth is mapped to its chain in the ruleset's ``policies`` verdict map; an empty
    policy leaves the chain empty (a slot is cleared so at detach, and its next sandbox starts
    from nothing). A policy by name puts the veth in the ``proxied`` set, whose TCP to
    :data:`PROXIED_PORTS` the ``proxy_redirect`` chain redirects to the plan's ``proxy_port``
    on the host end of the veth (the proxy's listener); any other policy takes it out. A
    policy with a SOCKS5 proxy puts the veth in ``proxied`` (whose redirected TCP the host
    accepts) and ``tunneled``, whose TCP ``proxy_redirect`` redirects whatever its port (but
    DNS to the nameservers), and its chain refuses TCP forwarded all the same (fail closed).
    A :func:`judged` policy puts the veth in the ``judged`` set instead of ``proxied``: its
    TCP to :data:`PROXIED_PORTS` leaves its chain at once, for the judge to read
    (:mod:`.egress_judge_plan`).
    """
    table = f"inet {plan.table}"
    chain = chain_name(slot)
    veth = f'"{plan.ifname(slot)}"'
    by_judge = judged(plan, policy)
    lines = [
        f"add chain {table} {chain}",
        f"flush chain {table} {chain}",
        f"add element {table} policies {{ {veth} : jump {chain} }}",
        f"add element {table} proxied {{ {veth} }}",
        f"add element {table} tunneled {{ {veth} }}",
    ]
    if plan.judge:
        lines.append(f"add element {table} judged {{ {veth} }}")
    if (policy.by_name and not by_judge) or policy.socks5 is not None:
        if not plan.proxy_port:
            raise ValueError(
                "host names or a SOCKS5 proxy in a policy need the egress proxy,"
                " which is not running"
            )
        lines += _redirect(plan)
    if policy.socks5 is None:
        lines.append(f"delete element {table} tunneled {{ {veth} }}")
        if not policy.by_name or by_judge:
            lines.append(f"delete element {table} proxied {{ {veth} }}")
    if plan.judge and not by_judge:
        lines.append(f"delete element {table} judged {{ {veth} }}")
    rules = _rules(policy)
    if by_judge:
        ports = ", ".join(str(port) for port in PROXIED_PORTS)
        rules.insert(0, f"tcp dport {{ {ports} }} return")
    lines += [f"add rule {table} {chain} {rule}" for rule in rules]
    return "\n".join(lines) + "\n"


def _redirect(plan: EgressPlan) -> list[str]:
    """The ``proxy_redirect`` chain, made anew: TCP of ``tunneled`` veths (DNS to the
    nameservers aside), then web TCP of ``proxied`` ones, to the proxy."""
    table = f"inet {plan.table}"
    ports = ", ".join(str(port) for port in PROXIED_PORTS)
    lines = [
        f"add chain {table} proxy_redirect"
        " { type nat hook prerouting priority -100; policy accept; }",
        f"flush chain {table} proxy_redirect",
    ]
    for family, version in (("ip", 4), ("ip6", 6)):
        servers = [str(a) for a in plan.dns if a.version == version]
        if servers:
            lines.append(
                f"add rule {table} proxy_redirect iifname @tunneled"
                f" {family} daddr {{ {', '.join(servers)} }} tcp dport 53 accept"
            )
    return [
        *lines,
        f"add rule {table} proxy_redirect iifname @tunneled meta l4proto tcp"
        f" redirect to :{plan.proxy_port}",
        f"add rule {table} proxy_redirect iifname @proxied tcp dport {{ {ports} }}"
        f" redirect to :{plan.proxy_port}",
    ]


def _rules(policy: EgressPolicy) -> list[str]:
    # QUIC (UDP) carries its name encrypted: under a policy by name, UDP is DNS or nothing.
    rules = [f"meta l4proto udp udp dport != 53 {REJECT}"] if policy.by_name else []
    if policy.socks5 is not None:  # its TCP leaves through its SOCKS5 proxy, never forwarded
        rules.insert(0, f"meta l4proto tcp {REJECT}")
    if policy.allow_wins:
        return rules + _exceptions_first(policy)
    for family, version in (("ip", 4), ("ip6", 6)):
        deny = _of_version(policy.deny_out, version)
        if deny:
            rules.append(f"{family} daddr {{ {', '.join(deny)} }} {REJECT}")
        if policy.allow_out is None:
            continue
        allow = _of_version(policy.allow_out, version)
        if allow:
            rules.append(f"{family} daddr != {{ {', '.join(allow)} }} {REJECT}")
        else:
            rules.append(f"meta nfproto ipv{version} {REJECT}")
    return rules


def _exceptions_first(policy: EgressPolicy) -> list[str]:
    """E2B's reading: what ``allow_out`` names goes on (``return``: to the ruleset's accept),
    then what ``deny_out`` names is refused."""
    rules = []
    for family, version in (("ip", 4), ("ip6", 6)):
        allow = _of_version(policy.allow_out or (), version)
        if allow:
            rules.append(f"{family} daddr {{ {', '.join(allow)} }} return")
    for family, version in (("ip", 4), ("ip6", 6)):
        deny = _of_version(policy.deny_out, version)
        if deny:
            rules.append(f"{family} daddr {{ {', '.join(deny)} }} {REJECT}")
    return rules


def _of_version(nets: Sequence[Network], version: int) -> list[str]:
    """The ``version`` entries of ``nets``, collapsed (nft refuses overlapping intervals)."""
    chosen = [net for net in nets if net.version == version]
    return [str(n) for n in ipaddress.collapse_addresses(chosen)]  # type: ignore[type-var]
