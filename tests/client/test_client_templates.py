"""The client's template methods and ``sandboxctl template`` against the real daemon's API in
memory: import (streamed from a local file), list, show, delete, and each error as the
exception docs/client.rst names; at a terminal and as ``--json``."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.web.resource import Resource

from sandboxd_client import HttpSandbox, SandboxError, TemplateInfo, TemplateNotFound
from sandboxd_client._templates import decode_template, decode_templates
from sandboxd_client._types import ProtocolError
from sandboxd_client.cli import Console, parse_args, run

from .daemon_in_memory import POD_URL, InMemoryDaemon, serve_in_memory
from .servers import listen, url_of

TOKEN = "templates-token"


def rootfs(path: Path, files: dict[str, bytes]) -> str:
    """A root filesystem tarball of ``files`` at ``path``; its name."""
    with tarfile.open(path, "w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InMemoryDaemon]:
    yield from serve_in_memory(tmp_path, TOKEN.encode())


@pytest.fixture
def client(daemon: InMemoryDaemon) -> Iterator[HttpSandbox]:
    c = HttpSandbox(POD_URL, token=TOKEN, reactor=reactor, clock=Clock(), agent=daemon.agent)
    yield c
    pytest_twisted.blockon(c.close())


@pytest_twisted.ensureDeferred
async def test_import_list_show_and_delete(client: HttpSandbox, tmp_path: Path) -> None:
    archive = rootfs(tmp_path / "base.tar", {"etc/os-release": b"ID=client\n"})
    seen: list[tuple[int, int | None]] = []
    imported = await client.import_template(
        "base:1", archive, on_progress=lambda n, total: seen.append((n, total))
    )
    assert isinstance(imported, TemplateInfo)
    assert (imported.name, imported.size, imported.env, imported.workdir) == ("base:1", 10, {}, "/")
    assert imported.digest.startswith("sha256:")
    size = Path(archive).stat().st_size
    assert seen and seen[-1] == (size, size)
    assert await client.list_templates() == [imported]
    assert await client.get_template("base:1", pod_url=POD_URL) == imported
    await client.delete_template("base:1")
    assert await client.list_templates() == []
    with pytest.raises(TemplateNotFound, match="no template named 'base:1'") as raised:
        await client.get_template("base:1")
    assert isinstance(raised.value, LookupError) and raised.value.status == 404
    with pytest.raises(TemplateNotFound):
        await client.delete_template("base:1")


@pytest_twisted.ensureDeferred
async def test_a_bad_archive_a_taken_name_and_a_bad_name(
    client: HttpSandbox, tmp_path: Path
) -> None:
    hostile = rootfs(tmp_path / "hostile.tar", {"../escape": b"x"})
    with pytest.raises(ValueError, match=r"member '\.\./escape': its path holds '\.\.'"):
        await client.import_template("hostile", hostile)
    good = rootfs(tmp_path / "good.tar", {"a": b"a"})
    await client.import_template("good", good)
    with pytest.raises(SandboxError, match="template 'good' exists") as raised:
        await client.import_template("good", good)
    assert (raised.value.status, raised.value.error) == (409, "Conflict")
    with pytest.raises(ValueError, match="is not a template name"):
        await client.import_template("Bad", good)


def test_malformed_records_are_protocol_errors() -> None:
    record = {"name": "n", "digest": "d", "size": 1, "env": {}, "workdir": "/", "created": 1}
    assert decode_templates({"templates": [record]})[0].created == 1.0
    for broken in ({**record, "env": {"A": 1}}, {**record, "size": "1"}, []):
        with pytest.raises(ProtocolError):
            decode_template(broken)
    with pytest.raises(ProtocolError):
        decode_templates({"templates": None})


class Terminal:
    def __init__(self) -> None:
        self.out = io.BytesIO()
        self.err = io.StringIO()
        self.console = Console(self.out, self.err, tty=False)

    def lines(self) -> list[str]:
        return self.out.getvalue().decode().splitlines()


async def ctl(client: HttpSandbox, *argv: str) -> tuple[int, Terminal]:
    terminal = Terminal()
    code = await run(client, parse_args(["--url", POD_URL, *argv]), terminal.console)
    return code, terminal


@pytest_twisted.ensureDeferred
async def test_sandboxctl_template_import_ls_rm(client: HttpSandbox, tmp_path: Path) -> None:
    archive = rootfs(tmp_path / "base.tar", {"bin/tool": b"#!/bin/sh\n"})
    code, empty = await ctl(client, "template", "ls")
    assert (code, empty.lines(), empty.err.getvalue()) == (0, [], f"no templates on {POD_URL}\n")
    code, imported = await ctl(client, "template", "import", "base", archive)
    assert code == 0
    (line,) = imported.lines()
    assert line.startswith("base  ") and " sha256:" in line and line.endswith("s ago")
    code, listed = await ctl(client, "template", "ls", "--json")
    (record,) = json.loads(listed.out.getvalue())
    assert (record["name"], record["size"], record["env"]) == ("base", 10, {})
    code, human = await ctl(client, "template", "ls", "--pod", POD_URL)
    assert human.lines() == [line]
    code, json_import = await ctl(client, "--json", "template", "import", "other", archive)
    assert json.loads(json_import.out.getvalue())["name"] == "other"
    assert (await ctl(client, "template", "rm", "base"))[0] == 0
    code, removed = await ctl(client, "template", "rm", "other", "--json")
    assert json.loads(removed.out.getvalue()) == {"ok": True}
    assert await client.list_templates() == []


class NotJson(Resource):
    """Answers every request ``201`` with a body that is not JSON (a broken proxy)."""

    isLeaf = True

    def render(self, request: Any) -> bytes:
        request.setResponseCode(201)
        return b"<html>imported?</html>"


@pytest_twisted.ensureDeferred
async def test_an_import_answered_with_garbage_is_a_protocol_error(tmp_path: Path) -> None:
    port = listen(NotJson())
    client = HttpSandbox(url_of(port), reactor=reactor)
    try:
        with pytest.raises(ProtocolError, match="template: reply is not JSON"):
            await client.import_template("x", rootfs(tmp_path / "x.tar", {"a": b"a"}))
    finally:
        await client.close()
        await port.stopListening()
