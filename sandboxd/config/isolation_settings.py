"""The settings of how each sandbox is isolated: its cgroup driver, namespaces, network mode
and egress, system call filter, umask, and how its commands are started (a group of
:class:`sandboxd.config.Config`; docs/isolation.rst)."""

from ipaddress import IPv4Network, IPv6Network

from attrs import frozen

from sandboxd.isolation.namespaces.kinds import parse_namespaces
from sandboxd.isolation.network.egress_plan import (
    DEFAULT_POOL6,
    PRIVATE_RANGES,
    Nameserver,
    parse_dns_servers,
    parse_networks,
    parse_pool4,
    parse_pool6,
)
from sandboxd.isolation.network.egress_socks import SocksAddress, parse_socks_address
from sandboxd.isolation.network.modes import parse_mode, parse_modes
from sandboxd.settings import (
    choice,
    nonempty_text,
    octal_umask,
    optional,
    optional_text,
    setting_field,
)
from sandboxd.units import parse_count, parse_duration

ISOLATION_MODES = ("auto", "cgroup2", "cgroup1", "none")
SECCOMP_MODES = ("default", "off")
SOCKET_BUFFER_MODES = ("charged", "off")
PLACEMENT_MODES = ("spread", "shared")
SPAWNER_MODES = ("helper", "server", "zygote")


@frozen(slots=False)  # (a base of Config, whose own slots hold every setting)
class IsolationSettings:
    """Each sandbox's isolation layers, network and egress, and its commands' start."""

    isolation: str = setting_field(
        "SANDBOXD_ISOLATION",
        "auto",
        choice(ISOLATION_MODES),
        "auto, cgroup2, cgroup1 or none (none: development only)",
    )
    namespaces: frozenset[str] = setting_field(
        "SANDBOXD_NAMESPACES",
        "all",
        parse_namespaces,
        "Namespace layers per sandbox: all, none, or some of ipc,mount,net,pid",
    )
    network: str | None = setting_field(
        "SANDBOXD_NETWORK",
        None,
        optional(parse_mode),
        "Default network mode of a create: none, egress or host (default: the strongest allowed)",
    )
    network_allow: tuple[str, ...] | None = setting_field(
        "SANDBOXD_NETWORK_ALLOW",
        None,
        optional(parse_modes),
        "Network modes a create may ask for, separated by commas (default: every one offered)",
    )
    egress_pool: IPv4Network = setting_field(
        "SANDBOXD_EGRESS_POOL",
        "10.200.0.0/16",
        parse_pool4,
        "IPv4 range of the egress mode's veths, a /31 per sandbox (only on this host)",
    )
    egress_pool6: IPv6Network | None = setting_field(
        "SANDBOXD_EGRESS_POOL6",
        DEFAULT_POOL6,
        parse_pool6,
        "IPv6 range of the egress mode's veths, a /127 per sandbox (none: no IPv6 egress)",
        unset="none",
    )
    egress_deny: tuple[IPv4Network | IPv6Network, ...] = setting_field(
        "SANDBOXD_EGRESS_DENY",
        PRIVATE_RANGES,
        parse_networks,
        "Ranges egress sandboxes may not reach, besides loopback, link-local, the host, the pool"
        " (default: the private and shared ranges; empty: none)",
    )
    netns_pool: int = setting_field(
        "SANDBOXD_NETNS_POOL",
        "0",
        parse_count,
        "Network namespaces of the egress mode made and wired ahead of need (0: none, each"
        " create makes its own)",
    )
    egress_policy_max: int = setting_field(
        "SANDBOXD_EGRESS_POLICY_MAX",
        "1024",
        parse_count,
        "Most entries in one allow_out or deny_out list of a sandbox's egress policy",
    )
    egress_dns: tuple[Nameserver, ...] = setting_field(
        "SANDBOXD_EGRESS_DNS",
        "",
        parse_dns_servers,
        "Nameservers the egress proxy resolves policies' host names with, ADDRESS or"
        " ADDRESS:PORT, separated by commas (empty: those of SANDBOXD_RESOLV_CONF)",
    )
    egress_socks5: SocksAddress | None = setting_field(  # noqa: RUF009 (frozen: immutable)
        "SANDBOXD_EGRESS_SOCKS5",
        "",
        optional(parse_socks_address),
        "SOCKS5 proxy, HOST:PORT, that every TCP connection of egress sandboxes leaves"
        " through, never directly (empty: none)",
    )
    egress_socks5_user: str | None = setting_field(
        "SANDBOXD_EGRESS_SOCKS5_USER",
        "",
        optional_text,
        "User name sent to the SOCKS5 proxy (with SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE)",
    )
    egress_socks5_password_file: str | None = setting_field(
        "SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE",
        None,
        optional_text,
        "File holding the password sent to the SOCKS5 proxy (root-only)",
        secret=True,
    )
    egress_upstream_ca: str | None = setting_field(
        "SANDBOXD_EGRESS_UPSTREAM_CA",
        None,
        optional_text,
        "PEM file of the CAs an upstream of a header rule over HTTPS must chain to (empty:"
        " the host's trust store)",
    )
    egress_judge: str = setting_field(
        "SANDBOXD_EGRESS_JUDGE",
        "on",
        choice(("off", "on")),
        "on: the names of egress policies without header rules are read by the judge"
        " (sandboxd-judge on an NFQUEUE, iptables-nft) and their connections forwarded by the"
        " kernel; off: the egress proxy reads and relays them all",
    )
    resolv_conf: str = setting_field(
        "SANDBOXD_RESOLV_CONF",
        "/etc/resolv.conf",
        nonempty_text,
        "File whose nameservers egress sandboxes may reach on port 53 even in a denied range",
    )
    seccomp: str = setting_field(
        "SANDBOXD_SECCOMP",
        "default",
        choice(SECCOMP_MODES),
        "System call filter of every command: default or off",
    )
    umask: int = setting_field(
        "SANDBOXD_UMASK",
        "077",
        octal_umask,
        "umask of every command (octal; 077: nothing readable by another uid)",
    )
    spawner: str = setting_field(
        "SANDBOXD_SPAWNER",
        "zygote",
        choice(SPAWNER_MODES),
        "How isolated execs start: zygote (a spawn server, and a zygote per sandbox running"
        " execs forks them), server (the spawn server alone starts them) or helper (a spawn"
        " of the exec helper each)",
    )
    zygote_quiet: float = setting_field(
        "SANDBOXD_ZYGOTE_QUIET",
        "60s",
        parse_duration,
        "A sandbox's zygote is retired after this long with no exec (SANDBOXD_SPAWNER=zygote)",
    )
    zygotes_max: int = setting_field(
        "SANDBOXD_ZYGOTES_MAX",
        "256",
        parse_count,
        "Most zygotes alive at once (one pid each); past it execs go to the spawn server",
    )
    cpu_placement: str = setting_field(
        "SANDBOXD_CPU_PLACEMENT",
        "spread",
        choice(PLACEMENT_MODES),
        "Each sandbox on as many CPUs as its quota covers, the least held (spread),"
        " or every sandbox on every CPU (shared)",
    )
    socket_buffers: str = setting_field(
        "SANDBOXD_SOCKET_BUFFERS",
        "charged",
        choice(SOCKET_BUFFER_MODES),
        "Charge socket buffers to the sandbox's memory limit: charged or off",
    )
