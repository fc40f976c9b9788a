"""A real ``pip install .`` into a fresh virtualenv gives a working ``twistd sandboxd``.

Editable installs of this flat layout hide ``twisted/plugins`` from twistd, so the plugin is
only proven by a normal install, from a copy of the work tree, outside it.
"""

import os
import shutil
import subprocess
import time
import venv
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, free_port, stop_daemon

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.wide]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the project installed from a clean copy of the sources."""
    base = tmp_path_factory.mktemp("install")
    source = base / "src"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            "vm-out",
            "*.egg-info",
            "build",
            "__pycache__",
            ".coverage*",
            "dropin.cache",
        ),
    )
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=True)
    subprocess.run(
        [env_dir / "bin" / "pip", "install", "-q", str(source)],
        check=True,
        cwd=base,
    )
    return env_dir


def clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "COVERAGE_PROCESS_START") and not k.startswith("SANDBOXD_")
    }


def test_help_lists_every_option(installed: Path) -> None:
    result = subprocess.run(
        [installed / "bin" / "twistd", "sandboxd", "--help"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=installed,
        check=True,
    )
    for option in (
        "--listen",
        "--root",
        "--uid-min",
        "--uid-max",
        "--memory-max",
        "--cpu-cores",
        "--pids-max",
        "--cgroup-root",
        "--exec-timeout",
        "--log-timeout",
        "--idle-ttl",
        "--drain-deadline",
        "--archive-root",
        "--tools-dir",
        "--token-file",
        "--isolation",
        "--max-output",
    ):
        assert option in result.stdout, option
    assert "SANDBOXD_MEMORY_MAX" in result.stdout


def test_installed_daemon_answers_healthz(installed: Path, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                installed / "bin" / "twistd",
                "-n",
                "--pidfile=",
                "sandboxd",
                "--isolation=none",
                f"--root={tmp_path / 'root'}",
                f"--listen=tcp:{port}:interface=127.0.0.1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            cwd=tmp_path,
        )
    daemon = Daemon(process, port, tmp_path / "root", log)
    try:
        for _ in range(600):
            if process.poll() is not None:
                break
            try:
                health = daemon.json("GET", "/healthz")
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError(log.read_text())
        assert process.poll() is None, log.read_text()
        assert health["status"] == "ok"
        assert "isolation.none" in health["capabilities"]
    finally:
        stop_daemon(daemon)


def test_bad_value_stops_start_up_with_one_line(installed: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            installed / "bin" / "twistd",
            "-n",
            "--pidfile=",
            "sandboxd",
            "--isolation=none",
            "--memory-max=lots",
            f"--root={tmp_path}",
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode != 0
    assert "SANDBOXD_MEMORY_MAX" in result.stdout + result.stderr


def test_sandboxctl_is_installed(installed: Path) -> None:
    assert (installed / "bin" / "sandboxctl").exists()
