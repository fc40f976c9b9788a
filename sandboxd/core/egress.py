"""The manager's egress policies (docs/isolation.rst, "Egress policy per sandbox"): a
create's policy checked, a live sandbox's policy read and replaced."""

from twisted.logger import Logger

from sandboxd.core.sandbox import Sandbox
from sandboxd.errors import BadRequest
from sandboxd.isolation.base import Isolation
from sandboxd.isolation.network.egress_policy import EgressPolicy, PolicyHolder
from sandboxd.isolation.network.modes import NetworkMode

log = Logger()


def checked_holder(mode: NetworkMode, policy: EgressPolicy) -> PolicyHolder:
    """The mode, which must enforce egress policies; ``400`` when it takes none, or the
    operator forbids what ``policy`` names."""
    if not isinstance(mode, PolicyHolder):
        raise BadRequest(f"network: allow_out and deny_out need mode egress, not {mode.name}")
    holder = mode
    try:
        holder.check_policy(policy)
    except ValueError as e:
        raise BadRequest(f"network: {e}") from None
    return holder


class EgressPolicies:
    """The manager's egress policies (a mixin: the manager provides these attributes)."""

    isolation: Isolation

    def get(self, rid: str) -> Sandbox:
        raise NotImplementedError  # pragma: no cover - the manager's

    def egress_policy(self, sandbox: Sandbox) -> EgressPolicy | None:
        """The sandbox's egress policy now (``None``: its network mode takes none)."""
        mode = self.isolation.namespaces.network.offered.get(sandbox.network)
        return mode.policy(sandbox.rid) if isinstance(mode, PolicyHolder) else None

    def set_egress(self, rid: str, policy: EgressPolicy) -> EgressPolicy:
        """Replace the live sandbox's egress policy: its next new connection obeys it
        (connections open stay). ``400`` when its mode takes none or the operator forbids
        what it names; the policy in force after."""
        sandbox = self.get(rid)
        mode = self.isolation.namespaces.network.offered[sandbox.network]
        holder = checked_holder(mode, policy)
        holder.set_policy(rid, policy)
        log.info("egress policy of {rid} replaced", rid=rid)
        return holder.policy(rid)
