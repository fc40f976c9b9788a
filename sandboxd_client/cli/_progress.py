"""A one-line transfer progress bar for ``sandboxctl put``/``get`` on a terminal."""

from __future__ import annotations

from typing import TextIO

MIB = 1 << 20
WIDTH = 30


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


class ProgressBar:
    """
    Redraws ``label [#####.....]  42%  1.0 MiB/2.4 MiB`` in place on ``stream``.

    Redraws only when the shown percentage (or, for an unknown total, the MiB count) changes,
    so a transfer of millions of chunks costs at most a few hundred writes.
    """

    def __init__(self, stream: TextIO, label: str) -> None:
        self._stream = stream
        self._label = label
        self._last: tuple[int, int] | None = None

    def update(self, done: int, total: int | None) -> None:
        """Show ``done`` bytes of ``total`` (``None``: unknown)."""
        if total:
            percent = min(100, done * 100 // total)
            key = (percent, 0)
            filled = percent * WIDTH // 100
            line = (
                f"\r{self._label} [{'#' * filled}{'.' * (WIDTH - filled)}] {percent:3d}%  "
                f"{_mib(done)}/{_mib(total)}"
            )
        else:
            key = (-1, done // MIB)
            line = f"\r{self._label} {_mib(done)}"
        if key != self._last:
            self._last = key
            self._stream.write(line)
            self._stream.flush()

    def finish(self) -> None:
        """End the line (if anything was drawn)."""
        if self._last is not None:
            self._stream.write("\n")
            self._stream.flush()
