"""Stream frames the route tests do not meet in memory: a background process that never
started, and a watch whose kernel queue overflowed (docs/extensions.rst)."""

import json

from sandboxd.core.processes.process import Ended
from sandboxd.http import wire


def test_a_process_that_never_started_ends_its_output_with_an_in_band_spawn_failure() -> None:
    frame = wire.reader_frame(Ended(None, "cannot start the command: no fork"))
    assert frame.endswith(b"\n")
    assert json.loads(frame) == {
        "error": "SpawnFailed",
        "detail": "cannot start the command: no fork",
    }
    assert wire.reader_frame(Ended(3)) == b'{"exit":3}\n'


def test_an_overflow_is_a_watch_frame_without_a_path() -> None:
    assert wire.watch_frame("overflow") == b'{"event":"overflow"}\n'
    assert wire.watch_frame("create", "/a", True) == b'{"event":"create","path":"/a","dir":true}\n'
