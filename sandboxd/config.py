"""The daemon's configuration: one table of settings, read from ``SANDBOXD_*`` and options.

Every setting has an environment variable and a ``twistd sandboxd --option`` of the same name;
the option wins. A value that does not parse raises :class:`ConfigError` naming the variable, so
start-up stops with one clear line.
"""

from collections.abc import Mapping
from ipaddress import IPv4Network, IPv6Network
from typing import Any

from attrs import fields, frozen

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
from sandboxd.listen import DUAL_STACK_MODES
from sandboxd.settings import (
    choice,
    connections,
    flag,
    nonempty_text,
    octal_umask,
    optional,
    optional_count,
    optional_duration,
    optional_size,
    optional_text,
    setting_field,
    setting_text,
)
from sandboxd.units import (
    parse_cores,
    parse_count,
    parse_duration,
    parse_size,
)

ISOLATION_MODES = ("auto", "cgroup2", "cgroup1", "none")
SECCOMP_MODES = ("default", "off")
SOCKET_BUFFER_MODES = ("charged", "off")
SPAWNER_MODES = ("helper", "server", "zygote")
LOG_FORMATS = ("text", "json")
AUTH_GATE_MODES = ("headers", "off")
BUILD_NETWORKS = ("none", "host")
DEFAULT_LISTEN = "tcp:8080"


class ConfigError(Exception):
    """A setting has a value that cannot be used; the message names the variable."""


@frozen
class Config:
    """The effective configuration. Sizes are bytes, durations seconds, cores a float."""

    listen: str = setting_field(
        "SANDBOXD_LISTEN",
        None,
        nonempty_text,
        "Twisted endpoint string to listen on (default: tcp:8080 with a token, else"
        " tcp:8080:interface=127.0.0.1)",
    )
    dual_stack: str = setting_field(
        "SANDBOXD_DUAL_STACK",
        "on",
        choice(DUAL_STACK_MODES),
        "Claim a tcp: port on IPv4 and IPv6 alike (on), or listen as the endpoint says (off)",
    )
    insecure: bool = setting_field(
        "SANDBOXD_INSECURE",
        "no",
        flag,
        "Allow listening beyond loopback with no token (anyone reaching the port runs code)",
        flag=True,
    )
    e2b_listen: str | None = setting_field(
        "SANDBOXD_E2B_LISTEN",
        None,
        optional_text,
        "Twisted endpoint string of the E2B-compatible front (default: off)",
    )
    e2b_domain: str | None = setting_field(
        "SANDBOXD_E2B_DOMAIN",
        None,
        optional_text,
        "Domain of the E2B front's port hosts, {port}-{sandbox_id}.DOMAIN (default: off)",
    )
    build_network: str = setting_field(
        "SANDBOXD_BUILD_NETWORK",
        "none",
        choice(BUILD_NETWORKS),
        "Network of a template build's RUN steps when the build names none (E2B's never do):"
        " none, or host (apt-get, pip install)",
    )
    pod_url: str | None = setting_field(
        "SANDBOXD_POD_URL",
        None,
        optional_text,
        "This replica's own URL (default: from POD_IP and the port)",
    )
    root: str = setting_field(
        "SANDBOXD_ROOT",
        "/var/lib/sandboxd/sandboxes",
        nonempty_text,
        "Directory holding one directory per sandbox",
    )
    uid_min: int = setting_field(
        "SANDBOXD_UID_MIN", "200000", parse_count, "First uid/gid of the sandbox pool"
    )
    uid_max: int = setting_field(
        "SANDBOXD_UID_MAX", "201999", parse_count, "Last uid/gid of the sandbox pool"
    )
    memory_max: int = setting_field(
        "SANDBOXD_MEMORY_MAX", "512M", parse_size, "Memory limit of each sandbox (e.g. 512M)"
    )
    cpu_cores: float = setting_field(
        "SANDBOXD_CPU_CORES", "1.0", parse_cores, "CPU limit of each sandbox in cores (e.g. 1.5)"
    )
    pids_max: int = setting_field(
        "SANDBOXD_PIDS_MAX", "256", parse_count, "Process limit of each sandbox"
    )
    disk_max: int | None = setting_field(
        "SANDBOXD_DISK_MAX",
        None,
        optional_size,
        "Bytes each sandbox may store (e.g. 1G; needs btrfs or ext4/XFS project quotas)",
    )
    files_max: int | None = setting_field(
        "SANDBOXD_FILES_MAX",
        None,
        optional_count,
        "Files each sandbox may make (needs btrfs or ext4/XFS project quotas)",
    )
    cgroup_root: str | None = setting_field(
        "SANDBOXD_CGROUP_ROOT", None, optional_text, "Cgroup subtree to manage (default: detect)"
    )
    exec_timeout: float = setting_field(
        "SANDBOXD_EXEC_TIMEOUT", "10m", parse_duration, "Longest an exec may run (exit 124 after)"
    )
    log_timeout: float = setting_field(
        "SANDBOXD_LOG_TIMEOUT",
        "5m",
        parse_duration,
        "Longest an exec may stay silent (exit 124 after)",
    )
    idle_ttl: float = setting_field(
        "SANDBOXD_IDLE_TTL", "30m", parse_duration, "Kill sandboxes idle this long"
    )
    drain_deadline: float = setting_field(
        "SANDBOXD_DRAIN_DEADLINE", "60s", parse_duration, "Longest a drain waits for busy sandboxes"
    )
    drain_idle: float = setting_field(
        "SANDBOXD_DRAIN_IDLE",
        "10s",
        parse_duration,
        "During a drain, kill a sandbox after this long with no call, command or output",
    )
    archive_root: str | None = setting_field(
        "SANDBOXD_ARCHIVE_ROOT",
        None,
        optional_text,
        "Archive directory for persist/restore (default: none)",
    )
    template_max: int = setting_field(
        "SANDBOXD_TEMPLATE_MAX",
        "4G",
        parse_size,
        "Most bytes of one template's files (an import past it is refused)",
    )
    build_memory_max: int = setting_field(
        "SANDBOXD_BUILD_MEMORY_MAX",
        "1G",
        parse_size,
        "Memory limit of each command a template build runs (e.g. 1G)",
    )
    build_cpu_cores: float = setting_field(
        "SANDBOXD_BUILD_CPU_CORES",
        "1.0",
        parse_cores,
        "CPU limit of each command a template build runs, in cores",
    )
    build_pids_max: int = setting_field(
        "SANDBOXD_BUILD_PIDS_MAX",
        "512",
        parse_count,
        "Process limit of each command a template build runs",
    )
    build_timeout: float = setting_field(
        "SANDBOXD_BUILD_TIMEOUT",
        "30m",
        parse_duration,
        "Longest a template build may run (then its step is killed and it fails)",
    )
    tools_dir: str = setting_field(
        "SANDBOXD_TOOLS_DIR",
        "/var/lib/sandboxd/tools",
        nonempty_text,
        "Directory of installed third-party tools",
    )
    token_file: str | None = setting_field(
        "SANDBOXD_TOKEN_FILE",
        None,
        optional_text,
        "File holding the bearer token (root-only)",
        secret=True,
    )
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
    socket_buffers: str = setting_field(
        "SANDBOXD_SOCKET_BUFFERS",
        "charged",
        choice(SOCKET_BUFFER_MODES),
        "Charge socket buffers to the sandbox's memory limit: charged or off",
    )
    max_output: int = setting_field(
        "SANDBOXD_MAX_OUTPUT",
        "16M",
        parse_size,
        "Bytes of stdout and of stderr kept per exec for the final frame",
    )
    max_body: int = setting_field(
        "SANDBOXD_MAX_BODY", "8G", parse_size, "Largest request body (uploads) accepted"
    )
    keepalive: float = setting_field(
        "SANDBOXD_KEEPALIVE",
        "5s",
        parse_duration,
        'Interval of {"o": ""} frames while an exec is silent',
    )
    process_log_max: int = setting_field(
        "SANDBOXD_PROCESS_LOG_MAX",
        "16M",
        parse_size,
        "Bytes of output kept per background process (older bytes fall out)",
    )
    terminal_scrollback: int = setting_field(
        "SANDBOXD_TERMINAL_SCROLLBACK",
        "1M",
        parse_size,
        "Bytes of a terminal's output kept for a client that attaches later (older bytes fall out)",
    )
    processes_max: int = setting_field(
        "SANDBOXD_PROCESSES_MAX",
        "16",
        parse_count,
        "Background process records kept per sandbox (the oldest ended pushed out)",
    )
    walk_max: int = setting_field(
        "SANDBOXD_WALK_MAX",
        "200000",
        parse_count,
        "Most files one walk lists (413 past it)",
    )
    walk_bytes_max: int = setting_field(
        "SANDBOXD_WALK_BYTES_MAX",
        "64M",
        parse_size,
        "Largest walk body (413 past it: a deep tree repeats long paths in every entry)",
    )
    watch_max: int = setting_field(
        "SANDBOXD_WATCH_MAX", "8", parse_count, "Workspace watches open at once per sandbox"
    )
    port_connections_max: int = setting_field(
        "SANDBOXD_PORT_CONNECTIONS_MAX",
        "64",
        parse_count,
        "Proxied connections open at once to one sandbox's ports",
    )
    contexts_max: int = setting_field(
        "SANDBOXD_CONTEXTS_MAX",
        "4",
        parse_count,
        "Interpreter contexts (live kernels) per sandbox (docs/extensions.rst, Contexts)",
    )
    kernel_python: str = setting_field(
        "SANDBOXD_KERNEL_PYTHON",
        "/usr/bin/python3",
        str,
        "The python3 that runs contexts' kernels in the sandboxes (needs ipykernel)",
    )
    max_connections: int | None = setting_field(
        "SANDBOXD_MAX_CONNECTIONS",
        "auto",
        connections,
        "Connections open at once, a tenth kept for authenticated callers (auto: half the "
        "descriptor limit; off: no cap)",
        unset="auto",
    )
    header_timeout: float | None = setting_field(
        "SANDBOXD_HEADER_TIMEOUT",
        "10s",
        optional_duration,
        "Longest a request's whole header section may take to arrive (off: no limit)",
        unset="off",
    )
    connection_idle: float | None = setting_field(
        "SANDBOXD_CONNECTION_IDLE",
        "2m",
        optional_duration,
        "Longest a connection may wait for its next request, or go silent in a body (off: 12h)",
        unset="off",
    )
    auth_gate: str = setting_field(
        "SANDBOXD_AUTH_GATE",
        "headers",
        choice(AUTH_GATE_MODES),
        "Refuse a request without the token as soon as its headers are in, pacing refusals "
        "per peer (headers), or only once its body is stored (off)",
    )
    log_format: str = setting_field(
        "SANDBOXD_LOG_FORMAT",
        "text",
        choice(LOG_FORMATS),
        "Log output: text or json (one JSON object per line)",
    )

    @classmethod
    def load(
        cls, environ: Mapping[str, str], options: Mapping[str, str | None] | None = None
    ) -> "Config":
        """Build the configuration: option, else environment variable, else default."""
        options = options or {}
        values: dict[str, Any] = {}
        for setting in fields(cls):
            meta = setting.metadata
            text = options.get(option_name(setting.name))
            if text is None:
                text = environ.get(meta["env"])
            if text is None:
                text = meta["default"]
            if text is None and setting.name == "listen":
                # Without a token, only this host may drive the sandboxes by default.
                has_token = _given("token_file", options, environ)
                text = DEFAULT_LISTEN if has_token else DEFAULT_LISTEN + ":interface=127.0.0.1"
            if text is None:
                values[setting.name] = None
                continue
            try:
                values[setting.name] = meta["parse"](text)
            except ValueError as e:
                raise ConfigError(f"{meta['env']}: {e}") from None
        config = cls(**values)
        config.check()
        return config

    def check(self) -> None:
        """Refuse combinations that cannot work, naming the variables."""
        if self.uid_min <= 0:
            raise ConfigError("SANDBOXD_UID_MIN: must be above 0 (uid 0 is root)")
        if self.uid_max < self.uid_min:
            raise ConfigError("SANDBOXD_UID_MAX: must not be below SANDBOXD_UID_MIN")
        if self.pids_max < 1:
            raise ConfigError("SANDBOXD_PIDS_MAX: must be at least 1")
        for name in ("disk_max", "files_max"):
            if getattr(self, name) == 0:
                raise ConfigError(f"{env_name(name)}: must be above zero (unset: no limit)")
        for name in (
            "process_log_max",
            "terminal_scrollback",
            "processes_max",
            "watch_max",
            "port_connections_max",
            "walk_max",
            "walk_bytes_max",
            "template_max",
            "build_memory_max",
            "build_pids_max",
            "contexts_max",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{env_name(name)}: must be at least 1")
        for name in ("exec_timeout", "log_timeout", "idle_ttl", "keepalive", "build_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{env_name(name)}: must be above zero")
        if (self.egress_socks5_user is None) != (self.egress_socks5_password_file is None):
            raise ConfigError(
                "SANDBOXD_EGRESS_SOCKS5_USER and SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE:"
                " set both or neither"
            )
        if self.egress_socks5_user is not None and self.egress_socks5 is None:
            raise ConfigError("SANDBOXD_EGRESS_SOCKS5_USER: needs SANDBOXD_EGRESS_SOCKS5")

    def redacted(self) -> dict[str, Any]:
        """The effective settings by variable name, secrets replaced by ``<set>``."""
        shown: dict[str, Any] = {}
        for setting in fields(type(self)):
            value = getattr(self, setting.name)
            if setting.metadata["secret"] and value is not None:
                value = "<set>"
            elif setting.name == "umask":
                value = f"{value:03o}"  # as an operator writes it
            elif setting.name == "max_connections" and not value:
                value = "auto" if value is None else "off"
            shown[setting.metadata["env"]] = value
        return shown

    def friendly(self) -> str:
        """The effective settings as an operator writes them (``SANDBOXD_MEMORY_MAX=512M``,
        ``SANDBOXD_EXEC_TIMEOUT=10m``, ``SANDBOXD_INSECURE=no``, ``SANDBOXD_DISK_MAX=`` when
        unset): each value reads back to itself when given to its variable. Secrets are
        replaced by ``<set>``. One line for the log."""
        shown: list[str] = []
        for setting in fields(type(self)):
            meta = setting.metadata
            value = getattr(self, setting.name)
            text = setting_text(meta, value)
            if meta["secret"] and value is not None:
                text = "<set>"
            shown.append(f"{meta['env']}={text}")
        return " ".join(shown)


def _given(attribute: str, options: Mapping[str, Any], environ: Mapping[str, str]) -> bool:
    """Whether the setting is given a non-empty value by an option or the environment."""
    text = options.get(option_name(attribute))
    if text is None:
        text = environ.get(env_name(attribute))
    return bool(text and text.strip())


def option_name(attribute: str) -> str:
    """``max_output`` → ``max-output``: the ``twistd sandboxd`` option of a setting."""
    return attribute.replace("_", "-")


def env_name(attribute: str) -> str:
    """The environment variable of a setting attribute."""
    for setting in fields(Config):
        if setting.name == attribute:
            return str(setting.metadata["env"])
    raise KeyError(attribute)
