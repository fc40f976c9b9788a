"""The client's template methods and ``sandboxctl template`` against a real daemon
(``twistd -n sandboxd --isolation=none``) over real TCP, with a bearer token."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor

from sandboxd_client import HttpSandbox, TemplateNotFound
from sandboxd_client.cli import Console, main_async

from .real_daemon import Daemon, daemon_and_client
from .test_client_templates import rootfs

TOKEN = "real-templates-token"

daemon, client = daemon_and_client(TOKEN)


@pytest_twisted.ensureDeferred
async def test_a_template_round_trip(client: HttpSandbox, daemon: Daemon, tmp_path: Path) -> None:
    assert "templates" in (await client.health()).capabilities
    archive = rootfs(tmp_path / "t.tar", {"usr/bin/hello": b"#!/bin/sh\necho hi\n"})
    imported = await client.import_template("round:trip", archive)
    assert imported.size == len(b"#!/bin/sh\necho hi\n")
    assert await client.get_template("round:trip") == imported
    assert [t.name for t in await client.list_templates()] == ["round:trip"]
    await client.delete_template("round:trip")
    with pytest.raises(TemplateNotFound):
        await client.get_template("round:trip")


@pytest_twisted.ensureDeferred
async def test_sandboxctl_template_over_tcp(daemon: Daemon, tmp_path: Path) -> None:
    archive = rootfs(tmp_path / "t.tar", {"a": b"abc"})
    token = tmp_path / "token"
    token.write_text(TOKEN)

    async def ctl(*argv: str) -> tuple[int, str, str]:
        out, err = io.BytesIO(), io.StringIO()
        argv = ("--url", daemon.url, "--token-file", str(token), *argv)
        code = await main_async(reactor, list(argv), Console(out, err, tty=False))
        return code, out.getvalue().decode(), err.getvalue()

    code, out, _ = await ctl("--json", "template", "import", "cli", archive)
    assert (code, json.loads(out)["size"]) == (0, 3)
    code, out, _ = await ctl("template", "ls")
    assert code == 0 and out.startswith("cli  ")
    assert (await ctl("template", "rm", "cli"))[0] == 0
    code, _, err = await ctl("template", "rm", "cli")
    assert code == 1 and "no template named 'cli'" in err
