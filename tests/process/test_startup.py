"""Start-up refusals of a real ``twistd -n sandboxd``: each stops it with one clear line."""

import subprocess
from pathlib import Path

from tests.support.coverage import coverage_env
from tests.support.daemon import REPO, daemon_argv, free_port, start_daemon, stop_daemon


def run_daemon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        daemon_argv(*args),
        capture_output=True,
        text=True,
        timeout=60,
        env={**coverage_env(), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


def test_a_second_daemon_on_the_same_root_is_refused(tmp_path: Path) -> None:
    first = start_daemon(tmp_path, "--isolation=none")
    try:
        rid = first.create()
        result = run_daemon(
            "--isolation=none",
            f"--root={first.root}",
            f"--listen=tcp:{free_port()}:interface=127.0.0.1",
        )
        assert result.returncode != 0
        assert f"another sandboxd is using {first.root}" in result.stderr
        # The first daemon's sandbox was not taken for a leftover.
        assert first.call("GET", f"/sandboxes/{rid}/ready")[0] == 200
    finally:
        stop_daemon(first)


def test_a_port_taken_by_a_live_process_stops_start_up_after_recovery(tmp_path: Path) -> None:
    """Recovery first (a predecessor's sandbox may be what holds the port), then the listen:
    a port another process listens on stops start-up with status 1, naming the address."""
    (tmp_path / "a").mkdir()
    first = start_daemon(tmp_path / "a", "--isolation=none")
    try:
        result = run_daemon(
            "--isolation=none",
            f"--root={tmp_path / 'b'}",
            f"--listen=tcp:{first.port}:interface=127.0.0.1",
        )
        assert result.returncode == 1
        assert (
            f"start-up failed at listen: 127.0.0.1:{first.port}: Address already in use"
            in result.stdout + result.stderr
        )
        log = result.stdout
        assert log.index("recovery done") < log.index("start-up failed at listen")
        assert "listening on" not in log and "destroyed" not in log
    finally:
        stop_daemon(first)


def test_beyond_loopback_without_a_token_needs_insecure(tmp_path: Path) -> None:
    port = free_port()
    result = run_daemon("--isolation=none", f"--root={tmp_path}", f"--listen=tcp:{port}")
    assert result.returncode != 0
    assert (
        f"start-up failed at listen: SANDBOXD_LISTEN=tcp:{port} reaches beyond loopback and no "
        "SANDBOXD_TOKEN_FILE is set" in result.stdout + result.stderr
    )
    assert "--insecure" in result.stderr


def test_a_bad_value_names_its_variable(tmp_path: Path) -> None:
    result = run_daemon("--isolation=none", f"--root={tmp_path}", "--idle-ttl=soon")
    assert result.returncode != 0
    assert "SANDBOXD_IDLE_TTL" in result.stderr


def test_start_up_says_where_it_listens_and_shows_friendly_units(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--isolation=none", "--memory-max=256M", "--exec-timeout=90s")
    try:
        text = daemon.log.read_text()
        url = daemon.url
        hint = f"curl {url}/healthz  or  SANDBOXD_URL={url} sandboxctl create"
        assert f"listening on 127.0.0.1 port {daemon.port}: try  {hint}" in text
        assert "SANDBOXD_MEMORY_MAX=256M" in text and "SANDBOXD_EXEC_TIMEOUT=90s" in text
        assert "SANDBOXD_IDLE_TTL=30m" in text and "SANDBOXD_MAX_BODY=8G" in text
    finally:
        stop_daemon(daemon)
