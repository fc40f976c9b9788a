"""Tool manifests (docs/contract.rst, "Tools"): the JSON a manifest URL serves, validated.

``{"name": str, "version": str, "artifact": {"url": str, "sha256": hex},
"commands": [{"name": str, "description": str, "parameters": {JSON Schema}}]}``. The artifact
URL may be relative to the manifest's own URL; it must end up ``http`` or ``https``.
"""

import json
import re
from typing import Any
from urllib.parse import urljoin

from attrs import frozen

from sandboxd.core.tools.fetch import ToolRefused, check_url

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
MAX_COMMANDS = 256


@frozen
class Manifest:
    """A validated manifest; ``commands`` keep only the three fields of the schema."""

    name: str
    version: str
    artifact_url: str
    sha256: str
    commands: list[dict[str, Any]]

    @classmethod
    def parse(cls, raw: bytes, manifest_url: str) -> "Manifest":
        """Validate ``raw``; every problem is a :class:`ToolRefused` naming the field."""
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            raise ToolRefused("manifest: not valid JSON") from None
        if not isinstance(body, dict):
            raise ToolRefused("manifest: not a JSON object")
        name = _text(body, "name")
        version = _text(body, "version")
        artifact = body.get("artifact")
        if not isinstance(artifact, dict):
            raise ToolRefused("manifest: artifact must be an object with url and sha256")
        url = artifact.get("url")
        if not isinstance(url, str) or not url:
            raise ToolRefused("manifest: artifact.url must be a URL")
        sha = artifact.get("sha256")
        if not isinstance(sha, str) or not SHA256_HEX.match(sha.lower()):
            raise ToolRefused("manifest: artifact.sha256 must be 64 hex digits")
        return cls(
            name=name,
            version=version,
            artifact_url=check_url(urljoin(manifest_url, url), "manifest: artifact.url"),
            sha256=sha.lower(),
            commands=_commands(body.get("commands")),
        )


def _text(body: dict[str, Any], field: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value:
        raise ToolRefused(f"manifest: {field} must be a non-empty string")
    return value


def _commands(value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ToolRefused("manifest: commands must be a list")
    if len(value) > MAX_COMMANDS:
        raise ToolRefused(f"manifest: more than {MAX_COMMANDS} commands")
    commands = []
    for index, command in enumerate(value):
        where = f"manifest: commands[{index}]"
        if not isinstance(command, dict):
            raise ToolRefused(f"{where} must be an object")
        for field in ("name", "description"):
            if not isinstance(command.get(field), str):
                raise ToolRefused(f"{where}.{field} must be a string")
        if not isinstance(command.get("parameters"), dict):
            raise ToolRefused(f"{where}.parameters must be a JSON Schema object")
        commands.append({k: command[k] for k in ("name", "description", "parameters")})
    return commands
