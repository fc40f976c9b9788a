"""Transfer progress for ``sandboxctl put``/``get`` on a terminal: bytes, rate and ETA.

Drawn by ``rich.progress`` (imported only when a bar is shown, so other commands never pay
for it), on stderr, so that stdout keeps only data.
"""

from __future__ import annotations

from typing import Any, TextIO

MIB = 1 << 20


class ProgressBar:
    """One line on ``stream``: ``label ━━━━━╸━━━  42%  1.0/2.4 MB  3.1 MB/s  0:00:01``.

    ``update`` may be called for every chunk: the line is redrawn only when the shown
    percentage (or, for an unknown total, the MiB count) changes.
    """

    def __init__(self, stream: TextIO, label: str) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        console = Console(file=stream, force_terminal=True, soft_wrap=False)
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            auto_refresh=False,
            transient=False,
        )
        self._task: Any = None
        self._label = label
        self._last: tuple[int, int] | None = None

    def update(self, done: int, total: int | None) -> None:
        """Show ``done`` bytes of ``total`` (``None``: unknown)."""
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task(self._label, total=total)
        key = (min(100, done * 100 // total), 0) if total else (-1, done // MIB)
        self._progress.update(self._task, completed=done, total=total)
        if key != self._last:
            self._last = key
            self._progress.refresh()

    def finish(self) -> None:
        """End the line (``update`` has drawn it at least once)."""
        self._progress.refresh()
        self._progress.stop()
