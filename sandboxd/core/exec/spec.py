"""The body of ``POST /sandboxes/{rid}/exec``, validated into an :class:`ExecRequest`."""

import base64
import binascii
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from attrs import frozen

from sandboxd.core.files.paths import Parts, normalise
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
class ExecRequest:
    """One command to run: argv, the exec-level environment, and the §2 extensions."""

    cmd: tuple[str, ...]
    env: dict[str, str]
    cwd: Parts
    timeout: float | None
    stdin: bytes | None
    tools: tuple[str, ...]

    @classmethod
    def parse(cls, body: dict[str, Any]) -> "ExecRequest":
        """Validate the JSON body; every problem is a ``400`` naming the field."""
        cmd = body.get("cmd")
        if not isinstance(cmd, list) or not cmd:
            raise BadRequest("cmd: must be a non-empty list of strings")
        for arg in cmd:
            if not isinstance(arg, str):
                raise BadRequest("cmd: must be a non-empty list of strings")
            if "\0" in arg:
                raise BadRequest("cmd: an argument contains a NUL byte")
        timeout = body.get("timeout")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int | float):
                raise BadRequest("timeout: must be a number of seconds")
            if not timeout > 0:
                raise BadRequest("timeout: must be above zero")
        cwd = body.get("cwd")
        return cls(
            cmd=tuple(cmd),
            env=parse_env(body.get("env"), "env"),
            cwd=normalise("/" if cwd is None else cwd, "cwd"),
            timeout=None if timeout is None else float(timeout),
            stdin=_parse_stdin(body.get("stdin")),
            tools=_parse_tools(body.get("tools")),
        )


def parse_env(value: object, field: str) -> dict[str, str]:
    """An environment mapping: names without ``=`` or NUL, values without NUL."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{field}: must be an object of strings")
    for key, item in value.items():
        if not isinstance(item, str):
            raise BadRequest(f"{field}: the value of {key!r} must be a string")
        if not key or "=" in key or "\0" in key:
            raise BadRequest(f"{field}: {key!r} is not a valid variable name")
        if "\0" in item:
            raise BadRequest(f"{field}: the value of {key!r} contains a NUL byte")
        if len(key.encode()) + len(item.encode()) + 2 + CARRIER_SIZE > ARG_STRLEN_MAX:
            raise BadRequest(f"{field}: the entry {key!r} is over the limit of one entry")
    return dict(value)


def _parse_stdin(value: object) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest("stdin: must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("stdin: not valid base64") from None


def _parse_tools(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest("tools: must be a list of sha256 strings")
    for sha in value:
        if not SHA256_HEX.match(sha):
            raise BadRequest(f"tools: {sha!r} is not a sha256")
    return tuple(value)
