"""The egress proxy's names (docs/isolation.rst, "Egress by name"): the name a connection
asks for is resolved by the proxy's own resolver (``SANDBOXD_EGRESS_DNS``, else the host's
nameservers), never by the sandbox's ``/etc/hosts`` or DNS answers, and each answer is kept
for its TTL (at most :data:`NAMES_TTL_MAX` seconds, :data:`NAMES_MAX` names) so that a
name's connections after the first wait for no lookup.
"""

import ipaddress
from typing import Any

from attrs import define, field
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.names import dns

from sandboxd.isolation.network.egress_plan import Address

RESOLVE_TIMEOUT = (1, 3)
"""The proxy's waits for a nameserver's answer, retried (seconds; Twisted's default waits up
to a minute, which the sandbox's connection would hang through)."""

NAMES_TTL_MAX = 60
"""Longest the proxy keeps a name's addresses (seconds; a shorter TTL wins)."""

NAMES_MAX = 4096
"""The most names whose addresses the proxy keeps at once."""


def answer_addresses(results: list[tuple[bool, Any]]) -> tuple[set[Address], int]:
    """The A and AAAA addresses of a name's lookups (a failed lookup gives none) and how long
    they may be kept: their shortest TTL, at most :data:`NAMES_TTL_MAX` seconds."""
    found: set[Address] = set()
    ttl = NAMES_TTL_MAX
    for ok, result in results:
        if not ok:
            continue
        for record in result[0]:
            if record.type == dns.A:
                found.add(ipaddress.IPv4Address(record.payload.address))
            elif record.type == dns.AAAA:
                found.add(ipaddress.IPv6Address(record.payload.address))
            else:
                continue
            ttl = min(ttl, record.ttl)
    return found, ttl


@define
class NameCache:
    """Names resolved lately, by ``resolver`` (a Twisted ``IResolver``: ``lookupAddress``,
    ``lookupIPV6Address``), each with when its answer expires and its addresses."""

    reactor: Any
    resolver: Any
    names_max: int = NAMES_MAX
    _names: dict[str, tuple[float, frozenset[Address]]] = field(factory=dict)

    def resolve(self, name: str) -> "Deferred[set[Address]]":
        """The name's addresses (A and AAAA) by the proxy's own resolver, kept for their TTL
        (at most a minute) so that a name's connections after the first wait for no lookup."""
        now = self.reactor.seconds()
        kept = self._names.get(name)
        if kept is not None and kept[0] > now:
            return succeed(set(kept[1]))
        lookups = [
            self.resolver.lookupAddress(name, timeout=RESOLVE_TIMEOUT),
            self.resolver.lookupIPV6Address(name, timeout=RESOLVE_TIMEOUT),
        ]
        found: Deferred[Any] = DeferredList(lookups, consumeErrors=True)
        return found.addCallback(self._remember, name, now)

    def kept_for(self, name: str) -> float:
        """How much longer ``name``'s addresses are kept (seconds; 0: they are not)."""
        kept = self._names.get(name)
        return 0.0 if kept is None else max(0.0, kept[0] - self.reactor.seconds())

    def _remember(self, results: list[tuple[bool, Any]], name: str, now: float) -> set[Address]:
        addresses, ttl = answer_addresses(results)
        if addresses and ttl > 0:
            self._names.pop(name, None)
            while len(self._names) >= self.names_max:  # the oldest answer goes first
                del self._names[next(iter(self._names))]
            self._names[name] = (now + ttl, frozenset(addresses))
        return addresses
