"""The body of ``POST /sandboxes/{rid}/exec``, validated into an :class:`ExecRequest`."""

import base64
import binascii
import re
from typing import Any

from attrs import frozen

from sandboxd.errors import BadRequest
from sandboxd.paths import Parts, normalise

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")

CAPABILITIES = ("exec.cwd", "exec.timeout", "exec.stdin", "exec.tools")


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
