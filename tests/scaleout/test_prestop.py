"""packaging/sandboxd-prestop, the Deployment's preStop hook, against a real daemon: it starts the
drain with the token from ``SANDBOXD_TOKEN_FILE``, and returns once the daemon has exited."""

import os
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import REPO, start_daemon, stop_daemon

PRESTOP = REPO / "packaging" / "sandboxd-prestop"


def run_prestop(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PRESTOP), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def test_prestop_drains_and_waits_for_the_exit(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("prestop-token\n")
    token.chmod(0o600)
    daemon = start_daemon(tmp_path, "--isolation=none", f"--token-file={token}")
    try:
        assert daemon.call("POST", "/sandboxes", {})[0] == 401  # the token is needed
        result = run_prestop(
            "--url", daemon.url, "--wait", "60", env={"SANDBOXD_TOKEN_FILE": str(token)}
        )
        assert result.returncode == 0, result.stderr
        assert "drained and exited" in result.stdout
        assert daemon.process.wait(10) == 0
    finally:
        stop_daemon(daemon)


def test_prestop_without_the_token_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("prestop-token\n")
    token.chmod(0o600)
    daemon = start_daemon(tmp_path, "--isolation=none", f"--token-file={token}")
    try:
        result = run_prestop("--url", daemon.url, "--wait", "5", env={})
        assert result.returncode == 1
        assert "401" in result.stderr
        assert daemon.process.poll() is None
    finally:
        stop_daemon(daemon)


def test_prestop_with_no_daemon_has_nothing_to_do(tmp_path: Path) -> None:
    result = run_prestop("--url", "http://127.0.0.1:9", "--wait", "1", env={})
    assert result.returncode == 0
    assert "nothing to drain" in result.stdout
