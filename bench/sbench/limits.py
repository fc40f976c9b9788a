"""What limits each figure whose target a run does not meet, as its profile showed.

A row that misses its target carries ``limited_by``: one line naming what its profile found
(``docs/performance.rst``, "Issue 34, where each target stands" and the sections it cites),
printed under the table and under README's copy of it. The text is the finding, not a
measurement of this run: a run's own figures are in its rows.
"""

from collections.abc import Mapping

WHERE = "docs/performance.rst, Issue 34, where each target stands"

_EXEC = (
    "the HTTP round trip and the kernel's clone and exec of the command from the sandbox's"
    " zygote, plus about 0.4 ms of the reactor's own work per exec (py-spy)"
)
_EXEC_NONE = (
    "each exec spawns the helper program (no zygote without isolation), and the reactor's own"
    " work per exec"
)
_CREATE = (
    "the sandbox's cgroup directories in five v1 hierarchies and the namespace server's answer,"
    " both on the reactor thread, about 1.4 ms of it per create (py-spy)"
)
_CREATE_EGRESS = (
    "the egress layer's veth pair, addresses and routes under the kernel's RTNL lock, besides a"
    " plain create's cgroups and namespaces (the pool of network namespaces, opt-in, takes the"
    " first off)"
)
_SUSTAINED = (
    "creates are served one after another on the reactor thread, about 1.4 ms of it each (py-spy)"
)
_SUSTAINED_EGRESS = (
    "the kernel's IPv6 work per veth in the host's namespace and the RTNL lock, which grow"
    " with the number of live sandboxes"
)
_FIRST_OUTPUT = "a create, then a first exec that also starts the sandbox's zygote"

LIMITS: Mapping[str, str] = {
    "exec true": _EXEC,
    "exec true beside its parts": _EXEC,
    "create": _CREATE,
    "cold create, every layer on": _CREATE_EGRESS,
    "create → usable handle": _CREATE,
    "creates sustained": _SUSTAINED,
    "creates sustained, every layer on": _SUSTAINED_EGRESS,
    "create → first output, one at a time": _FIRST_OUTPUT,
    "create + first exec": _FIRST_OUTPUT,
    "burst: create → first output (p99)": (
        "the creates are served one after another on the reactor thread, a few ms each with"
        " every layer"
    ),
    "create from a template (absolute)": (
        "a plain create, then the template's overlay mount and root switch"
    ),
    "egress by name: small HTTP request (p50)": (
        "a second TCP connection, and the proxy's accept, peek of the first bytes, policy check"
        " and upstream connect before any byte moves"
    ),
    "egress by name: download throughput (median)": (
        "the relay's splice through a pipe of 256 KiB each way, turn by turn on the reactor"
    ),
    "upload/download": "the body's bytes cross the reactor thread and the spool's thread",
    "walk": "the listing's JSON, made and sent by the daemon a batch at a time",
    "daemon memory while streaming": "glibc's heap, which keeps what the reads of a stream freed",
}
"""Figure → what limits it, for the figures whose variants share one finding."""

NEIGHBOURS = "exec true beside a neighbour (p99 / idle p99)"

NEIGHBOUR_LIMITS: Mapping[str, str] = {
    "streams": "the reactor encodes and sends every byte of the stream, beside the probe's work",
    "fork-bombs": (
        "the bomb's failed forks (each copies its memory map before the pids limit refuses it)"
        " keep the kernel's task-list and cgroup locks hot, on the CPU the bomb is placed on"
    ),
    "burns": (
        "the neighbour's busy loops hold the CPU it is placed on; the probe's daemon threads"
        " may still wait there"
    ),
    "uploads": (
        "the spool's thread and the reactor's copies of the body, with the uploader, take both"
        " cores (py-spy)"
    ),
    "walks": "the walk's JSON, made in a file thread and sent by the reactor",
    "typed": "each typed message, and its echo, crosses the reactor thread",
    "terminal": "the terminal's output, read from its pty and sent by the reactor",
}
"""For :data:`NEIGHBOURS`: a word of the variant (the load) → what limits it."""


def limited_by(figure: str, variant: str) -> str | None:
    """What limits ``figure`` (of ``variant``) when it misses its target, naming where the
    profile is; ``None`` when no profile has said."""
    found = LIMITS.get(figure)
    if found == _EXEC and variant.startswith("none"):
        found = _EXEC_NONE
    if figure == NEIGHBOURS:
        found = next((text for word, text in NEIGHBOUR_LIMITS.items() if word in variant), None)
    return None if found is None else f"{found} ({WHERE})"
