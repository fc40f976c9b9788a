"""What a start-up made on the host, undone when the start-up stops (:class:`StartupUndo`).

Each boot step that makes something outside the process (a cgroup directory, the state root,
the namespaces' mount) says how to remove it; a step that fails after them, before the daemon
listens, removes everything made so far, last made first: a failed start-up leaves the host
as it found it. Once the daemon listens, its drain is what cleans up (``SandboxManager``).
"""

import contextlib
import os
from collections.abc import Callable

from attrs import define, field
from twisted.logger import Logger

log = Logger()


@define
class StartupUndo:
    """Undo actions of the boot steps done so far, in the order they were made."""

    steps: list[tuple[str, Callable[[], object]]] = field(factory=list)

    def add(self, what: str, action: Callable[[], object]) -> None:
        """Remember how to undo ``what`` (a boot step's name, for the log)."""
        self.steps.append((what, action))

    def run(self) -> None:
        """Undo every step, last first; a failing action is logged and the others still run.
        Running it again finds nothing left to do."""
        while self.steps:
            what, action = self.steps.pop()
            try:
                action()
            except Exception as e:
                log.warn("start-up failed: cannot undo {what}: {why}", what=what, why=e)

    def forget(self) -> None:
        """The daemon runs: its drain removes what start-up made (nothing is undone)."""
        self.steps.clear()


def missing_directories(path: str) -> list[str]:
    """``path`` and each of its parents that does not exist yet, deepest first: what
    ``os.makedirs(path)`` would make."""
    missing = []
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:  # pragma: no cover - "/" always exists
            break
        path = parent
    return missing


def remove_made(files: list[str], directories: list[str]) -> None:
    """Remove ``files`` and then ``directories`` (deepest first) that start-up made; one
    that is gone already is fine, a directory that is not empty is left (and said)."""
    for path in files:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    for path in directories:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            log.warn("start-up failed: {path} left in place: {why}", path=path, why=e.strerror)
