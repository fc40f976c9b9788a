"""A tool's manifest (``sandboxd.core.tools.manifest``): what it must hold, each refusal
naming the field, and what a good one becomes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandboxd.core.tools.fetch import ToolRefused
from sandboxd.core.tools.manifest import MAX_COMMANDS, Manifest

BASE = "https://tools.example/t/manifest.json"
DIGEST = "AB" * 32
COMMAND = {"name": "c", "description": "d", "parameters": {"type": "object"}}


def good(**change: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "t",
        "version": "1.0",
        "artifact": {"url": "t.tar.gz", "sha256": DIGEST},
        "commands": [COMMAND],
    }
    body.update(change)
    return body


def test_a_good_manifest_resolves_its_artifact_against_its_own_url() -> None:
    command = {**COMMAND, "extra": "dropped"}
    parsed = Manifest.parse(json.dumps(good(commands=[command])).encode(), BASE)
    assert (parsed.name, parsed.version) == ("t", "1.0")
    assert parsed.artifact_url == "https://tools.example/t/t.tar.gz"
    assert parsed.sha256 == DIGEST.lower()
    assert parsed.commands == [COMMAND]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (good(name=""), "manifest: name must be a non-empty string"),
        (good(version=3), "manifest: version must be a non-empty string"),
        (good(artifact="t.tar.gz"), "manifest: artifact must be an object with url and sha256"),
        (good(artifact={"sha256": DIGEST}), "manifest: artifact.url must be a URL"),
        (good(artifact={"url": "", "sha256": DIGEST}), "manifest: artifact.url must be a URL"),
        (good(artifact={"url": "t", "sha256": 5}), "manifest: artifact.sha256 must be 64 hex"),
        (good(commands={}), "manifest: commands must be a list"),
        (
            good(commands=[COMMAND] * (MAX_COMMANDS + 1)),
            f"manifest: more than {MAX_COMMANDS} commands",
        ),
        (good(commands=[COMMAND, "c"]), "manifest: commands[1] must be an object"),
        (good(commands=[{**COMMAND, "name": 1}]), "manifest: commands[0].name must be a string"),
        (good(commands=[{"name": "c"}]), "manifest: commands[0].description must be a string"),
        (
            good(commands=[{**COMMAND, "parameters": []}]),
            "manifest: commands[0].parameters must be a JSON Schema object",
        ),
    ],
)
def test_each_problem_is_refused_naming_the_field(body: dict[str, Any], reason: str) -> None:
    with pytest.raises(ToolRefused) as refused:
        Manifest.parse(json.dumps(body).encode(), BASE)
    assert str(refused.value).startswith(reason), str(refused.value)


@pytest.mark.parametrize(
    ("raw", "reason"), [(b"\xff", "not valid JSON"), (b"{", "not valid JSON"), (b"1", "not a JSON")]
)
def test_a_manifest_that_is_no_json_object_is_refused(raw: bytes, reason: str) -> None:
    with pytest.raises(ToolRefused, match=reason):
        Manifest.parse(raw, BASE)
