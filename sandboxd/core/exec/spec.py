"""One command to run, as a plain value (:class:`ExecSpec`), and the limits it must fit."""

import os
import re
from collections.abc import Mapping, Sequence

from attrs import frozen

from sandboxd.core.files.paths import Parts
from sandboxd.errors import BadRequest

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")

CAPABILITIES = ("exec.cwd", "exec.timeout", "exec.stdin", "exec.tools")

ARG_STRLEN_MAX = 32 * 4096
"""The kernel's limit on one argument or one ``NAME=value`` entry, NUL included
(``MAX_ARG_STRLEN``)."""

ARGS_MAX_CAP = 6 << 20
"""The kernel never allows more than three quarters of 8 MiB for argv and environment."""

ARGS_RESERVE = 32 << 10
"""Room kept for the host's own wrapper arguments (its scripts, paths, ids)."""

CARRIER_SIZE = 24
"""Bytes the isolation wrapper may add to one environment entry (``__SANDBOXD_<i>=``)."""


def exec_args_limit() -> int:
    """Bytes of argv and environment (strings, NULs and pointers) a command may have."""
    return min(os.sysconf("SC_ARG_MAX"), ARGS_MAX_CAP) - ARGS_RESERVE


def check_exec_size(cmd: Sequence[str], env: Mapping[str, str]) -> None:
    """``400`` when the command line and environment are over what ``execve`` takes.

    Decided before anything runs, so ``E2BIG`` is a ``400 BadRequest`` naming the field,
    never a failure half-way through starting the command.
    """
    total = 0
    for arg in cmd:
        size = len(arg.encode()) + 1
        if size > ARG_STRLEN_MAX:
            raise BadRequest(f"cmd: an argument is over {ARG_STRLEN_MAX - 1} bytes")
        total += size + 8
    for key, value in env.items():
        size = len(key.encode()) + len(value.encode()) + 2 + CARRIER_SIZE
        if size > ARG_STRLEN_MAX:
            raise BadRequest(f"env: the entry {key!r} is over the limit of one entry")
        total += size + 8
    limit = exec_args_limit()
    if total > limit:
        raise BadRequest(f"cmd: argument list too long ({total} bytes with env; limit {limit})")


@frozen
class ExecSpec:
    """One command to run: argv, the exec-level environment, and the §2 extensions."""

    cmd: tuple[str, ...]
    env: dict[str, str]
    cwd: Parts
    timeout: float | None
    stdin: bytes | None
    tools: tuple[str, ...]
    as_home: bool = False
    """Run in the workspace seen as the user's home (the E2B front's commands): the cwd is
    below the workspace's view (``/home/user`` where the mount namespace binds it there, else
    its real path), ``HOME`` is that view and ``USER`` is ``user``. Off: the native front's
    real workspace path and the sandbox's own ``home/``."""


def parse_env(value: object, field: str) -> dict[str, str]:
    """An environment mapping, as a front receives it (``None``: empty): an object of strings
    whose every entry :func:`check_env_entry` takes."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{field}: must be an object of strings")
    for key, item in value.items():
        if not isinstance(item, str):
            raise BadRequest(f"{field}: the value of {key!r} must be a string")
        check_env_entry(key, item, field)
    return dict(value)


def check_env(env: Mapping[str, str], field: str) -> None:
    """``400`` naming the first entry of ``env`` a process environment cannot hold."""
    for key, item in env.items():
        check_env_entry(key, item, field)


def check_env_entry(key: str, item: str, field: str) -> None:
    """``400`` unless ``key=item`` can be an environment entry: a name without ``=`` or NUL,
    a value without NUL, the whole within the kernel's limit of one entry."""
    if not key or "=" in key or "\0" in key:
        raise BadRequest(f"{field}: {key!r} is not a valid variable name")
    if "\0" in item:
        raise BadRequest(f"{field}: the value of {key!r} contains a NUL byte")
    if len(key.encode()) + len(item.encode()) + 2 + CARRIER_SIZE > ARG_STRLEN_MAX:
        raise BadRequest(f"{field}: the entry {key!r} is over the limit of one entry")
