"""The client's ``build_recipe`` and ``sandboxctl template build NAME --recipe R`` against a
real daemon (``--isolation=none``): an unknown recipe is refused, a known one reaches the
builder, which refuses it under a name taken (nothing is downloaded here). The recipe built
for real: tests/e2b/test_interpreter_recipe.py (``SANDBOXD_SLOW_TESTS=1``); the build's
frames read by the client as ``build_template``'s are (tests/templates/test_templates_build.py)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor

from sandboxd_client import HttpSandbox, SandboxError
from sandboxd_client.cli import Console, main_async
from tests.support.daemon import Daemon
from tests.templates.archives import file, tar

TAKEN = "'ci'"
"""How the builder's 409 names the template taken."""


def taken(tmp_path: Path) -> str:
    """A tiny root filesystem tarball, imported as ``ci`` to take the name."""
    path = tmp_path / "tiny.tar"
    path.write_bytes(tar([file("a", b"b")]))
    return str(path)


@pytest_twisted.ensureDeferred
async def test_the_client_sends_the_recipe_and_its_network(daemon: Daemon, tmp_path: Path) -> None:
    client = HttpSandbox(f"http://127.0.0.1:{daemon.port}", reactor=reactor)
    try:
        with pytest.raises(ValueError, match="'nope' is not a recipe of this daemon"):
            await client.build_recipe("ci", "nope")
        await client.import_template("ci", taken(tmp_path))
        with pytest.raises(SandboxError, match=TAKEN) as refused:
            await client.build_recipe("ci", "code-interpreter", network="none")
        assert refused.value.status == 409
    finally:
        await client.close()


async def sandboxctl(daemon: Daemon, *args: str) -> tuple[int, str]:
    out, err = io.BytesIO(), io.StringIO()
    argv = ["--url", f"http://127.0.0.1:{daemon.port}", "template", "build", *args]
    code = await main_async(reactor, argv, Console(out, err, tty=False))
    return code, err.getvalue()


@pytest_twisted.ensureDeferred
async def test_sandboxctl_builds_a_recipe_or_a_directory(daemon: Daemon, tmp_path: Path) -> None:
    code, said = await sandboxctl(daemon, "ci", "--recipe", "nope")
    assert code == 1 and "'nope' is not a recipe of this daemon" in said
    client = HttpSandbox(f"http://127.0.0.1:{daemon.port}", reactor=reactor)
    try:
        await client.import_template("ci", taken(tmp_path))
    finally:
        await client.close()
    code, said = await sandboxctl(daemon, "ci", "--recipe", "code-interpreter")
    assert code == 1 and TAKEN in said, said
    for wrong in ((), (str(tmp_path), "--recipe", "code-interpreter")):
        code, said = await sandboxctl(daemon, "ci", *wrong)
        assert (code, said) == (
            2,
            "sandboxctl: template build: give DIR or --recipe, one of them\n",
        )
