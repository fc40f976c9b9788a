"""A command the host cannot start (EAGAIN, ENOMEM) ends in band and is not left running."""

import errno
from typing import Any

from twisted.internet.task import Clock

from sandboxd.core.exec.run import ExecRun
from sandboxd.http import wire


class RefusingReactor:
    def __init__(self, error: OSError) -> None:
        self.error = error

    def spawnProcess(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error


def start(error: OSError) -> tuple[ExecRun, list[tuple[int, bytes]], list[str]]:
    emitted: list[tuple[int, bytes]] = []
    ended: list[str] = []
    run = ExecRun(
        Clock(),
        lambda fd, data: emitted.append((fd, data)),
        max_output=1024,
        log_timeout=60,
        timeout=60,
        on_end=lambda: ended.append("end"),
    )
    run.start(RefusingReactor(error), ["sh"], {}, None, 0)  # type: ignore[arg-type]
    return run, emitted, ended


def frame_of(run: ExecRun) -> dict[str, Any]:
    assert run.outcome is not None
    return wire.final_frame(run.outcome)


def test_a_spawn_failure_is_an_in_band_error_frame() -> None:
    run, _, ended = start(OSError(errno.EAGAIN, "Resource temporarily unavailable"))
    assert run.ended and ended == ["end"]
    assert run.outcome is not None
    assert wire.final_frame(run.outcome) == {
        "error": "SpawnFailed",
        "detail": "cannot start the command: [Errno 11] Resource temporarily unavailable",
    }
    frames: list[Any] = []
    run.when_finished().addCallback(frames.append)
    assert frames == [run.outcome]


def test_missing_and_non_executable_commands_are_exit_frames() -> None:
    run, emitted, _ = start(FileNotFoundError(errno.ENOENT, "No such file"))
    assert frame_of(run)["exit"] == 127 and emitted
    run, _, _ = start(PermissionError(errno.EACCES, "Permission denied"))
    assert frame_of(run)["exit"] == 126
