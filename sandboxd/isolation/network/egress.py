"""The ``egress`` network mode: a veth pair per sandbox, routed and filtered by nftables.

:func:`network_mode` builds it from the configuration: offered by default where the host can
give it, unless ``SANDBOXD_NETWORK_ALLOW`` leaves it out (docs/operating.rst, "The egress
network mode");
:class:`EgressNetwork` gives each sandbox a slot of the pool and wires it through
:class:`sandboxd.isolation.network.egress_host.Egress`, the host side (forwarding, the table, the
veths).
"""

import errno
import ipaddress
import os
import shutil
import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from attrs import define, evolve, field
from twisted.logger import Logger

from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.namespaces.identity_files import HostBundle
from sandboxd.isolation.network.egress_host import Egress, EgressError
from sandboxd.isolation.network.egress_plan import (
    DEFAULT_POOL6,
    EgressPlan,
    nameservers,
    parse_pool6,
)
from sandboxd.isolation.network.egress_policy import (
    DEFAULT_ENTRIES_MAX,
    OPEN,
    TRUST_PATH,
    EgressPolicy,
    check_allowed,
    judged,
    policy_script,
)
from sandboxd.isolation.network.modes import NetworkUnavailable, egress_named

log = Logger()

IPV6_SYSCTLS = "/proc/sys/net/ipv6"
STATE_FILE = "/run/sandboxd-egress.json"
"""The forwarding values found before the layer turned them on (``/run``: gone at reboot, as
the sysctls' changes are)."""
RESOLV_CONF = "/etc/resolv.conf"
PROGRAMS = (("nft", "nftables"), ("ip", "iproute2"))
FORBID = "SANDBOXD_NETWORK_ALLOW without egress (e.g. none,host) stops offering it"


class Judge(Protocol):
    """What the mode asks of the egress judge (:class:`.egress_judge.EgressJudge`)."""

    def start(self) -> None:
        """Start judging (``EgressError`` when this host cannot)."""

    def stop(self) -> None:
        """Stop judging."""

    def judge(self, rid: str, ifindex: int, policy: EgressPolicy) -> None:
        """Judge the veth ``ifindex``'s web connections by ``policy``."""

    def forget(self, rid: str) -> None:
        """Judge sandbox ``rid``'s veth no more (nothing when it was not judged)."""


class ProxyListener(Protocol):
    """What the mode asks of the egress proxy."""

    def listen(self) -> int:
        """Start listening; the port."""

    def close(self) -> None:
        """Stop listening."""


def read_text(path: str) -> str:
    """A file's text; empty when it cannot be read (a host without ``resolv.conf``)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


@define
class EgressNetwork:
    """The ``egress`` network mode (:class:`sandboxd.isolation.network.modes.NetworkMode`).

    Each attached sandbox takes the slot freed longest ago. Detach only gives the slot back:
    the sandbox's veth goes with its network namespace when the pin is removed (the kernel
    deletes both ends of a veth whose one end's namespace dies), which costs the kill nothing;
    a veth still there when its slot comes round again is deleted then. Failures of the layer
    at create surface as ``OSError`` (the create fails, nothing of the slot is left).

    Asked for by name, :meth:`prepare` starts the layer on the host (start-up fails if it
    cannot) and :meth:`close` stops it. Offered by default (``lazy``), nothing changes on the
    host until an egress sandbox needs it (but what a crashed predecessor left is removed at
    :meth:`prepare`): the first :meth:`attach` starts the layer (its
    failure is :class:`NetworkUnavailable`, naming the cause and the setting, and leaves
    nothing), and the detach of the last egress sandbox stops it again, so the host holds the
    table and the forwarding only while an egress sandbox lives.
    """

    egress: Egress
    capacity: int
    lazy: bool = False
    resolv_conf: str = RESOLV_CONF
    """The file whose nameservers the plan lets DNS through to (for the warning below)."""
    name: str = "egress"
    own_namespace: bool = True
    policy_entries_max: int = DEFAULT_ENTRIES_MAX
    """The most entries one list of a sandbox's policy may hold (``SANDBOXD_EGRESS_POLICY_MAX``)."""
    proxy: ProxyListener | None = None
    """The egress proxy (:mod:`sandboxd.isolation.network.egress_proxy`), which the
    composition root gives; it listens while the layer is up (the table guards its port).
    ``None``: a policy naming hosts is refused."""
    judge: Judge | None = None
    """The egress judge, which the composition root gives when ``SANDBOXD_EGRESS_JUDGE`` is
    ``on``: it runs while the layer is up, and reads the names of policies without header
    rules in place of the proxy (where this host cannot run it, the proxy does)."""
    ifindex: Callable[[str], int] = socket.if_nametoindex
    on_detach: Callable[[str], None] = lambda rid: None
    """Told each sandbox that goes (the proxy drops its counts)."""
    trusted: bytes = b""
    """The egress proxy's CA (PEM), when it terminates TLS for header rules."""
    host_bundle: HostBundle = field(factory=lambda: HostBundle(TRUST_PATH))
    """The host's CA bundle, which a sandbox's own bundle extends."""
    _slots: dict[str, int] = field(factory=dict)
    _rids: dict[int, str] = field(factory=dict)
    """The sandbox of each slot taken (the inverse of ``_slots``)."""
    _policies: dict[str, EgressPolicy] = field(factory=dict)
    _staged: dict[str, EgressPolicy] = field(factory=dict)
    _stale: set[int] = field(factory=set)
    """Slots whose last sandbox's policy could not be cleared at detach (cleared at attach)."""
    _free: deque[int] = field(init=False)
    _started: bool = field(default=False)
    _ahead: set[int] = field(factory=set)
    """Slots wired ahead into a pooled namespace, for no sandbox yet
    (:mod:`sandboxd.isolation.namespaces.netns_pool`)."""
    _lock: threading.RLock = field(factory=threading.RLock)
    """Held over the slots' books and the layer's start and stop: the pool's refill thread
    wires ahead while creates attach."""

    def __attrs_post_init__(self) -> None:
        self._free = deque(range(self.capacity))

    def prepare(self) -> None:
        """Start the layer unless ``lazy`` (``IsolationUnavailable`` naming it when the host
        refuses); warn of nameservers egress sandboxes cannot reach."""
        if not self.lazy:
            try:
                self._start()
            except (EgressError, OSError) as e:
                raise IsolationUnavailable(f"network mode egress: {e}") from None
        elif os.path.exists(self.egress.state_file):
            self._reclaim_crashed()
        try:
            conf = self.egress.read(self.resolv_conf)
        except OSError:
            conf = ""
        for server in unreachable_nameservers(self.egress.plan, conf):
            log.warn(
                "egress: {conf} names nameserver {server}, which egress sandboxes cannot reach:"
                " name resolution fails in them (use a resolver outside this host)",
                conf=self.resolv_conf,
                server=server,
            )

    def _reclaim_crashed(self) -> None:
        """Lazy: the host holds a layer (its state file is there). Its owner, if it is gone (the
        lock is free), crashed: give the host back what it changed, its table and forwarding,
        rather than leave them until this daemon's first egress create. A live owner's stays."""
        try:
            self._start()
        except (EgressError, OSError) as e:
            log.info("egress: the host's layer is not this daemon's ({why})", why=e)
            return
        log.info("egress: removing the table and forwarding a crashed predecessor left")
        self.close()

    def _start(self) -> None:
        if self.proxy is not None:  # its port goes into the ruleset
            self.egress.plan = evolve(self.egress.plan, proxy_port=self.proxy.listen())
        self._start_judge()
        try:
            reclaimed = self.egress.start()
        except BaseException:
            self._stop_judge()
            self._close_proxy()
            raise
        self._started = True
        if reclaimed:
            log.info("egress: removed {n} veths of a predecessor", n=len(reclaimed))

    def close(self) -> None:
        """Stop the layer (every veth, the table, the sysctls as found)."""
        if self._started:
            self._started = False
            try:
                self.egress.stop()
            finally:
                self._stop_judge()
                self._close_proxy()

    def _start_judge(self) -> None:
        """Start the judge (its set and chains go into the ruleset); where this host cannot
        run it, policies by name go through the proxy alone."""
        if self.judge is None:
            return
        try:
            self.judge.start()
        except (EgressError, OSError) as e:
            log.warn("egress: no judge on this host ({why}): names go through the proxy", why=e)
            return
        self.egress.plan = evolve(self.egress.plan, judge=True)

    def _stop_judge(self) -> None:
        if self.judge is not None and self.egress.plan.judge:
            self.judge.stop()
            self.egress.plan = evolve(self.egress.plan, judge=False)

    def _close_proxy(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
            self.egress.plan = evolve(self.egress.plan, proxy_port=0)

    def attach(self, rid: str, netns: str) -> None:
        self.adopt(rid, self._wire(netns))

    def wire_ahead(self, netns: str) -> int:
        """Wire a free slot into the namespace pinned at ``netns``, which no sandbox has yet
        (the pool's refill thread); the slot, which :meth:`adopt` later gives to a sandbox
        or :meth:`release_ahead` frees. Fails as :meth:`attach` does."""
        return self._wire(netns)

    def _wire(self, netns: str) -> int:
        with self._lock:
            if not self._free:
                raise OSError(errno.ENOSPC, "egress: every slot of the pool is taken")
            if not self._started:  # lazy: the first egress sandbox starts the layer
                try:
                    self._start()
                except (EgressError, OSError) as e:
                    raise NetworkUnavailable(
                        f"network mode egress cannot start on this host: {e}"
                        f" (egress is offered by default; {FORBID})"
                    ) from None
            slot = self._free.popleft()
            self._ahead.add(slot)  # the layer stays up while the slot is being wired
        try:
            self.egress.attach(netns, slot)
        except EgressError as e:
            self.release_ahead(slot, first=True)
            raise OSError(errno.EIO, f"egress: {e}") from None
        return slot

    def release_ahead(self, slot: int, first: bool = False) -> None:
        """Give back ``slot``, wired ahead for no sandbox, whose namespace is gone (``first``:
        it is the next one taken again)."""
        with self._lock:
            self._ahead.discard(slot)
            if first:
                self._free.appendleft(slot)
            else:
                self._free.append(slot)
            self._stop_when_idle()

    def adopt(self, rid: str, slot: int) -> None:
        """Give sandbox ``rid`` the wired ``slot`` (its namespace is now the sandbox's) and
        apply the policy staged for it; ``OSError`` when ``nft`` refuses it (the create fails
        and its detach frees the slot)."""
        with self._lock:
            self._ahead.discard(slot)
            self._slots[rid] = slot
            self._rids[slot] = rid
        policy = self._staged.pop(rid, OPEN)
        if slot in self._stale or not policy.empty:
            # An OSError fails the create: the pin goes and detach frees the slot again.
            self.set_policy(rid, policy)
            self._stale.discard(slot)

    def detach(self, rid: str, netns: str) -> None:
        with self._lock:
            slot = self._slots.pop(rid, None)
        policy = self._policies.pop(rid, OPEN)
        self._unjudge(rid)
        self.on_detach(rid)
        if slot is not None:  # (a predecessor's veths went when the layer started)
            self._rids.pop(slot, None)
            if not policy.empty:  # the slot's next sandbox must not inherit it
                try:
                    self.egress.run(["nft", "-f", "-"], policy_script(self.egress.plan, slot, OPEN))
                except EgressError as e:
                    log.warn("egress: cannot clear the policy of slot {slot}: {e}", slot=slot, e=e)
                    self._stale.add(slot)  # its next attach clears it before any use
            with self._lock:
                self._free.append(slot)
                self._stop_when_idle()

    # Per-sandbox policy (docs/isolation.rst, "Egress policy per sandbox")

    def check_policy(self, policy: EgressPolicy) -> None:
        """``ValueError`` naming what of ``policy`` the operator forbids (see
        :func:`sandboxd.isolation.network.egress_policy.check_allowed`)."""
        check_allowed(self.egress.plan, policy, self.policy_entries_max)
        if policy.by_name and self.proxy is None:
            raise ValueError("host names in allow_out or deny_out need the egress proxy")
        if policy.socks5 is not None and self.proxy is None:
            raise ValueError("a SOCKS5 proxy of the sandbox's own needs the egress proxy")

    def stage_policy(self, rid: str, policy: EgressPolicy | None) -> None:
        """Keep ``policy`` for the sandbox ``rid``: its :meth:`attach` applies it before the
        create returns (``None``: forget it, the create failed before its attach)."""
        if policy is None:
            self._staged.pop(rid, None)
        else:
            self._staged[rid] = policy

    def set_policy(self, rid: str, policy: EgressPolicy) -> None:
        """Give the attached sandbox ``rid`` this policy (checked before with
        :meth:`check_policy`): its next new connection obeys it. ``OSError`` when ``nft``
        refuses (the previous policy stays)."""
        slot = self._slots[rid]
        plan = self.egress.plan
        script = policy_script(plan, slot, policy)
        before = self._policies.get(rid, OPEN)
        self._judge(rid, slot, policy)  # (before its connections reach the judge)
        try:
            self.egress.run(["nft", "-f", "-"], script)
        except EgressError as e:
            self._judge(rid, slot, before)
            raise OSError(errno.EIO, f"egress policy: {e}") from None
        self._policies[rid] = policy

    def _judge(self, rid: str, slot: int, policy: EgressPolicy) -> None:
        """Tell the judge ``policy`` when it is one the judge reads, else that the sandbox is
        judged no more."""
        if self.judge is None or not judged(self.egress.plan, policy):
            self._unjudge(rid)
            return
        self.judge.judge(rid, self.ifindex(self.egress.plan.ifname(slot)), policy)

    def _unjudge(self, rid: str) -> None:
        if self.judge is not None and self.egress.plan.judge:
            self.judge.forget(rid)

    def policy(self, rid: str) -> EgressPolicy:
        """The policy the attached sandbox ``rid`` has now."""
        return self._policies.get(rid, OPEN)

    def trust_bundle(self, policy: EgressPolicy, base: bytes | None = None) -> bytes:
        """The CA bundle a sandbox with ``policy`` sees (see
        :class:`~sandboxd.isolation.network.egress_policy.PolicyHolder`), while the proxy
        terminates TLS (:attr:`trusted`; else nothing): ``base`` (``None``: the host's
        bundle), and :attr:`trusted` after it when the policy has a header rule (no base:
        the CA alone, or nothing)."""
        if not self.trusted:
            return b""
        if base is None:
            base = self.host_bundle.read()
        if not policy.rules:
            return base
        return base.rstrip(b"\n") + b"\n" + self.trusted if base else self.trusted

    def sandbox_at(self, address: str) -> tuple[str, EgressPolicy] | None:
        """The attached sandbox whose veth's sandbox end has ``address``, with its policy now
        (how the egress proxy knows who connects); ``None`` for any other address."""
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            return None
        plan = self.egress.plan
        pool = plan.pool4 if parsed.version == 4 else plan.pool6
        if pool is None or parsed not in pool:
            return None
        slot, odd = divmod(int(parsed) - int(pool.network_address), 2)
        rid = self._rids.get(slot) if odd else None
        return None if rid is None else (rid, self.policy(rid))

    def _stop_when_idle(self) -> None:
        """Lazy, with no egress sandbox left (nor a slot wired ahead): give the host back what
        the layer changed."""
        if self.lazy and self._started and not self._slots and not self._ahead:
            try:
                self.close()
            except (EgressError, OSError) as e:
                log.warn("egress: cannot stop the layer: {why}", why=e)


def unreachable_nameservers(plan: EgressPlan, resolv_conf: str) -> list[str]:
    """The ``nameserver`` entries of ``resolv_conf`` that an egress sandbox cannot reach: in a
    denied range, and not among those the plan lets DNS through to."""
    deny4, deny6 = plan.denied()
    denied = [ipaddress.ip_network(n) for n in deny4 + deny6]
    found = []
    for text in nameservers(resolv_conf):
        try:
            address = ipaddress.ip_address(text.split("%")[0])
        except ValueError:
            continue
        if address not in plan.dns and any(address in net for net in denied):
            found.append(text)
    return found


def network_mode(config: Any) -> EgressNetwork | None:
    """The egress mode for the daemon's configuration; ``None`` when ``SANDBOXD_NETWORK_ALLOW``
    leaves it out.

    Asked for by name (``SANDBOXD_NETWORK=egress`` or in ``SANDBOXD_NETWORK_ALLOW``), the layer
    starts with the daemon; else it is offered by default and starts at the first egress
    create (see :class:`EgressNetwork`), and a kernel without IPv6 gets IPv4 egress alone
    unless ``SANDBOXD_EGRESS_POOL6`` was changed. ``IsolationUnavailable`` names what is
    missing when it cannot be provided (the caller decides whether that stops start-up).
    """
    named = egress_named(config)
    if not named and config.network_allow is not None:
        return None
    pool6 = config.egress_pool6
    if pool6 is not None and not os.path.isdir(IPV6_SYSCTLS):
        if named or pool6 != parse_pool6(DEFAULT_POOL6):
            raise IsolationUnavailable(
                "network mode egress: this kernel has no IPv6: set SANDBOXD_EGRESS_POOL6=none"
            )
        pool6 = None
    plan = EgressPlan(config.egress_pool, pool6, config.egress_deny)
    plan = plan.with_nameservers(read_text(config.resolv_conf))
    # a slot per uid, and one per namespace of the pool (SANDBOXD_NETNS_POOL) wired ahead
    capacity = config.uid_max - config.uid_min + 1 + config.netns_pool
    try:
        plan.check(capacity)
    except ValueError as e:
        raise IsolationUnavailable(f"network mode egress: SANDBOXD_EGRESS_POOL: {e}") from None
    for program, package in PROGRAMS:
        if shutil.which(program) is None:
            raise IsolationUnavailable(
                f"network mode egress: needs {program} (Debian package {package})"
            )
    egress = Egress(plan, state_file=STATE_FILE)
    return EgressNetwork(
        egress,
        capacity,
        lazy=not named,
        resolv_conf=config.resolv_conf,
        policy_entries_max=config.egress_policy_max,
    )
