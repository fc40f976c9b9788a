"""The terminal ``sandboxctl`` writes to: the :class:`Console` (binary stdout for data, text
stderr for notes and failures), the one line a failure is told in, and transfers drawn with a
progress bar."""

from __future__ import annotations

import json
import sys
from typing import Any, BinaryIO, TextIO

from .. import SandboxError
from ._progress import MIB, ProgressBar


def describe(e: BaseException) -> str:
    """One line naming the failure for a person."""
    if isinstance(e, SandboxError):
        return f"{type(e).__name__}: {e.detail}"
    if isinstance(e, OSError) and e.strerror:
        return f"{type(e).__name__}: {e.strerror}" + (f": {e.filename}" if e.filename else "")
    return f"{type(e).__name__}: {e}"


class Console:
    """Where ``run`` writes: binary stdout (command output, results) and text stderr."""

    def __init__(
        self,
        out: BinaryIO,
        err: TextIO,
        *,
        tty: bool | None = None,
        stdin: BinaryIO | None = None,
    ) -> None:
        self.out = out
        self.err = err
        self.tty = err.isatty() if tty is None else tty
        self._stdin = stdin
        self.reactor: Any = None
        """The reactor stdin is read on (``main_async``'s; the global one when unset)."""

    @property
    def stdin(self) -> BinaryIO:
        """Where ``put -`` and ``exec -i`` read (this process's stdin unless given)."""
        return sys.stdin.buffer if self._stdin is None else self._stdin

    def note(self, message: str) -> None:
        """A remark for the person (``no sandboxes``) on stderr: stdout keeps only data."""
        self.err.write(f"{message}\n")
        self.err.flush()

    def print(self, text: str) -> None:
        self.out.write(text.encode("utf-8") + b"\n")
        self.out.flush()

    def error(self, message: str) -> None:
        """One line on stderr: ``sandboxctl: <message>``."""
        self.err.write(f"sandboxctl: {message}\n")
        self.err.flush()

    def json(self, value: object) -> None:
        self.print(json.dumps(value, sort_keys=True))

    def progress(self, label: str, total: int | None) -> ProgressBar | None:
        """A progress bar on stderr, only on a terminal and only for large transfers."""
        if self.tty and (total is None or total >= MIB):
            return ProgressBar(self.err, label)
        return None


async def _transfer(console: Console, label: str, call: Any, *args: Any) -> Any:
    """Run an upload/download, drawing a progress bar when ``console`` wants one."""
    bar: list[ProgressBar | None] = []

    def on_progress(done: int, total: int | None) -> None:
        if not bar:
            bar.append(console.progress(label, total))
        if bar[0] is not None:
            bar[0].update(done, total)

    try:
        return await call(*args, on_progress=on_progress)
    finally:
        if bar and bar[0] is not None:
            bar[0].finish()
