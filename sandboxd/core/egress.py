"""The manager's egress policies (docs/isolation.rst, "Egress policy per sandbox"): a live
sandbox's policy read and replaced, and the CA bundle a sandbox of the ``egress`` mode sees
("Header rules over HTTPS"), made at its create and rewritten when its rules change."""

from twisted.logger import Logger

from sandboxd.core.sandbox import Sandbox
from sandboxd.core.templates.store import TemplateRoot
from sandboxd.errors import BadRequest
from sandboxd.isolation.base import Isolation
from sandboxd.isolation.namespaces.identity_files import template_bundle
from sandboxd.isolation.network.egress_policy import OPEN, EgressPolicy, PolicyHolder
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


def trust_base(sandbox_template: TemplateRoot | None) -> bytes | None:
    """The bundle a sandbox's own extends: its template's (empty when it has none), else
    the host's (``None``)."""
    return None if sandbox_template is None else template_bundle(sandbox_template.rootfs)


def trust_at_create(
    mode: NetworkMode, policy: EgressPolicy | None, template: TemplateRoot | None
) -> bytes:
    """The CA bundle a sandbox created in ``mode`` with ``policy`` (from ``template``) sees:
    for every sandbox of a mode that holds policies (a rule may come later, and the bundle
    must be bound at create to be rewritten then), the host's or its template's
    (:func:`trust_base`), with the proxy's CA when ``policy`` has a header rule; nothing for
    any other mode."""
    if not isinstance(mode, PolicyHolder):
        return b""
    return mode.trust_bundle(OPEN if policy is None else policy, trust_base(template))


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
        (connections open stay), and the CA bundle it sees is rewritten in place to trust the
        proxy's CA while the policy has a header rule (the host's alone once it has none).
        ``400`` when its mode takes none or the operator forbids what it names; the policy in
        force after."""
        sandbox = self.get(rid)
        mode = self.isolation.namespaces.network.offered[sandbox.network]
        holder = checked_holder(mode, policy)
        holder.set_policy(rid, policy)
        bundle = holder.trust_bundle(policy, trust_base(sandbox.template))
        if bundle:
            self.isolation.namespaces.retrust(rid, bundle)
        log.info("egress policy of {rid} replaced", rid=rid)
        return holder.policy(rid)
