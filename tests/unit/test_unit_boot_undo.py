"""A start-up that stops leaves the host as it found it (``sandboxd.undo``, ``tap.makeService``).

Each boot step is made to fail after the state root was made, with ``isolation=none`` in a
temporary directory: the state root (and every parent start-up made for it) is gone again,
while a root that was there before keeps what it held. The cgroup and mount side is proven
against the real kernel in ``tests/kernel/test_startup_leaves_nothing.py``.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import attrs
import pytest
from twisted.logger import ILogObserver, formatEvent, globalLogPublisher

from sandboxd import assemble, boot
from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.namespaces.pins import HOME_VIEW, Namespaces
from sandboxd.undo import StartupUndo, missing_directories, remove_made
from tests.support.fakes import fake_isolation
from tests.unit.test_unit_tap import build, refused


@pytest.fixture
def capture() -> Iterator[list[dict[str, Any]]]:
    """Every log event while the test runs."""
    events: list[dict[str, Any]] = []
    observer = cast(ILogObserver, events.append)
    globalLogPublisher.addObserver(observer)
    try:
        yield events
    finally:
        globalLogPublisher.removeObserver(observer)


def unavailable(config: Any, reactor: Any, pool: Any) -> Any:
    raise IsolationUnavailable("no cgroup controllers delegated")


def unusable_archive(environ: dict[str, str], tmp_path: Path, _: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_bytes(b"")
    environ["SANDBOXD_ARCHIVE_ROOT"] = str(tmp_path / "file" / "archive")


def refusing_namespaces(environ: dict[str, str], _: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    namespaces = Namespaces(kinds=frozenset({"mount"}), keep=[HOME_VIEW])
    isolation = attrs.evolve(fake_isolation(), namespaces=namespaces)
    monkeypatch.setattr(assemble, "build_isolation", lambda config, reactor, pool: isolation)


def refusing_isolation(environ: dict[str, str], _: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assemble, "build_isolation", unavailable)


def refusing_disk(environ: dict[str, str], _: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(config: Any, layout: Any) -> Any:
        boot.fail("disk", "disk: SANDBOXD_DISK_MAX is set but the root is on tmpfs")

    monkeypatch.setattr(assemble, "start_disk", refuse)


def refusing_connections(environ: dict[str, str], _: Path, __: pytest.MonkeyPatch) -> None:
    environ["SANDBOXD_MAX_CONNECTIONS"] = str(1 << 40)


@pytest.mark.parametrize(
    ("step", "prepare"),
    [
        ("isolation", refusing_isolation),
        ("disk", refusing_disk),
        ("namespaces", refusing_namespaces),
        ("archive", unusable_archive),
        ("connections", refusing_connections),
    ],
)
def test_a_step_that_fails_removes_the_state_root_it_made(
    environ: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    step: str,
    prepare: Any,
) -> None:
    environ["SANDBOXD_ROOT"] = str(tmp_path / "made" / "for" / "root")
    prepare(environ, tmp_path, monkeypatch)
    assert f"start-up failed at {step}:" in refused(environ)
    assert not (tmp_path / "made").exists()


def test_a_root_that_was_there_keeps_what_it_held(
    environ: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = Path(environ["SANDBOXD_ROOT"])
    root.mkdir()
    (root / "0123456789abcdef").mkdir()  # a predecessor's sandbox, for the next recovery
    monkeypatch.setattr(assemble, "build_isolation", unavailable)
    refused(environ)
    assert [p.name for p in root.iterdir()] == ["0123456789abcdef"]  # the lock made went
    (root / ".lock").write_bytes(b"")
    refused(environ)
    assert sorted(p.name for p in root.iterdir()) == [".lock", "0123456789abcdef"]


def test_the_token_is_checked_before_anything_is_made(
    environ: dict[str, str], tmp_path: Path
) -> None:
    environ["SANDBOXD_TOKEN_FILE"] = str(tmp_path / "missing-token")
    assert "at token:" in refused(environ)
    assert not Path(environ["SANDBOXD_ROOT"]).exists()


def test_a_second_daemon_leaves_the_first_ones_root_alone(environ: dict[str, str]) -> None:
    build(environ)
    assert "another sandboxd" in refused(environ)
    assert (Path(environ["SANDBOXD_ROOT"]) / ".lock").is_file()


def test_a_port_taken_before_the_reactor_runs_removes_the_root(
    environ: dict[str, str], tmp_path: Path
) -> None:
    environ["SANDBOXD_ROOT"] = str(tmp_path / "made" / "root")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        environ["SANDBOXD_LISTEN"] = f"tcp:{squatter.getsockname()[1]}:interface=127.0.0.1"
        service = build(environ)
        assert (tmp_path / "made" / "root" / ".lock").is_file()

        class NotRunning:
            running = False

        service.reactor = NotRunning()
        with pytest.raises(SystemExit, match="start-up failed at listen"):
            service.startService()
        service.exit_status.code = 0  # this test process exits as pytest says
    assert not (tmp_path / "made").exists()


# The undo list itself


def test_undo_runs_last_first_and_goes_on_past_a_failure(capture: list[dict[str, Any]]) -> None:
    done: list[str] = []
    undo = StartupUndo()
    undo.add("first", lambda: done.append("first"))

    def broken() -> None:
        raise OSError(errno.EBUSY, "Device or resource busy")

    undo.add("second", broken)
    undo.add("third", lambda: done.append("third"))
    undo.run()
    assert done == ["third", "first"]
    said = [formatEvent(e) for e in capture]
    assert "start-up failed: cannot undo second: [Errno 16] Device or resource busy" in said
    undo.run()
    assert done == ["third", "first"]  # nothing twice


def test_forgotten_steps_are_never_undone() -> None:
    done: list[str] = []
    undo = StartupUndo()
    undo.add("step", lambda: done.append("step"))
    undo.forget()
    undo.run()
    assert done == []


def test_missing_directories_and_their_removal(
    tmp_path: Path, capture: list[dict[str, Any]]
) -> None:
    deep = tmp_path / "a" / "b" / "c"
    made = missing_directories(str(deep))
    assert made == [str(deep), str(deep.parent), str(deep.parent.parent)]
    deep.mkdir(parents=True)
    (deep.parent / "other").write_bytes(b"not ours")
    remove_made([str(deep / "gone")], [*made, str(tmp_path / "never-made")])
    assert not deep.exists() and (deep.parent / "other").exists()
    assert any("left in place" in formatEvent(e) for e in capture)
