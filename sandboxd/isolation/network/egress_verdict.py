"""Whether a connection by name may go out: a sandbox's policy read for one name and one
address (docs/isolation.rst, "Egress by name"). Pure values only; the egress proxy
(:mod:`sandboxd.isolation.network.egress_proxy`) asks.

The operator's deny list comes first and no policy lifts it: an address in a range the plan
denies (loopback, link-local and the metadata address, the pools, the private ranges unless
allowed) or one of the host's own is refused whatever name led there, so a name that
resolves to ``127.0.0.1`` or ``169.254.169.254`` (DNS rebinding) reaches nothing. Then the
sandbox's lists: ``deny_out`` (a name or a range holding the address) wins, and an
``allow_out`` (when there is one) must name the name or hold the address; in E2B's reading
(``allow_wins``) what ``allow_out`` names goes on before ``deny_out`` is looked at.
"""

import ipaddress
from collections.abc import Callable, Sequence

from sandboxd.isolation.network.egress_names import matches
from sandboxd.isolation.network.egress_plan import Address, EgressPlan, Network
from sandboxd.isolation.network.egress_policy import EgressPolicy, is_host_address

OPERATOR = "operator_denied"
DENIED = "denied"
NOT_ALLOWED = "not_allowed"


def operator_denied(plan: EgressPlan) -> list[Network]:
    """The ranges the operator denies every sandbox (the plan's, as networks)."""
    deny4, deny6 = plan.denied()
    return [ipaddress.ip_network(text) for text in deny4 + deny6]


def refusal(
    policy: EgressPolicy,
    name: str,
    address: Address,
    denied: Sequence[Network],
    is_host: Callable[[Address], bool] = is_host_address,
) -> str | None:
    """Why a connection to ``name`` at ``address`` is refused (:data:`OPERATOR`,
    :data:`DENIED` or :data:`NOT_ALLOWED`), or ``None`` when it may go out."""
    if any(address in net for net in denied) or is_host(address):
        return OPERATOR
    allowed = any(matches(p, name) for p in policy.allow_names) or any(
        address in net for net in policy.allow_out or ()
    )
    if policy.allow_wins and allowed:
        return None
    if any(matches(p, name) for p in policy.deny_names) or any(
        address in net for net in policy.deny_out
    ):
        return DENIED
    if policy.allow_wins or policy.allow_out is None or allowed:
        return None
    return NOT_ALLOWED
