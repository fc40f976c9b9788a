"""The settings of the API's limits and connections: what one exec, process, terminal, walk,
watch or context may hold, the HTTP connections' caps and timeouts, and the log's format (a
group of :class:`sandboxd.config.Config`)."""

from attrs import frozen

from sandboxd.settings import (
    choice,
    connections,
    optional_duration,
    rate_or_off,
    setting_field,
)
from sandboxd.units import parse_count, parse_duration, parse_size

LOG_FORMATS = ("text", "json")
AUTH_GATE_MODES = ("headers", "off")


@frozen(slots=False)  # (a base of Config, whose own slots hold every setting)
class ApiSettings:
    """What one call of the API may hold, and the connections that carry the calls."""

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
    body_pace: int | None = setting_field(
        "SANDBOXD_BODY_PACE",
        "256M",
        rate_or_off,
        "Bytes a second a request body is read at while other connections' requests come in "
        "(a lone upload runs at full speed; off: never paced)",
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
