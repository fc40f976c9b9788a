"""The systemd unit says what docs/operating.rst promises, and systemd itself accepts it.

The unit is proven for real under systemd as PID 1 by tests/systemd/run.sh (a QEMU VM); these
checks are the fast part that runs everywhere.
"""

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from sandboxd.config import Config
from sandboxd.units import parse_duration

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "packaging" / "systemd" / "sandboxd.service"
ENV = REPO / "packaging" / "systemd" / "sandboxd.env"


def service() -> dict[str, list[str]]:
    """``[Service]`` settings, each with every value it is given (keys may repeat)."""
    values: dict[str, list[str]] = {}
    section = None
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, value = line.split("=", 1)
            values.setdefault(key, []).append(value)
    return values


def one(key: str) -> str:
    (value,) = service()[key]
    return value


def test_type_notify_from_the_main_process() -> None:
    assert one("Type") == "notify"
    assert one("NotifyAccess") == "main"
    assert one("ExecStart").split() == [
        "/opt/sandboxd/bin/twistd",
        "--nodaemon",
        "--pidfile=",
        "sandboxd",
    ]


def test_cgroup_delegation_of_memory_cpu_pids_cpuset() -> None:
    assert set(one("Delegate").split()) == {"memory", "cpu", "pids", "cpuset"}
    assert one("TasksMax") == "infinity"


def test_stop_is_a_graceful_drain_within_the_stop_timeout() -> None:
    assert one("KillSignal") == "SIGTERM"
    # SIGTERM to the daemon alone: the sandboxes' running commands must not get it first.
    assert one("KillMode") == "mixed"
    assert parse_duration(one("TimeoutStopSec")) > Config.load({}).drain_deadline
    assert one("Restart") == "on-failure"


def test_settings_from_an_optional_environment_file() -> None:
    assert one("EnvironmentFile") == "-/etc/sandboxd/sandboxd.env"
    parser = configparser.ConfigParser(interpolation=None)
    body = "\n".join(
        line for line in ENV.read_text().splitlines() if line.strip() and not line.startswith("#")
    )
    parser.read_string("[env]\n" + body)
    known = set(Config.load({}).redacted())
    for name in parser["env"]:
        assert name.upper() in known, name
    commented = {
        line.lstrip("#").split("=", 1)[0]
        for line in ENV.read_text().splitlines()
        if line.startswith("#SANDBOXD_")
    }
    assert commented <= known


def test_token_is_a_credential_not_an_environment_value() -> None:
    assert one("LoadCredential") == "token:/etc/sandboxd/token"
    environment = service()["Environment"]
    assert "SANDBOXD_TOKEN_FILE=%d/token" in environment
    assert not any("TOKEN=" in e and "TOKEN_FILE" not in e for e in environment)


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    # verify checks that ExecStart exists: point it at a binary this machine has.
    unit = tmp_path / "sandboxd.service"
    unit.write_text(
        UNIT.read_text().replace("ExecStart=/opt/sandboxd/bin/twistd", "ExecStart=/bin/true")
    )
    result = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    complaints = [
        line for line in (result.stdout + result.stderr).splitlines() if "sandboxd.service" in line
    ]
    assert result.returncode == 0 and not complaints, result.stdout + result.stderr


SOCKET = REPO / "packaging" / "systemd" / "sandboxd.socket"


def test_the_socket_unit_holds_the_port_on_both_families() -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(SOCKET.read_text())
    socket = parser["Socket"]
    assert (socket["ListenStream"], socket["BindIPv6Only"]) == ("8080", "both")
    assert socket["Service"] == UNIT.name
    # What the socket's comment tells the operator to set is a setting the daemon takes.
    listen = "systemd:domain=INET6:index=0"
    assert f"SANDBOXD_LISTEN={listen}" in SOCKET.read_text()
    assert Config.load({"SANDBOXD_LISTEN": listen}).listen == listen


def test_systemd_accepts_the_socket_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    (tmp_path / "sandboxd.socket").write_text(SOCKET.read_text())
    (tmp_path / "sandboxd.service").write_text(
        UNIT.read_text().replace("ExecStart=/opt/sandboxd/bin/twistd", "ExecStart=/bin/true")
    )
    result = subprocess.run(
        [analyze, "verify", "--man=no", str(tmp_path / "sandboxd.socket")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    complaints = [
        line for line in (result.stdout + result.stderr).splitlines() if "sandboxd.socket" in line
    ]
    assert result.returncode == 0 and not complaints, result.stdout + result.stderr
