"""The settings of what the daemon keeps and what each sandbox may use: its directories and
files, each sandbox's uid, limits and lifetimes, templates and their builds (a group of
:class:`sandboxd.config.Config`)."""

from attrs import frozen

from sandboxd.settings import (
    nonempty_text,
    optional_count,
    optional_size,
    optional_text,
    setting_field,
)
from sandboxd.units import parse_cores, parse_count, parse_duration, parse_size


@frozen(slots=False)  # (a base of Config, whose own slots hold every setting)
class ResourceSettings:
    """Directories and files; a sandbox's and a template build's limits and lifetimes.
    Sizes are bytes, durations seconds, cores a float."""

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
