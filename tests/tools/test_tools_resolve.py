"""Tool resolution against a real local artifact store (in process, real reactor, real treq)."""

from __future__ import annotations

import json
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest_twisted
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import deferLater

from sandboxd.core.tools.resolver import MEMORY, Resolution, Resolved, ToolResolver
from sandboxd.core.tools.unpack import UnpackLimits
from tests.tools.tools_helpers import (
    COMMANDS,
    GOOD,
    TOOL_SCRIPT,
    Gate,
    Server,
    add_entry,
    add_file,
    dead_url,
    manifest,
    modes,
    reactor,
    sha256,
    tarball,
)


@pytest_twisted.ensureDeferred
async def test_a_good_tool_is_installed_read_only_and_answered(
    resolver: ToolResolver, server: Server
) -> None:
    url = server.publish("good", GOOD)
    answer = await resolver.resolve({"greeter": url})

    sha = sha256(GOOD)
    assert answer == Resolution(
        tools={"greeter": Resolved(sha=sha, version="1.0.0", commands=COMMANDS, stale=False)},
        refused={},
    )
    tools = Path(resolver.tools_dir)
    installed = tools / sha
    assert (installed / "bin" / "greet").read_bytes() == TOOL_SCRIPT
    assert os.readlink(installed / "bin" / "hello") == "greet"
    assert modes(installed) == {
        "bin": 0o755,
        "bin/greet": 0o755,
        "share": 0o755,
        "share/doc": 0o755,
        "share/doc/README": 0o644,
    }
    assert stat.S_IMODE(os.stat(installed).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(tools).st_mode) == 0o755
    for top, dirs, files in os.walk(installed):
        for name in [*dirs, *files]:
            assert os.lstat(os.path.join(top, name)).st_uid == os.geteuid()
    memory = tools / MEMORY
    assert stat.S_IMODE(os.stat(memory).st_mode) == 0o600
    assert json.loads(memory.read_bytes())[url]["sha"] == sha
    assert os.listdir(tools / ".tmp") == []


@pytest_twisted.ensureDeferred
async def test_an_installed_sha_is_not_downloaded_again(
    resolver: ToolResolver, server: Server
) -> None:
    url = server.publish("good", GOOD)
    await resolver.resolve({"a": url})
    await resolver.resolve({"a": url})
    assert server.store.hits["/good/tool.tar.gz"] == 1
    assert server.store.hits["/good/manifest.json"] == 2


@pytest_twisted.ensureDeferred
async def test_a_digest_mismatch_is_refused_and_nothing_installed(
    resolver: ToolResolver, server: Server
) -> None:
    wrong = "0" * 64
    url = server.publish("tampered", GOOD, digest=wrong)
    answer = await resolver.resolve({"t": url})
    assert answer.tools == {}
    assert "does not match" in answer.refused["t"]
    assert sha256(GOOD) in answer.refused["t"]
    assert sorted(os.listdir(resolver.tools_dir)) == [".tmp"]
    assert os.listdir(Path(resolver.tools_dir) / ".tmp") == []


@pytest_twisted.ensureDeferred
async def test_a_missing_manifest_is_refused(resolver: ToolResolver, server: Server) -> None:
    answer = await resolver.resolve({"m": server.url("/nowhere/manifest.json")})
    assert answer == Resolution(tools={}, refused={"m": answer.refused["m"]})
    assert "HTTP 404" in answer.refused["m"]


MALFORMED = {
    "not json": b"{nope",
    "not an object": b"[1, 2]",
    "no commands": json.dumps(
        {"name": "x", "version": "1", "artifact": {"url": "a.tgz", "sha256": "a" * 64}}
    ).encode(),
    "short digest": manifest("tool.tar.gz", "abc"),
    "file url": manifest("file:///etc/passwd", "a" * 64),
    "bad command": json.dumps(
        {
            "name": "x",
            "version": "1",
            "artifact": {"url": "a.tgz", "sha256": "a" * 64},
            "commands": [{"name": "c", "description": "d", "parameters": "string"}],
        }
    ).encode(),
}


@pytest_twisted.ensureDeferred
async def test_malformed_manifests_are_refused_each_with_a_reason(
    resolver: ToolResolver, server: Server
) -> None:
    wanted = {}
    for label, body in MALFORMED.items():
        path = f"/{label.replace(' ', '-')}/manifest.json"
        server.store.files[path] = body
        wanted[label] = server.url(path)
    answer = await resolver.resolve(wanted)
    assert answer.tools == {}
    reasons = answer.refused
    assert set(reasons) == set(MALFORMED)
    assert "not valid JSON" in reasons["not json"]
    assert "not a JSON object" in reasons["not an object"]
    assert "commands" in reasons["no commands"]
    assert "sha256" in reasons["short digest"]
    assert "not an http or https URL" in reasons["file url"]
    assert "parameters" in reasons["bad command"]
    assert not any(path.endswith(".tar.gz") for path in server.store.hits)


def _evil(name: str) -> bytes:
    def add(tar: tarfile.TarFile) -> None:
        add_file(tar, "bin/ok", b"fine", 0o755)
        if name == "dotdot":
            add_file(tar, "../escaped", b"out")
        elif name == "nested-dotdot":
            add_file(tar, "bin/../../escaped", b"out")
        elif name == "absolute":
            add_file(tar, "/tmp/sandboxd-tools-absolute", b"out")
        elif name == "link-absolute":
            add_entry(tar, "bin/etc", tarfile.SYMTYPE, "/etc")
        elif name == "link-up":
            add_entry(tar, "bin/up", tarfile.SYMTYPE, "../../..")
        elif name == "link-chain":
            add_entry(tar, "here", tarfile.SYMTYPE, ".")
            add_entry(tar, "out", tarfile.SYMTYPE, "here/..")
        elif name == "through-link":
            add_entry(tar, "sub", tarfile.DIRTYPE)
            add_entry(tar, "d", tarfile.SYMTYPE, "sub")
            add_file(tar, "d/written-through", b"x")
        elif name == "hardlink-to-link":
            add_entry(tar, "bin/deep", tarfile.DIRTYPE)
            add_entry(tar, "bin/deep/l", tarfile.SYMTYPE, "../ok")
            add_entry(tar, "moved", tarfile.LNKTYPE, "bin/deep/l")
        elif name == "hardlink-outside":
            add_entry(tar, "passwd", tarfile.LNKTYPE, "/etc/passwd")
        elif name == "char-device":
            add_entry(tar, "dev-null", tarfile.CHRTYPE)
        elif name == "block-device":
            add_entry(tar, "dev-sda", tarfile.BLKTYPE)
        elif name == "fifo":
            add_entry(tar, "pipe", tarfile.FIFOTYPE)

    return tarball(add)


EVIL = [
    "dotdot",
    "nested-dotdot",
    "absolute",
    "link-absolute",
    "link-up",
    "link-chain",
    "through-link",
    "hardlink-to-link",
    "hardlink-outside",
    "char-device",
    "block-device",
    "fifo",
]


@pytest_twisted.ensureDeferred
async def test_unsafe_archives_are_refused_and_nothing_lands_anywhere(
    resolver: ToolResolver, server: Server, scratch: Path
) -> None:
    artifacts = {name: _evil(name) for name in EVIL}
    wanted = {name: server.publish(name, data) for name, data in artifacts.items()}
    wanted["good"] = server.publish("good", GOOD)

    answer = await resolver.resolve(wanted)

    assert list(answer.tools) == ["good"], answer.refused
    assert set(answer.refused) == set(EVIL)
    for name, reason in answer.refused.items():
        assert reason.startswith("artifact:"), (name, reason)
        assert not (Path(resolver.tools_dir) / sha256(artifacts[name])).exists()
    assert "absolute path" in answer.refused["absolute"]
    assert "'..'" in answer.refused["dotdot"]
    assert "leaves the tree" in answer.refused["link-chain"]
    assert "device file" in answer.refused["char-device"]
    assert not (scratch / "escaped").exists()
    assert not (scratch / "tools" / "escaped").exists()
    assert not Path("/tmp/sandboxd-tools-absolute").exists()
    assert os.listdir(Path(resolver.tools_dir) / ".tmp") == []


@pytest_twisted.ensureDeferred
async def test_a_store_that_is_down_with_nothing_remembered_is_refused(
    resolver: ToolResolver,
) -> None:
    answer = await resolver.resolve({"down": dead_url()})
    assert answer.tools == {}
    assert "unreachable" in answer.refused["down"]
    assert "no earlier resolution" in answer.refused["down"]


@pytest_twisted.ensureDeferred
async def test_a_store_that_is_down_answers_the_last_resolution_as_stale_even_after_restart(
    make_resolver: Callable[..., ToolResolver], server: Server
) -> None:
    url = server.publish("good", GOOD)
    first = make_resolver()
    fresh = await first.resolve({"g": url})
    assert fresh.tools["g"].stale is False

    server.store.statuses["/good/manifest.json"] = 503
    during_outage = await first.resolve({"g": url})
    assert during_outage.tools["g"] == attrs.evolve(fresh.tools["g"], stale=True)

    await server.stop()
    after_restart = make_resolver()  # a new daemon: only the disk remembers
    answer = await after_restart.resolve({"g": url, "never-seen": server.url("/x/manifest.json")})
    assert answer.tools == {"g": attrs.evolve(fresh.tools["g"], stale=True)}
    assert "no earlier resolution" in answer.refused["never-seen"]


@pytest_twisted.ensureDeferred
async def test_wrong_answers_are_refused_even_with_a_remembered_resolution(
    resolver: ToolResolver, server: Server
) -> None:
    url = server.publish("good", GOOD)
    await resolver.resolve({"g": url})
    server.store.statuses["/good/manifest.json"] = 404
    answer = await resolver.resolve({"g": url})
    assert "HTTP 404" in answer.refused["g"]


@pytest_twisted.ensureDeferred
async def test_two_tools_where_one_fails(resolver: ToolResolver, server: Server) -> None:
    answer = await resolver.resolve(
        {"ok": server.publish("good", GOOD), "bad": server.url("/missing/manifest.json")}
    )
    assert list(answer.tools) == ["ok"]
    assert list(answer.refused) == ["bad"]


@pytest_twisted.ensureDeferred
async def test_concurrent_resolutions_of_one_artifact_install_it_once(
    resolver: ToolResolver, server: Server
) -> None:
    url = server.publish("good", GOOD)
    gate = server.store.gates["/good/tool.tar.gz"] = Gate()
    first = Deferred.fromCoroutine(resolver.resolve({"a": url, "b": url}))
    second = Deferred.fromCoroutine(resolver.resolve({"c": url}))
    for _ in range(500):
        if gate.waiting:
            break
        await deferLater(reactor(), 0.01, lambda: None)
    for _ in range(20):  # let the other resolutions reach the shared install
        await deferLater(reactor(), 0.01, lambda: None)
    assert gate.waiting == 1
    gate.opened.callback(None)

    answers = await gatherResults([first, second])
    assert server.store.hits["/good/tool.tar.gz"] == 1
    assert server.store.hits["/good/manifest.json"] == 3
    shas = {tool.sha for answer in answers for tool in answer.tools.values()}
    assert shas == {sha256(GOOD)}
    assert sum(len(answer.tools) for answer in answers) == 3


@pytest_twisted.ensureDeferred
async def test_urls_that_are_not_http_are_refused_per_tool(
    resolver: ToolResolver, server: Server
) -> None:
    answer = await resolver.resolve(
        {"file": "file:///etc/passwd", "number": 42, "ok": server.publish("good", GOOD)}
    )
    assert list(answer.tools) == ["ok"]
    assert "not an http or https URL" in answer.refused["file"]
    assert "not an http or https URL" in answer.refused["number"]


@pytest_twisted.ensureDeferred
async def test_sizes_and_time_are_bounded(
    make_resolver: Callable[..., ToolResolver], server: Server
) -> None:
    resolver = make_resolver(
        manifest_limit=2000,
        artifact_limit=len(GOOD) - 1,
        artifact_timeout=0.5,
        unpack_limits=UnpackLimits(max_members=100, max_bytes=10),
    )
    server.store.files["/huge/manifest.json"] = b" " * 5000
    big_url = server.publish("big", GOOD)
    small = tarball(lambda tar: add_file(tar, "bin/x", b"y" * 11))
    bomb_url = server.publish("bomb", small)
    stall = tarball(lambda tar: add_file(tar, "bin/x", b"z"))
    server.store.files["/stall/tool.tar.gz"] = stall
    server.store.files["/stall/manifest.json"] = manifest("tool.tar.gz", sha256(stall))
    server.store.stall_after["/stall/tool.tar.gz"] = 5

    answer = await resolver.resolve(
        {
            "huge": server.url("/huge/manifest.json"),
            "big": big_url,
            "bomb": bomb_url,
            "stall": server.url("/stall/manifest.json"),
        }
    )
    refused = answer.refused
    assert answer.tools == {}
    assert "over 2000" in refused["huge"]
    assert f"over {len(GOOD) - 1}" in refused["big"]
    assert "unpacks to over 10" in refused["bomb"]
    assert "not received within 0.5 s" in refused["stall"]


@pytest_twisted.ensureDeferred
async def test_an_unusable_tools_directory_refuses_every_tool(
    scratch: Path, pool: object, http: object, server: Server
) -> None:
    from sandboxd.core.tools.fetch import Fetcher

    (scratch / "file").write_bytes(b"")
    fetcher = Fetcher(http, reactor())
    broken = ToolResolver(str(scratch / "file" / "tools"), fetcher, reactor(), pool)  # type: ignore[arg-type]
    broken.prepare()
    answer = await broken.resolve({"g": server.publish("good", GOOD)})
    assert "tools directory" in answer.refused["g"]
