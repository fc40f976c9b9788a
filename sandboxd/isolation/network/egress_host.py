"""The host side of the ``egress`` network mode (:mod:`sandboxd.isolation.network.egress`).

:class:`Egress` owns it for one daemon:

- :meth:`Egress.start` (start-up): takes the host-wide egress lock (one daemon per host owns the
  layer), reclaims what a crashed predecessor left (its veths, its table, the forwarding
  sysctls it found), turns IPv4 (and, with an IPv6 pool, IPv6) forwarding on if it is off —
  logging it, and remembering the values found in ``state_file`` — and loads the table
  ``inet {table}`` (see :meth:`EgressPlan.ruleset`).
- :meth:`Egress.attach` (create): makes the slot's veth pair with its sandbox end in the
  sandbox's (pinned) network namespace, addresses both ends, routes the sandbox through the
  host end, and returns once the link is up.
- :meth:`Egress.detach`: deletes a slot's veth (the kernel deletes both ends). A killed
  sandbox needs none: its veth goes with its namespace (see
  :class:`sandboxd.isolation.network.egress.EgressNetwork`).
- :meth:`Egress.stop` (stop): deletes every veth of ours and the table, and puts the sysctls back
  to what was found before the first daemon turned them on.

Every method blocks: :meth:`Egress.attach` only for its rtnetlink requests and the link coming
up, the others also for ``ip`` and ``nft`` runs (start-up, stop, a lingering veth). Nothing here
is per connection: once attached, the kernel does all the work.
"""

import fcntl
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Sequence

from attrs import define, field
from twisted.logger import Logger

from sandboxd.isolation.network import rtnl
from sandboxd.isolation.network.egress_plan import SANDBOX_IFNAME, EgressPlan

log = Logger()

FORWARDING_V4 = "/proc/sys/net/ipv4/ip_forward"
FORWARDING_V6 = "/proc/sys/net/ipv6/conf/all/forwarding"
UP_WAIT = 2.0
"""Longest :meth:`Egress.attach` waits for a new veth to come up (seconds)."""
PROGRAM_TIMEOUT = 300
"""Longest an ``nft`` or ``ip`` run may take before it counts as hung (seconds): generous, as
the first ruleset load pulls in kernel modules (over 30 s in an emulated VM on a busy host)."""

RunWithInput = Callable[[Sequence[str], str], str]
"""``run(argv, stdin_text)``: run a program, return its stdout; :class:`EgressError` if it fails."""


class EgressError(Exception):
    """The egress layer cannot do what was asked (the message names the step and the cause)."""


def run_program(argv: Sequence[str], stdin: str) -> str:
    """Run ``argv`` with ``stdin``; its stdout, or :class:`EgressError` with its stderr."""
    try:
        done = subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=PROGRAM_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EgressError(f"{argv[0]}: {e}") from None
    if done.returncode != 0:
        raise EgressError(f"{' '.join(argv[:3])}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def read_sysctl(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def write_sysctl(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def wire_veth(plan: EgressPlan, slot: int, netns: str) -> None:
    """Make the slot's veth pair, its sandbox end ``eth0`` in the namespace pinned at ``netns``,
    address both ends, bring them (and the sandbox's loopback) up and route the sandbox
    through the host end, over rtnetlink; ``OSError`` when the kernel refuses a step.

    The same with iproute2, for operators: ``ip link add sbxN type veth peer name eth0 netns
    PATH``, ``ip addr add H/31 dev sbxN`` (and ``H6/127 nodad``), ``ip link set sbxN up``, then
    inside (``nsenter --net=PATH``): ``ip addr add S/31 dev eth0`` (and ``S6/127 nodad``), ``ip
    link set eth0 up``, ``ip link set lo up``, ``ip route add default via H`` (and ``via H6``).
    """
    a = plan.addresses(slot)
    name = plan.ifname(slot)
    fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    host = rtnl.open_here()
    try:
        host.add_veth(name, SANDBOX_IFNAME, fd)
        index = socket.if_nametoindex(name)
        host.add_address(index, a.host4, 31)
        if a.host6 is not None:
            host.add_address(index, a.host6, 127)
        inside, eth0, lo = rtnl.socket_in(fd)
        try:
            inside.add_address(eth0, a.sandbox4, 31)
            if a.sandbox6 is not None:
                inside.add_address(eth0, a.sandbox6, 127)
            inside.set_up(eth0)
            inside.set_up(lo)
            inside.add_default_route(eth0, a.host4)
            if a.host6 is not None:
                inside.add_default_route(eth0, a.host6)
        finally:
            inside.close()
    finally:
        host.close()
        os.close(fd)


@define
class Egress:
    """The host side of the egress mode (see the module docstring)."""

    plan: EgressPlan
    state_file: str
    """Where the forwarding values found at the first start are kept until the last stop."""
    lock_file: str = "/run/sandboxd-egress.lock"
    run: RunWithInput = run_program
    read: Callable[[str], str] = read_sysctl
    write: Callable[[str, str], None] = write_sysctl
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    exists: Callable[[str], bool] = os.path.exists
    wire: Callable[[EgressPlan, int, str], None] = wire_veth
    _lock_fd: int | None = field(default=None, init=False)

    def _sysctls(self) -> list[str]:
        return [FORWARDING_V4] + ([FORWARDING_V6] if self.plan.pool6 is not None else [])

    def start(self) -> list[int]:
        """Prepare the host (see the module docstring); the slots reclaimed from a predecessor.

        :class:`EgressError` when the layer cannot be provided here (another daemon owns it, a
        program is missing, the kernel refuses the ruleset); nothing of ours is left then.
        """
        self._lock()
        try:
            reclaimed = self.reclaim()
            found = self._found_sysctls()
            for path in self._sysctls():
                if self.read(path) != "1":
                    log.warn("egress: turning forwarding on ({path} = 1)", path=path)
                    self.write(path, "1")
            # Forwarding that was off before us must forward nothing but our sandboxes' traffic.
            policy = "drop" if any(value != "1" for value in found.values()) else "accept"
            self.run(["nft", "-f", "-"], self.plan.ruleset(policy))
        except BaseException:
            self._restore_sysctls()
            self._unlock()
            raise
        log.info(
            "egress: table inet {table} loaded, pool {pool4} {pool6}, forward policy {policy}",
            table=self.plan.table,
            pool4=self.plan.pool4,
            pool6=self.plan.pool6 or "(no IPv6)",
            policy=policy,
        )
        return reclaimed

    def _found_sysctls(self) -> dict[str, str]:
        """The forwarding values found before any daemon changed them (kept in the state file)."""
        found: dict[str, str] = {}
        try:
            with open(self.state_file) as f:
                found = json.load(f)
        except FileNotFoundError:
            pass
        missing = [path for path in self._sysctls() if path not in found]
        if not missing:
            return found
        found.update({path: self.read(path) for path in missing})
        tmp = self.state_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(found, f)
        os.replace(tmp, self.state_file)
        return found

    def _restore_sysctls(self) -> None:
        try:
            with open(self.state_file) as f:
                found: dict[str, str] = json.load(f)
        except FileNotFoundError:
            return
        for path, value in found.items():
            if self.read(path) != value:
                log.info(
                    "egress: forwarding back to what was found ({path} = {v})", path=path, v=value
                )
                self.write(path, value)
        os.unlink(self.state_file)

    def attach(self, netns: str, slot: int) -> None:
        """Give the sandbox whose network namespace is pinned at ``netns`` its slot's veth.

        On failure nothing of the slot is left and :class:`EgressError` says why.
        """
        if not os.path.isabs(netns):
            raise ValueError(f"network namespace path must be absolute: {netns!r}")
        self._delete_link(self.plan.ifname(slot))  # a predecessor's, still there
        try:
            self.wire(self.plan, slot, netns)
        except OSError as e:
            self._delete_link(self.plan.ifname(slot))
            raise EgressError(f"attach {self.plan.ifname(slot)} to {netns}: {e}") from None
        self._wait_up(self.plan.ifname(slot))

    def _wait_up(self, name: str) -> None:
        """Wait until the kernel's link watcher has made the veth usable: until then its queue
        discards what is sent, and a sandbox's first connection loses its SYN (a 1 s retry)."""
        path = f"/sys/class/net/{name}/operstate"
        deadline = self.clock() + UP_WAIT
        while self.read(path) != "up":
            if self.clock() > deadline:
                log.warn("egress: {name} is not up yet; first packets may be lost", name=name)
                return
            self.sleep(0.0005)

    def detach(self, slot: int) -> None:
        """Delete the slot's veth pair (a missing one is not an error)."""
        self._delete_link(self.plan.ifname(slot))

    def links(self) -> list[int]:
        """The slots whose veths exist on the host now."""
        out = self.run(["ip", "-json", "link", "show", "type", "veth"], "")
        slots = []
        for link in json.loads(out or "[]"):
            slot = self.plan.slot_of(str(link.get("ifname", "")))
            if slot is not None:
                slots.append(slot)
        return sorted(slots)

    def reclaim(self) -> list[int]:
        """Delete every veth of ours and our table (a crashed predecessor's); the slots freed."""
        slots = self.links()
        for slot in slots:
            self.detach(slot)
        self._delete_table()
        return slots

    def stop(self) -> None:
        """Remove everything :meth:`start` and :meth:`attach` made, restore the sysctls."""
        try:
            self.reclaim()
        finally:
            self._restore_sysctls()
            self._unlock()
        log.info("egress: table inet {table} removed", table=self.plan.table)

    def _delete_link(self, name: str) -> None:
        if self.exists(f"/sys/class/net/{name}"):
            try:
                self.run(["ip", "link", "del", name], "")
            except EgressError:
                if self.exists(f"/sys/class/net/{name}"):  # else the kernel deleted it meanwhile
                    raise

    def _delete_table(self) -> None:
        self.run(
            ["nft", "-f", "-"],
            f"table inet {self.plan.table}\ndelete table inet {self.plan.table}\n",
        )

    def _lock(self) -> None:
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise EgressError(
                f"another sandboxd owns the egress network on this host ({self.lock_file})"
            ) from None
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
