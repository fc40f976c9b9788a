"""``sandboxctl``'s progress line (``cli._progress.ProgressBar``): redrawn only when what it
shows changes, for a known total (the percentage) and an unknown one (the MiB count)."""

from __future__ import annotations

import io

from sandboxd_client.cli._progress import MIB, ProgressBar


def drawn(stream: io.StringIO, bar: ProgressBar, done: int, total: int | None) -> int:
    """How many characters the update of ``done`` of ``total`` drew."""
    before = len(stream.getvalue())
    bar.update(done, total)
    return len(stream.getvalue()) - before


def test_a_known_total_is_redrawn_once_per_percent() -> None:
    stream = io.StringIO()
    bar = ProgressBar(stream, "big.bin")
    total = 200 * MIB
    assert drawn(stream, bar, 0, total) > 0
    assert drawn(stream, bar, MIB, total) == 0, "still 0 %"
    assert drawn(stream, bar, 2 * MIB, total) > 0, "1 %"
    assert drawn(stream, bar, total, total) > 0
    bar.finish()
    assert "big.bin" in stream.getvalue() and "100%" in stream.getvalue()


def test_an_unknown_total_is_redrawn_once_per_mib() -> None:
    stream = io.StringIO()
    bar = ProgressBar(stream, "stream")
    assert drawn(stream, bar, 10, None) > 0
    assert drawn(stream, bar, MIB - 1, None) == 0, "still the first MiB"
    assert drawn(stream, bar, MIB, None) > 0
    bar.finish()
    assert "stream" in stream.getvalue()
