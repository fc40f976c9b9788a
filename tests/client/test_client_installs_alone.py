"""
``sandboxd-client`` installs alone (issue 19): ``pip install packaging/client`` into a fresh
venv, from a clean copy of the tree, brings only what the client imports (none of the daemon's
dependencies, no compiled helper, a pure wheel), ships ``py.typed`` (an application type-checks
against it with ``mypy --strict``), and its ``sandboxctl`` and ``HttpSandbox`` drive a real
daemon (started from this work tree).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from .real_daemon import REPO, Daemon, running_daemon

pytestmark = [pytest.mark.slow, pytest.mark.wide]

TOKEN = "installs-alone-token"
DAEMON_ONLY = ("klein", "prometheus-client", "sandboxd")


def clean_env() -> dict[str, str]:
    """The environment of a machine that has only the installed client (no work tree)."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "COVERAGE_PROCESS_START", "VIRTUAL_ENV")
        and not k.startswith("SANDBOXD_")
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only ``sandboxd-client`` installed, from a copy of its sources."""
    base = tmp_path_factory.mktemp("client-alone")
    source = base / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.pyc")
    shutil.copytree(REPO / "sandboxd_client", source / "sandboxd_client", ignore=ignore)
    shutil.copytree(
        REPO / "packaging" / "client", source / "packaging" / "client", symlinks=True, ignore=ignore
    )
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=True)
    log = base / "pip.log"
    subprocess.run(
        [env_dir / "bin" / "pip", "install", "-v", str(source / "packaging" / "client")],
        check=True,
        cwd=base,
        env=clean_env(),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    build_log = log.read_text(errors="replace")
    assert "gcc" not in build_log and "sandboxd_exec.c" not in build_log
    return env_dir


def _run(installed: Path, *argv: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=installed,
        timeout=300,
        **kwargs,  # type: ignore[call-overload]
    )


def test_only_what_the_client_imports_is_installed(installed: Path) -> None:
    listed = _run(installed, installed / "bin" / "pip", "list", "--format=json", check=True)
    names = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert "sandboxd-client" in names
    for name in ("twisted", "treq", "attrs", "pybase64", "rich"):
        assert name in names, name
    assert not names & set(DAEMON_ONLY), names & set(DAEMON_ONLY)
    probe = "import sandboxd_client, sandboxd_client.cli; import sandboxd"
    missing = _run(installed, installed / "bin" / "python", "-c", probe)
    assert "No module named 'sandboxd'" in missing.stderr, missing.stderr
    site = next((installed / "lib").glob("python3*/site-packages"))
    wheel = next(site.glob("sandboxd_client-*.dist-info")) / "WHEEL"
    assert "Root-Is-Purelib: true" in wheel.read_text()
    assert (site / "sandboxd_client" / "py.typed").exists()
    assert not list(site.glob("sandboxd_client/**/*.so"))


def test_sandboxctl_mcp_without_the_extra_says_how_to_get_it(installed: Path) -> None:
    ran = _run(installed, installed / "bin" / "sandboxctl", "mcp")
    assert ran.returncode == 1
    assert "pip install 'sandboxd-client[mcp]'" in ran.stderr, ran.stderr


def test_an_application_type_checks_against_the_installed_client(
    installed: Path, tmp_path: Path
) -> None:
    app = tmp_path / "app.py"
    app.write_text(
        textwrap.dedent(
            """
            from sandboxd_client import ExecResult, HttpSandbox, SandboxHandle

            async def run(client: HttpSandbox, handle: SandboxHandle) -> int:
                result: ExecResult = await client.exec(handle, ["true"])
                return result.exit_code

            async def wrong(client: HttpSandbox, handle: SandboxHandle) -> str:
                return (await client.exec(handle, ["true"])).exit_code
            """
        )
    )
    mypy = Path(sys.executable).parent / "mypy"
    checked = _run(
        installed,
        mypy,
        "--strict",
        "--no-incremental",
        f"--python-executable={installed / 'bin' / 'python'}",
        "--config-file=/dev/null",
        app,
    )
    # One error, the deliberate one: the client's own types were read (not Any).
    assert checked.returncode == 1, checked.stdout + checked.stderr
    lines = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert len(lines) == 1 and 'got "int", expected "str"' in lines[0], checked.stdout


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("daemon"), TOKEN) as running:
        yield running


def test_sandboxctl_drives_a_real_daemon(installed: Path, daemon: Daemon, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    env = {**clean_env(), "SANDBOXD_URL": daemon.url, "SANDBOXD_TOKEN_FILE": str(token)}

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(installed / "bin" / "sandboxctl"), *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )

    assert "isolation.none" in ctl("health").stdout
    created = ctl("create")
    assert created.returncode == 0, created.stderr
    handle = created.stdout.strip()
    ran = ctl("exec", handle, "--", "sh", "-c", "echo from-the-client-alone; exit 3")
    assert (ran.returncode, ran.stdout) == (3, "from-the-client-alone\n"), ran.stderr
    (tmp_path / "local").write_bytes(b"put by sandboxctl")
    assert ctl("put", handle, "local", "remote").returncode == 0
    assert ctl("get", handle, "remote", "back").returncode == 0
    assert (tmp_path / "back").read_bytes() == b"put by sandboxctl"
    assert json.loads(ctl("--json", "ls", handle).stdout)[0]["path"].lstrip("/") == "remote"
    assert ctl("kill", handle).returncode == 0
    gone = ctl("kill", handle)
    assert gone.returncode == 1 and gone.stderr.startswith("sandboxctl: SandboxNotFound")


def test_http_sandbox_drives_a_real_daemon(installed: Path, daemon: Daemon) -> None:
    script = textwrap.dedent(
        f"""
        from twisted.internet.task import react
        from sandboxd_client import HttpSandbox, SandboxNotFound

        async def main(reactor):
            client = HttpSandbox({daemon.url!r}, token={TOKEN!r}, reactor=reactor)
            handle = await client.create()
            await client.upload(handle, "greeting", b"hello")
            result = await client.exec(handle, ["cat", "greeting"])
            assert (result.exit_code, result.stdout) == (0, b"hello"), result
            await client.kill(handle)
            try:
                await client.exists(handle, "greeting")
            except SandboxNotFound:
                print("ok")
            await client.close()

        react(main)
        """
    )
    ran = _run(installed, installed / "bin" / "python", "-c", script)
    assert (ran.returncode, ran.stdout) == (0, "ok\n"), ran.stderr
