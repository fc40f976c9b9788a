"""The ``egress`` network mode: a veth pair per sandbox, routed and filtered by nftables.

:func:`network_mode` builds it from the configuration when it is asked for by name;
:class:`EgressNetwork` gives each sandbox a slot of the pool and wires it through
:class:`sandboxd.isolation.egress_host.Egress`, the host side (forwarding, the table, the
veths).
"""

import errno
import ipaddress
import os
import shutil
from collections import deque
from typing import Any

from attrs import define, field
from twisted.logger import Logger

from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.egress_host import Egress, EgressError
from sandboxd.isolation.egress_plan import EgressPlan

log = Logger()

IPV6_SYSCTLS = "/proc/sys/net/ipv6"
STATE_FILE = "/run/sandboxd-egress.json"
"""The forwarding values found before the layer turned them on (``/run``: gone at reboot, as
the sysctls' changes are)."""
RESOLV_CONF = "/etc/resolv.conf"
PROGRAMS = (("nft", "nftables"), ("ip", "iproute2"))


@define
class EgressNetwork:
    """The ``egress`` network mode (:class:`sandboxd.isolation.network.NetworkMode`).

    Each attached sandbox takes the slot freed longest ago. Detach only gives the slot back:
    the sandbox's veth goes with its network namespace when the pin is removed (the kernel
    deletes both ends of a veth whose one end's namespace dies), which costs the kill nothing;
    a veth still there when its slot comes round again is deleted then. :meth:`prepare` starts
    the layer on the host, :meth:`close` stops it. Failures of the layer at create surface as
    ``OSError`` (the create fails, nothing of the slot is left).
    """

    egress: Egress
    capacity: int
    name: str = "egress"
    own_namespace: bool = True
    _slots: dict[str, int] = field(factory=dict)
    _free: deque[int] = field(init=False)
    _started: bool = field(default=False)

    def __attrs_post_init__(self) -> None:
        self._free = deque(range(self.capacity))

    def prepare(self) -> None:
        """Start the layer (``IsolationUnavailable`` naming it when the host refuses)."""
        try:
            reclaimed = self.egress.start()
        except (EgressError, OSError) as e:
            raise IsolationUnavailable(f"network mode egress: {e}") from None
        self._started = True
        if reclaimed:
            log.info("egress: removed {n} veths of a predecessor", n=len(reclaimed))
        for server in unreachable_nameservers(self.egress.plan, self.egress.read(RESOLV_CONF)):
            log.warn(
                "egress: {conf} names nameserver {server}, which egress sandboxes cannot reach:"
                " name resolution fails in them (use a resolver outside this host)",
                conf=RESOLV_CONF,
                server=server,
            )

    def close(self) -> None:
        """Stop the layer (every veth, the table, the sysctls as found)."""
        if self._started:
            self._started = False
            self.egress.stop()

    def attach(self, rid: str, netns: str) -> None:
        if not self._free:
            raise OSError(errno.ENOSPC, "egress: every slot of the pool is taken")
        slot = self._free.popleft()
        try:
            self.egress.attach(netns, slot)
        except EgressError as e:
            self._free.appendleft(slot)
            raise OSError(errno.EIO, f"egress: {e}") from None
        self._slots[rid] = slot

    def detach(self, rid: str, netns: str) -> None:
        slot = self._slots.pop(rid, None)
        if slot is not None:  # (a predecessor's veths went when the layer started)
            self._free.append(slot)


def unreachable_nameservers(plan: EgressPlan, resolv_conf: str) -> list[str]:
    """The ``nameserver`` entries of ``resolv_conf`` that an egress sandbox cannot reach."""
    deny4, deny6 = plan.denied()
    denied = [ipaddress.ip_network(n) for n in deny4 + deny6]
    found = []
    for line in resolv_conf.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                address = ipaddress.ip_address(words[1].split("%")[0])
            except ValueError:
                continue
            if any(address in net for net in denied):
                found.append(words[1])
    return found


def network_mode(config: Any) -> EgressNetwork | None:
    """The egress mode for the daemon's configuration; ``None`` unless it is asked for by name
    (``SANDBOXD_NETWORK=egress`` or in ``SANDBOXD_NETWORK_ALLOW``): the layer changes the host
    (forwarding, a table), so it is never on by default. ``IsolationUnavailable`` names what is
    missing when it is asked for and cannot be provided."""
    if config.network != "egress" and "egress" not in (config.network_allow or ()):
        return None
    plan = EgressPlan(config.egress_pool, config.egress_pool6, config.egress_deny)
    capacity = config.uid_max - config.uid_min + 1
    try:
        plan.check(capacity)
    except ValueError as e:
        raise IsolationUnavailable(f"network mode egress: SANDBOXD_EGRESS_POOL: {e}") from None
    if plan.pool6 is not None and not os.path.isdir(IPV6_SYSCTLS):
        raise IsolationUnavailable(
            "network mode egress: this kernel has no IPv6: set SANDBOXD_EGRESS_POOL6=none"
        )
    for program, package in PROGRAMS:
        if shutil.which(program) is None:
            raise IsolationUnavailable(
                f"network mode egress: needs {program} (Debian package {package})"
            )
    return EgressNetwork(Egress(plan, state_file=STATE_FILE), capacity)
