"""The egress network's plan: address pool, denied ranges, interface names and the nft ruleset.

Pure values only (nothing here touches the machine; :mod:`sandboxd.isolation.network.egress` applies
them). Each sandbox in ``egress`` mode gets a *slot*: a veth pair whose host end is
``{prefix}{slot}`` and whose sandbox end is ``eth0`` inside the sandbox's network namespace, a
``/31`` of the IPv4 pool (host end even, sandbox end odd) and, when an IPv6 pool is set, a
``/127`` of it. Those addresses exist only on this host's veths.

The ruleset (table ``inet {table}``) lets a sandbox open new connections to the outside world
(masqueraded behind the host's own address) and nothing else: nothing addressed to the host
itself (its loopback, every address of every interface, hence the daemon's API wherever it
listens) is accepted from a sandbox veth; nothing is forwarded from one sandbox veth to another,
nor to a denied range (the pools, loopback, link-local, multicast and the configured ranges,
by default the private and shared ones: :data:`PRIVATE_RANGES`), except DNS (port 53, UDP and
TCP) to the host's nameservers (:attr:`EgressPlan.dns`); nothing is forwarded into a sandbox but
the replies of its own connections. What the operator lets through, each sandbox may narrow
further: its veth maps to a chain of its own in the ``policies`` verdict map (see
:mod:`sandboxd.isolation.network.egress_policy`), looked at only after every rule above.
A sandbox whose policy names hosts has its veth in the ``proxied`` set: its web traffic is
redirected (``proxy_redirect``, a NAT chain made with the first such policy, so that a
kernel without NAT in the ``inet`` family, before Linux 5.2, loses only names) to the
daemon's egress proxy, the one thing of the host such a sandbox reaches (and only so
redirected). With :attr:`EgressPlan.proxy_all` (an operator's SOCKS5 proxy is the way out)
every sandbox's TCP is redirected so (``proxy_all`` chain; TCP DNS to the nameservers
aside) and nothing of a sandbox's is forwarded but DNS to :attr:`EgressPlan.dns`: no
connection leaves directly, even while the proxy is down.
"""

import ipaddress
from collections.abc import Iterable, Sequence

from attrs import evolve, frozen

from sandboxd.isolation.network.egress_judge_plan import WEB_PORTS, judge_chains, verdict_rules

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

SANDBOX_IFNAME = "eth0"
"""The name of the sandbox's end of its veth, inside its network namespace."""

MAX_IFNAME = 15
"""The kernel's limit on an interface name (``IFNAMSIZ`` - 1)."""

ALWAYS_DENIED_4 = (
    "0.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
)
"""IPv4 ranges no sandbox ever reaches: this-network, loopback, link-local (cloud metadata
services such as 169.254.169.254), multicast, reserved and broadcast."""

PRIVATE_RANGES = "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,100.64.0.0/10,fc00::/7"
"""The default of ``SANDBOXD_EGRESS_DENY``: the private (RFC 1918, RFC 4193) and shared
(RFC 6598) ranges, where a cluster's pods and services, a LAN or a cloud network live."""

DEFAULT_POOL6 = "fd53:616e:6462:6f78::/64"
"""The default of ``SANDBOXD_EGRESS_POOL6``."""

DNS_PORT = 53

ALWAYS_DENIED_6 = ("::/127", "::ffff:0:0/96", "fe80::/10", "ff00::/8")
"""IPv6 ranges no sandbox ever reaches: unspecified and loopback, IPv4-mapped, link-local,
multicast."""


class EgressConfigError(ValueError):
    """An egress setting cannot be used (the message says why)."""


def parse_network(text: str) -> Network:
    """One CIDR (``10.0.0.0/8``, ``fd00::/8``; a bare address is a single host)."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError as e:
        raise EgressConfigError(f"{text.strip()!r} is not an address range: {e}") from None


def parse_networks(text: str) -> tuple[Network, ...]:
    """A list of CIDRs separated by commas and/or spaces (empty: none)."""
    return tuple(parse_network(part) for part in text.replace(",", " ").split())


def parse_pool4(text: str) -> ipaddress.IPv4Network:
    """The IPv4 pool: an IPv4 CIDR of at least two addresses."""
    net = parse_network(text)
    if not isinstance(net, ipaddress.IPv4Network) or net.prefixlen > 31:
        raise EgressConfigError(f"{text.strip()!r} is not an IPv4 range of /31 or larger")
    return net


def parse_pool6(text: str) -> ipaddress.IPv6Network | None:
    """The IPv6 pool, or ``None`` for ``none``/``off``/empty (no IPv6 egress)."""
    if text.strip().lower() in ("", "none", "off"):
        return None
    net = parse_network(text)
    if not isinstance(net, ipaddress.IPv6Network) or net.prefixlen > 127:
        raise EgressConfigError(f"{text.strip()!r} is not an IPv6 range of /127 or larger")
    return net


@frozen
class SlotAddresses:
    """The addresses of one slot: host end and sandbox end, IPv4 and (optional) IPv6."""

    host4: ipaddress.IPv4Address
    sandbox4: ipaddress.IPv4Address
    host6: ipaddress.IPv6Address | None
    sandbox6: ipaddress.IPv6Address | None


@frozen
class EgressPlan:
    """Everything the egress layer needs to know, fixed at start-up."""

    pool4: ipaddress.IPv4Network
    pool6: ipaddress.IPv6Network | None
    deny: tuple[Network, ...] = ()
    dns: tuple[Address, ...] = ()
    """Nameservers a sandbox may reach on port 53 (UDP and TCP) even in a denied range (see
    :meth:`with_nameservers`)."""
    table: str = "sandboxd"
    prefix: str = "sbx"
    proxy_port: int = 0
    """The egress proxy's port while it listens (``0``: none), which only sandbox veths reach."""
    proxy_all: bool = False
    """Every sandbox's TCP goes to the egress proxy, nothing but DNS is forwarded (the
    operator's SOCKS5 proxy is the only way out: docs/isolation.rst, "Egress through a
    SOCKS5 proxy")."""
    judge: bool = False
    """The egress judge runs (:mod:`.egress_judge_plan`): the table has its set and chains,
    and a policy by name without header rules is judged in place of proxied."""

    @property
    def slots(self) -> int:
        """How many sandboxes the pools can address at once."""
        count = self.pool4.num_addresses // 2
        if self.pool6 is not None:
            count = min(count, self.pool6.num_addresses // 2)
        return count

    def check(self, slots_needed: int) -> None:
        """``EgressConfigError`` unless the pools hold ``slots_needed`` slots and the names fit."""
        if self.slots < slots_needed:
            raise EgressConfigError(
                f"the pool has {self.slots} slots (a /31 and a /127 per sandbox),"
                f" {slots_needed} needed (one per uid of the pool and per namespace of"
                " SANDBOXD_NETNS_POOL)"
            )
        if len(self.ifname(max(slots_needed - 1, 0))) > MAX_IFNAME:
            raise EgressConfigError(f"interface prefix {self.prefix!r} is too long")
        if not self.prefix.isidentifier() or not self.table.isidentifier():
            raise EgressConfigError("interface prefix and table must be plain identifiers")

    def ifname(self, slot: int) -> str:
        """The host end of a slot's veth."""
        return f"{self.prefix}{slot}"

    def slot_of(self, ifname: str) -> int | None:
        """The slot of a host-end name (``None`` for any other interface)."""
        rest = ifname[len(self.prefix) :] if ifname.startswith(self.prefix) else ""
        return int(rest) if rest.isdigit() and str(int(rest)) == rest else None

    def addresses(self, slot: int) -> SlotAddresses:
        """A slot's addresses; ``ValueError`` outside the pool."""
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is outside the pool ({self.slots} slots)")
        base4 = self.pool4.network_address + 2 * slot
        host6 = sandbox6 = None
        if self.pool6 is not None:
            host6 = self.pool6.network_address + 2 * slot
            sandbox6 = host6 + 1
        return SlotAddresses(base4, base4 + 1, host6, sandbox6)

    def denied(self) -> tuple[list[str], list[str]]:
        """The denied destinations (IPv4, IPv6) as collapsed CIDR texts."""
        v4: list[Network] = [parse_network(n) for n in ALWAYS_DENIED_4]
        v6: list[Network] = [parse_network(n) for n in ALWAYS_DENIED_6]
        v4.append(self.pool4)
        if self.pool6 is not None:
            v6.append(self.pool6)
        for net in self.deny:
            (v4 if net.version == 4 else v6).append(net)
        return _collapsed(v4), _collapsed(v6)

    def with_nameservers(self, resolv_conf: str) -> "EgressPlan":
        """This plan letting DNS through to the ``nameserver`` entries of ``resolv_conf`` (the
        host's): a pod's resolver is usually a private cluster address (``10.96.0.10``), which
        the default denied ranges hold. Never to a loopback, unspecified, multicast, IPv6
        link-local (``fe80::1%eth0``), IPv4-mapped or pool address: those name the host itself
        or nothing a sandbox can reach. (An IPv4 link-local one stays: some clouds' resolver is
        169.254.169.253 or the metadata address; only its port 53 is let through.)"""
        allowed: list[Address] = []
        for text in nameservers(resolv_conf):
            try:
                address = ipaddress.ip_address(text)
            except ValueError:
                continue
            v6_unroutable = isinstance(address, ipaddress.IPv6Address) and bool(
                address.is_link_local or address.ipv4_mapped
            )
            pools = [net for net in (self.pool4, self.pool6) if net is not None]
            if (
                address.is_loopback
                or address.is_unspecified
                or address.is_multicast
                or v6_unroutable
                or any(address in net for net in pools)
            ):
                continue
            allowed.append(address)
        return evolve(self, dns=tuple(dict.fromkeys(allowed)))

    def ruleset(self, forward_policy: str) -> str:
        """``nft -f`` input that replaces our table atomically.

        ``forward_policy`` is ``drop`` when this daemon turned forwarding on itself (then nothing
        but our sandboxes' traffic may be forwarded because of it), ``accept`` when forwarding
        was already on (another party's forwarding stays theirs; ours is still constrained).
        """
        if forward_policy not in ("accept", "drop"):
            raise ValueError(forward_policy)
        deny4, deny6 = self.denied()
        dns = ""
        for family, version in (("ip", 4), ("ip6", 6)):
            servers = [str(a) for a in self.dns if a.version == version]
            if servers:
                dns += (
                    f"\n    {family} daddr {{ {', '.join(servers)} }}"
                    f" meta l4proto {{ tcp, udp }} th dport {DNS_PORT} accept"
                )
        masquerade6 = ""
        if self.pool6 is not None:
            masquerade6 = f"\n    ip6 saddr {self.pool6} oifname != {{veth}} masquerade"
        veth = f'"{self.prefix}*"'
        guard = ""
        if self.proxy_port:  # the proxy listens on every address: for sandboxes alone
            guard = f"\n    iifname != {veth} tcp dport {self.proxy_port} reject with tcp reset"
        nd = "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255"
        reject = "reject with icmpx type admin-prohibited"
        to_proxy = only_dns = proxy_all = judge = verdicts = ""
        if self.judge:
            judge = judge_chains(veth, WEB_PORTS)
            verdicts = "".join(f"\n    {rule}" for rule in verdict_rules())
        if self.proxy_all:  # (no port: nothing is redirected, and nothing leaves either)
            to_proxy = f"\n    iifname {veth} meta l4proto tcp ct status dnat accept"
            only_dns = f"\n    {reject}"
            proxy_all = self._proxy_all(veth)
        return f"""table inet {self.table}
delete table inet {self.table}
table inet {self.table} {{
  set deny4 {{ type ipv4_addr; flags interval; elements = {{ {", ".join(deny4)} }} }}
  set deny6 {{ type ipv6_addr; flags interval; elements = {{ {", ".join(deny6)} }} }}
  map policies {{ type ifname : verdict; }}
  set proxied {{ type ifname; }}
  set tunneled {{ type ifname; }}
{judge}  chain prerouting {{
    type filter hook prerouting priority -300; policy accept;
    iifname {veth} ip6 saddr fe80::/10 accept
    iifname {veth} fib saddr . iif oif missing drop
  }}
  chain input {{
    type filter hook input priority 0; policy accept;{guard}
    iifname {veth} {nd} accept
    iifname @proxied meta l4proto tcp ct status dnat accept{to_proxy}
    iifname {veth} {reject}
  }}
  chain output {{
    type filter hook output priority 0; policy accept;
    oifname {veth} {nd} accept
    oifname {veth} ct state established,related accept
    oifname {veth} {reject}
  }}
  chain forward {{
    type filter hook forward priority 0; policy {forward_policy};
    iifname {veth} jump from_sandbox
    oifname {veth} ct state established,related accept
    oifname {veth} drop
  }}
  chain from_sandbox {{{verdicts}
    oifname {veth} {reject}
    ct state established,related accept{dns}{only_dns}
    ip daddr @deny4 {reject}
    ip6 daddr @deny6 {reject}
    fib daddr type {{ local, broadcast, multicast, anycast }} {reject}
    iifname vmap @policies
    ct state new accept
    drop
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {self.pool4} oifname != {veth} masquerade{masquerade6.format(veth=veth)}
  }}{proxy_all}
}}
"""

    def _proxy_all(self, veth: str) -> str:
        """The NAT chain redirecting every sandbox's TCP to the proxy (TCP DNS to the
        nameservers aside, which the forward chain lets through)."""
        if not self.proxy_port:
            return ""
        dns = ""
        for family, version in (("ip", 4), ("ip6", 6)):
            servers = [str(a) for a in self.dns if a.version == version]
            if servers:
                dns += (
                    f"\n    {family} daddr {{ {', '.join(servers)} }} tcp dport {DNS_PORT} accept"
                )
        return f"""
  chain proxy_all {{
    type nat hook prerouting priority -100; policy accept;{dns}
    iifname {veth} meta l4proto tcp redirect to :{self.proxy_port}
  }}"""

    def resolv_conf(self, nameservers: Sequence[str]) -> str:
        """A ``resolv.conf`` naming ``nameservers`` (for a sandbox's mount namespace)."""
        return "".join(f"nameserver {ipaddress.ip_address(ns)}\n" for ns in nameservers)


@frozen
class Nameserver:
    """One nameserver of ``SANDBOXD_EGRESS_DNS``."""

    host: str
    port: int = DNS_PORT

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_dns_servers(text: str) -> tuple[Nameserver, ...]:
    """``SANDBOXD_EGRESS_DNS``: nameservers separated by commas or spaces, each an address,
    ``ADDRESS:PORT`` (IPv4) or ``[ADDRESS]:PORT``; ``ValueError`` naming a bad one."""
    found = []
    for part in text.replace(",", " ").split():
        host, port = part, DNS_PORT
        if part.startswith("["):
            host, _, rest = part[1:].partition("]")
            port = int(rest[1:]) if rest.startswith(":") else DNS_PORT
        elif part.count(":") == 1:
            host, _, number = part.partition(":")
            port = int(number) if number.isdigit() else -1
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"{part!r} is not a nameserver address") from None
        if not 0 < port < 65536:
            raise ValueError(f"{part!r}: the port is not a port number")
        found.append(Nameserver(str(address), port))
    return tuple(found)


def nameservers(resolv_conf: str) -> list[str]:
    """The ``nameserver`` entries of a ``resolv.conf`` text, as written."""
    found = []
    for line in resolv_conf.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            found.append(words[1])
    return found


def _collapsed(nets: Iterable[Network]) -> list[str]:
    return [str(n) for n in ipaddress.collapse_addresses(nets)]  # type: ignore[type-var]
