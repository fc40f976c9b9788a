"""The start-up line that says where the daemon listens and how to reach it."""

import pytest

from sandboxd.config import Config
from sandboxd.reach import reach_hint


@pytest.mark.parametrize(
    ("endpoint", "port", "line"),
    [
        (
            "tcp:8080",
            None,
            "listening on port 8080 on every address: try  curl http://127.0.0.1:8080/healthz"
            "  or  SANDBOXD_URL=http://127.0.0.1:8080 sandboxctl create",
        ),
        (
            "tcp:0:interface=127.0.0.1",
            4242,
            "listening on 127.0.0.1 port 4242: try  curl http://127.0.0.1:4242/healthz"
            "  or  SANDBOXD_URL=http://127.0.0.1:4242 sandboxctl create",
        ),
        (
            "tcp6:port=9000:interface=\\:\\:1",
            None,
            "listening on ::1 port 9000: try  curl http://[::1]:9000/healthz"
            "  or  SANDBOXD_URL=http://[::1]:9000 sandboxctl create",
        ),
        (
            "unix:/run/sandboxd.sock",
            None,
            "listening on the unix socket /run/sandboxd.sock: try  curl --unix-socket"
            " /run/sandboxd.sock http://x/healthz",
        ),
        (
            "unix:address=/run/s.sock:mode=660",
            None,
            "listening on the unix socket /run/s.sock: try  curl --unix-socket /run/s.sock"
            " http://x/healthz",
        ),
        ("systemd:domain=INET:index=0", None, "listening on systemd:domain=INET:index=0"),
    ],
)
def test_reach_hint(endpoint: str, port: int | None, line: str) -> None:
    assert reach_hint(endpoint, port) == line


def test_the_configuration_is_shown_in_friendly_units() -> None:
    shown = Config.load(
        {
            "SANDBOXD_MEMORY_MAX": "536870912",
            "SANDBOXD_DISK_MAX": "2G",
            "SANDBOXD_EXEC_TIMEOUT": "600",
            "SANDBOXD_TOKEN_FILE": "/secret/path",
            "SANDBOXD_EGRESS_DENY": "203.0.113.0/24,198.51.100.0/24",
        }
    ).friendly()
    words = shown.split()
    for expected in (
        "SANDBOXD_MEMORY_MAX=512M",
        "SANDBOXD_DISK_MAX=2G",
        "SANDBOXD_EXEC_TIMEOUT=10m",
        "SANDBOXD_DRAIN_IDLE=10s",
        "SANDBOXD_TOKEN_FILE=<set>",
        "SANDBOXD_FILES_MAX=",
        "SANDBOXD_HEADER_TIMEOUT=10s",
        "SANDBOXD_INSECURE=no",
        "SANDBOXD_UMASK=077",
        "SANDBOXD_EGRESS_DENY=203.0.113.0/24,198.51.100.0/24",  # as given: read back alike
    ):
        assert expected in words
    assert "/secret/path" not in shown
    assert "SANDBOXD_EGRESS_DENY=" in Config.load({"SANDBOXD_EGRESS_DENY": ""}).friendly().split()
