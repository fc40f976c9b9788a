"""The resolver's own files on a real disk: the staging directory it empties at start-up, the
remembered resolutions it cannot read or write, a remembered tool since removed, and an
install that fails for a reason of the host's (answered per tool, never a failed request)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import pytest_twisted

from sandboxd.core.tools.resolver import MEMORY, ToolResolver
from sandboxd.core.tools.unpack import TEMP
from tests.tools.tools_helpers import GOOD, Server, sha256


def test_prepare_empties_the_staging_directory_of_every_kind_of_leftover(
    make_resolver: Callable[..., ToolResolver], scratch: Path
) -> None:
    keep = scratch / "not-ours"
    keep.mkdir()
    (keep / "precious").write_bytes(b"")
    staging = scratch / "tools" / TEMP
    (staging / "half-unpacked" / "bin").mkdir(parents=True)
    (staging / "resolutions.json.tmp").write_bytes(b"{")
    (staging / "a-link").symlink_to(keep)

    resolver = make_resolver()

    assert resolver.unavailable is None
    assert os.listdir(staging) == []
    assert os.listdir(keep) == ["precious"]  # the link went, never what it pointed at


REMEMBERED: dict[str, Callable[[str], bytes]] = {
    "not-json": lambda url: b"{not json",
    "not-an-object": lambda url: json.dumps([url]).encode(),
    "entry-not-an-object": lambda url: json.dumps({url: "not an entry"}).encode(),
}


@pytest.mark.parametrize("remembered", REMEMBERED.values(), ids=REMEMBERED.keys())
@pytest_twisted.ensureDeferred
async def test_remembered_resolutions_that_make_no_sense_are_forgotten(
    make_resolver: Callable[..., ToolResolver],
    scratch: Path,
    server: Server,
    remembered: Callable[[str], bytes],
) -> None:
    url = server.publish("good", GOOD)
    first = make_resolver()
    await first.resolve({"g": url})
    (scratch / "tools" / MEMORY).write_bytes(remembered(url))
    server.store.statuses["/good/manifest.json"] = 503

    answer = await make_resolver().resolve({"g": url})

    assert answer.tools == {}
    assert "no earlier resolution" in answer.refused["g"]


@pytest_twisted.ensureDeferred
async def test_resolutions_that_cannot_be_read_or_saved_still_resolve(
    make_resolver: Callable[..., ToolResolver], scratch: Path, server: Server
) -> None:
    (scratch / "tools" / MEMORY).mkdir(parents=True)  # neither readable nor replaceable
    resolver = make_resolver()
    url = server.publish("good", GOOD)

    answer = await resolver.resolve({"g": url})

    assert answer.refused == {}
    assert answer.tools["g"].sha == sha256(GOOD)
    assert (scratch / "tools" / MEMORY).is_dir()
    assert os.listdir(scratch / "tools" / TEMP) == []  # the unsaved copy is not left behind


@pytest_twisted.ensureDeferred
async def test_a_remembered_tool_since_removed_is_not_answered_as_stale(
    resolver: ToolResolver, server: Server
) -> None:
    url = server.publish("good", GOOD)
    await resolver.resolve({"g": url})
    shutil.rmtree(Path(resolver.tools_dir) / sha256(GOOD))
    server.store.statuses["/good/manifest.json"] = 503

    answer = await resolver.resolve({"g": url})

    assert answer.tools == {}
    assert "HTTP 503" in answer.refused["g"]
    assert "no longer installed" in answer.refused["g"]


@pytest_twisted.ensureDeferred
async def test_an_install_the_host_breaks_is_refused_as_an_internal_error(
    resolver: ToolResolver, server: Server
) -> None:
    os.rmdir(Path(resolver.tools_dir) / TEMP)  # removed under the running daemon

    answer = await resolver.resolve({"g": server.publish("good", GOOD), "other": "ftp://x"})

    assert answer.tools == {}
    assert answer.refused["g"].startswith("internal error: ")
    assert "No such file or directory" in answer.refused["g"]
    assert "not an http or https URL" in answer.refused["other"]
