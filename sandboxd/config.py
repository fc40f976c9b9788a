"""The daemon's configuration: one table of settings, read from ``SANDBOXD_*`` and options.

Every setting has an environment variable and a ``twistd sandboxd --option`` of the same name;
the option wins. A value that does not parse raises :class:`ConfigError` naming the variable, so
start-up stops with one clear line.
"""

from collections.abc import Callable, Mapping
from ipaddress import IPv4Network, IPv6Network
from typing import Any

from attrs import field, fields, frozen

from sandboxd.isolation.egress_plan import parse_networks, parse_pool4, parse_pool6
from sandboxd.isolation.namespaces import parse_namespaces
from sandboxd.isolation.network import parse_mode, parse_modes
from sandboxd.listen import DUAL_STACK_MODES
from sandboxd.units import (
    format_duration,
    format_size,
    parse_cores,
    parse_count,
    parse_duration,
    parse_size,
)

ISOLATION_MODES = ("auto", "cgroup2", "cgroup1", "none")
SECCOMP_MODES = ("default", "off")
SOCKET_BUFFER_MODES = ("charged", "off")
LOG_FORMATS = ("text", "json")
AUTH_GATE_MODES = ("headers", "off")
DEFAULT_LISTEN = "tcp:8080"


class ConfigError(Exception):
    """A setting has a value that cannot be used; the message names the variable."""


def _choice(allowed: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return value

    return parse


def _text(text: str) -> str:
    if not text.strip():
        raise ValueError("is empty")
    return text.strip()


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "yes", "true", "on"):
        return True
    if value in ("", "0", "no", "false", "off"):
        return False
    raise ValueError(f"{text!r} is not yes or no")


def _umask(text: str) -> int:
    value = text.strip()
    if not value or any(c not in "01234567" for c in value) or int(value, 8) > 0o777:
        raise ValueError(f"{text!r} is not an octal umask (e.g. 077)")
    return int(value, 8)


def _optional_text(text: str) -> str | None:
    return text.strip() or None


def _optional_size(text: str) -> int | None:
    return parse_size(text) if text.strip() else None


def _optional_count(text: str) -> int | None:
    return parse_count(text) if text.strip() else None


def _optional_duration(text: str) -> float | None:
    """A duration, or ``off`` (``None``)."""
    if text.strip().lower() == "off":
        return None
    value = parse_duration(text)
    if value <= 0:
        raise ValueError(f"{text!r} is not above zero (off: no timeout)")
    return value


def _connections(text: str) -> int | None:
    """``auto`` (``None``: from the descriptor limit), ``off`` (``0``: no cap), or a count."""
    value = text.strip().lower()
    if value == "auto":
        return None
    if value == "off":
        return 0
    count = parse_count(value)
    if count < 2:
        raise ValueError(f"{text!r} is below 2 (auto: from the descriptor limit; off: no cap)")
    return count


def _setting(
    env: str,
    default: str | None,
    parse: Callable[[str], Any],
    help: str,
    secret: bool = False,
    flag: bool = False,
) -> Any:
    """Declare one setting: its variable, default (as text an operator would write) and parser.

    A ``flag`` is a ``twistd sandboxd --option`` that takes no value (given: ``yes``).
    """
    return field(
        metadata={
            "env": env,
            "default": default,
            "parse": parse,
            "help": help,
            "secret": secret,
            "flag": flag,
        }
    )


@frozen
class Config:
    """The effective configuration. Sizes are bytes, durations seconds, cores a float."""

    listen: str = _setting(
        "SANDBOXD_LISTEN",
        None,
        _text,
        "Twisted endpoint string to listen on (default: tcp:8080 with a token, else"
        " tcp:8080:interface=127.0.0.1)",
    )
    dual_stack: str = _setting(
        "SANDBOXD_DUAL_STACK",
        "on",
        _choice(DUAL_STACK_MODES),
        "Claim a tcp: port on IPv4 and IPv6 alike (on), or listen as the endpoint says (off)",
    )
    insecure: bool = _setting(
        "SANDBOXD_INSECURE",
        "no",
        _flag,
        "Allow listening beyond loopback with no token (anyone reaching the port runs code)",
        flag=True,
    )
    e2b_listen: str | None = _setting(
        "SANDBOXD_E2B_LISTEN",
        None,
        _optional_text,
        "Twisted endpoint string of the E2B-compatible front (default: off)",
    )
    pod_url: str | None = _setting(
        "SANDBOXD_POD_URL",
        None,
        _optional_text,
        "This replica's own URL (default: from POD_IP and the port)",
    )
    root: str = _setting(
        "SANDBOXD_ROOT",
        "/var/lib/sandboxd/sandboxes",
        _text,
        "Directory holding one directory per sandbox",
    )
    uid_min: int = _setting(
        "SANDBOXD_UID_MIN", "200000", parse_count, "First uid/gid of the sandbox pool"
    )
    uid_max: int = _setting(
        "SANDBOXD_UID_MAX", "201999", parse_count, "Last uid/gid of the sandbox pool"
    )
    memory_max: int = _setting(
        "SANDBOXD_MEMORY_MAX", "512M", parse_size, "Memory limit of each sandbox (e.g. 512M)"
    )
    cpu_cores: float = _setting(
        "SANDBOXD_CPU_CORES", "1.0", parse_cores, "CPU limit of each sandbox in cores (e.g. 1.5)"
    )
    pids_max: int = _setting(
        "SANDBOXD_PIDS_MAX", "256", parse_count, "Process limit of each sandbox"
    )
    disk_max: int | None = _setting(
        "SANDBOXD_DISK_MAX",
        None,
        _optional_size,
        "Bytes each sandbox may store (e.g. 1G; needs btrfs or ext4/XFS project quotas)",
    )
    files_max: int | None = _setting(
        "SANDBOXD_FILES_MAX",
        None,
        _optional_count,
        "Files each sandbox may make (needs btrfs or ext4/XFS project quotas)",
    )
    cgroup_root: str | None = _setting(
        "SANDBOXD_CGROUP_ROOT", None, _optional_text, "Cgroup subtree to manage (default: detect)"
    )
    exec_timeout: float = _setting(
        "SANDBOXD_EXEC_TIMEOUT", "10m", parse_duration, "Longest an exec may run (exit 124 after)"
    )
    log_timeout: float = _setting(
        "SANDBOXD_LOG_TIMEOUT",
        "5m",
        parse_duration,
        "Longest an exec may stay silent (exit 124 after)",
    )
    idle_ttl: float = _setting(
        "SANDBOXD_IDLE_TTL", "30m", parse_duration, "Kill sandboxes idle this long"
    )
    drain_deadline: float = _setting(
        "SANDBOXD_DRAIN_DEADLINE", "60s", parse_duration, "Longest a drain waits for busy sandboxes"
    )
    drain_idle: float = _setting(
        "SANDBOXD_DRAIN_IDLE",
        "10s",
        parse_duration,
        "During a drain, kill a sandbox after this long with no call, command or output",
    )
    archive_root: str | None = _setting(
        "SANDBOXD_ARCHIVE_ROOT",
        None,
        _optional_text,
        "Archive directory for persist/restore (default: none)",
    )
    tools_dir: str = _setting(
        "SANDBOXD_TOOLS_DIR",
        "/var/lib/sandboxd/tools",
        _text,
        "Directory of installed third-party tools",
    )
    token_file: str | None = _setting(
        "SANDBOXD_TOKEN_FILE",
        None,
        _optional_text,
        "File holding the bearer token (root-only)",
        secret=True,
    )
    isolation: str = _setting(
        "SANDBOXD_ISOLATION",
        "auto",
        _choice(ISOLATION_MODES),
        "auto, cgroup2, cgroup1 or none (none: development only)",
    )
    namespaces: frozenset[str] = _setting(
        "SANDBOXD_NAMESPACES",
        "all",
        parse_namespaces,
        "Namespace layers per sandbox: all, none, or some of ipc,mount,net",
    )
    network: str | None = _setting(
        "SANDBOXD_NETWORK",
        None,
        parse_mode,
        "Default network mode of a create: none, egress or host (default: the strongest allowed)",
    )
    network_allow: tuple[str, ...] | None = _setting(
        "SANDBOXD_NETWORK_ALLOW",
        None,
        parse_modes,
        "Network modes a create may ask for, separated by commas (default: every one offered)",
    )
    egress_pool: IPv4Network = _setting(
        "SANDBOXD_EGRESS_POOL",
        "10.200.0.0/16",
        parse_pool4,
        "IPv4 range of the egress mode's veths, a /31 per sandbox (only on this host)",
    )
    egress_pool6: IPv6Network | None = _setting(
        "SANDBOXD_EGRESS_POOL6",
        "fd53:616e:6462:6f78::/64",
        parse_pool6,
        "IPv6 range of the egress mode's veths, a /127 per sandbox (none: no IPv6 egress)",
    )
    egress_deny: tuple[IPv4Network | IPv6Network, ...] = _setting(
        "SANDBOXD_EGRESS_DENY",
        "",
        parse_networks,
        "Ranges egress sandboxes may not reach, besides loopback, link-local, the host, the pool",
    )
    seccomp: str = _setting(
        "SANDBOXD_SECCOMP",
        "default",
        _choice(SECCOMP_MODES),
        "System call filter of every command: default or off",
    )
    umask: int = _setting(
        "SANDBOXD_UMASK",
        "077",
        _umask,
        "umask of every command (octal; 077: nothing readable by another uid)",
    )
    socket_buffers: str = _setting(
        "SANDBOXD_SOCKET_BUFFERS",
        "charged",
        _choice(SOCKET_BUFFER_MODES),
        "Charge socket buffers to the sandbox's memory limit: charged or off",
    )
    max_output: int = _setting(
        "SANDBOXD_MAX_OUTPUT",
        "16M",
        parse_size,
        "Bytes of stdout and of stderr kept per exec for the final frame",
    )
    max_body: int = _setting(
        "SANDBOXD_MAX_BODY", "8G", parse_size, "Largest request body (uploads) accepted"
    )
    keepalive: float = _setting(
        "SANDBOXD_KEEPALIVE",
        "5s",
        parse_duration,
        'Interval of {"o": ""} frames while an exec is silent',
    )
    process_log_max: int = _setting(
        "SANDBOXD_PROCESS_LOG_MAX",
        "16M",
        parse_size,
        "Bytes of output kept per background process (older bytes fall out)",
    )
    processes_max: int = _setting(
        "SANDBOXD_PROCESSES_MAX",
        "16",
        parse_count,
        "Background process records kept per sandbox (the oldest ended pushed out)",
    )
    walk_max: int = _setting(
        "SANDBOXD_WALK_MAX",
        "200000",
        parse_count,
        "Most files one walk lists (413 past it)",
    )
    watch_max: int = _setting(
        "SANDBOXD_WATCH_MAX", "8", parse_count, "Workspace watches open at once per sandbox"
    )
    max_connections: int | None = _setting(
        "SANDBOXD_MAX_CONNECTIONS",
        "auto",
        _connections,
        "Connections open at once, a tenth kept for authenticated callers (auto: half the "
        "descriptor limit; off: no cap)",
    )
    header_timeout: float | None = _setting(
        "SANDBOXD_HEADER_TIMEOUT",
        "10s",
        _optional_duration,
        "Longest a request's whole header section may take to arrive (off: no limit)",
    )
    connection_idle: float | None = _setting(
        "SANDBOXD_CONNECTION_IDLE",
        "2m",
        _optional_duration,
        "Longest a connection may wait for its next request, or go silent in a body (off: 12h)",
    )
    auth_gate: str = _setting(
        "SANDBOXD_AUTH_GATE",
        "headers",
        _choice(AUTH_GATE_MODES),
        "Refuse a request without the token as soon as its headers are in, pacing refusals "
        "per peer (headers), or only once its body is stored (off)",
    )
    log_format: str = _setting(
        "SANDBOXD_LOG_FORMAT",
        "text",
        _choice(LOG_FORMATS),
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
        for name in ("process_log_max", "processes_max", "watch_max", "walk_max"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{env_name(name)}: must be at least 1")
        for name in ("exec_timeout", "log_timeout", "idle_ttl", "keepalive"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{env_name(name)}: must be above zero")

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
        ``SANDBOXD_EXEC_TIMEOUT=10m``), secrets replaced by ``<set>``: one line for the log."""
        shown: list[str] = []
        redacted = self.redacted()
        for setting in fields(type(self)):
            env = setting.metadata["env"]
            value = redacted[env]
            parse = setting.metadata["parse"]
            if value is None:
                text = "unset"
            elif parse in (parse_size, _optional_size):
                text = format_size(value)
            elif parse is parse_duration:
                text = format_duration(value)
            elif isinstance(value, tuple | frozenset):
                text = ",".join(sorted(str(v) for v in value)) or "none"
            else:
                text = str(value)
            shown.append(f"{env}={text}")
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


def option_table() -> list[list[Any]]:
    """``optParameters`` rows for ``twisted.python.usage.Options``: one per setting that
    takes a value."""
    rows: list[list[Any]] = []
    for setting in fields(Config):
        meta = setting.metadata
        if meta["flag"]:
            continue
        default = meta["default"]
        help_text = f"{meta['help']} [env {meta['env']}; default {default or 'unset'}]"
        rows.append([option_name(setting.name), None, None, help_text])
    return rows


def flag_table() -> list[list[Any]]:
    """``optFlags`` rows for ``twisted.python.usage.Options``: one per flag setting."""
    return [
        [option_name(s.name), None, f"{s.metadata['help']} [env {s.metadata['env']}=yes]"]
        for s in fields(Config)
        if s.metadata["flag"]
    ]


def given_options(options: Mapping[str, Any]) -> dict[str, str | None]:
    """The settings given on the command line, by option name (a flag given is ``yes``)."""
    given: dict[str, str | None] = {row[0]: options[row[0]] for row in option_table()}
    for row in flag_table():
        given[row[0]] = "yes" if options[row[0]] else None
    return given
