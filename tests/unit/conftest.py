"""The unit tests build the daemon's real service tree in this process: a drain it starts
installs the second-signal handlers (``sandboxd.stop_signals``); put pytest's back after. No
test here talks to a systemd, and ``environ`` is the smallest environment a daemon starts in."""

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def stop_signal_handlers_restored() -> Iterator[None]:
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


@pytest.fixture(autouse=True)
def no_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    return {
        "SANDBOXD_ISOLATION": "none",
        "SANDBOXD_LISTEN": "tcp:0:interface=127.0.0.1",
        "SANDBOXD_ROOT": str(tmp_path / "root"),
        "SANDBOXD_TOOLS_DIR": str(tmp_path / "tools"),
        "SANDBOXD_UID_MIN": "1000",
        "SANDBOXD_UID_MAX": "1003",
    }
