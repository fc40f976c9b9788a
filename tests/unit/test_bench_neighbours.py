"""bench: the neighbour rows (bench/sbench/neighbours.py): their shape, bounds and verdicts.

Shape only: no figure is asserted (the figures are ``bench/run``'s; ``bench/run.py --quick``
runs the section itself against a real daemon in CI).
"""

import os
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH)]

from bench import run as bench_run  # noqa: E402
from bench.sbench import figures, neighbour_driver, neighbours, report  # noqa: E402
from bench.sbench.rawhttp import CHUNK  # noqa: E402


def test_the_section_is_one_of_the_bench() -> None:
    assert "neighbours" in bench_run.SECTIONS
    assert bench_run.parse(["--only", "neighbours"]).only == ["neighbours"]


@pytest.mark.parametrize(
    "load", [load for load in neighbours.LOADS if load not in ("upload", "walk")]
)
def test_every_command_of_a_load_has_an_outer_kill_bound(load: str) -> None:
    sizes = figures.Sizes(quick=True)
    cmd = neighbours.commands(load, sizes, 7)
    assert cmd is not None and cmd[:4] == ["timeout", "-s", "KILL", "7"]
    assert neighbours.tree_command(10, 7)[:4] == ["timeout", "-s", "KILL", "7"]


def test_a_quick_bomb_stops_short_of_the_pids_limit_and_says_so() -> None:
    quick, full = figures.Sizes(quick=True), figures.Sizes(quick=False)
    assert "fork while $n++ < 5;" in " ".join(neighbours.commands("fork bomb", quick, 7) or [])
    assert "fork while 1" in " ".join(neighbours.commands("fork bomb", full, 7) or [])
    assert neighbours.describe("fork bomb", quick) == "fork-bombs to 32 processes"
    assert neighbours.describe("fork bomb", full) == "fork-bombs to its pids limit"


def test_the_keystrokes_neighbour_types_at_its_rate_into_a_raw_echo() -> None:
    sizes = figures.Sizes(quick=True)
    assert sizes.neighbour_keystroke_rate == 10_000  # issue 32's rate, quick or not
    assert (neighbours.commands("keystrokes", sizes, 7) or [])[4:] == [
        "sh",
        "-c",
        "stty raw -echo && echo ready && exec cat",
    ]
    assert neighbours.describe("keystrokes", sizes) == (
        "is typed 10000 bytes/s on a terminal, its echo read"
    )


def test_the_daemons_own_timeout_comes_after_the_kill_bound() -> None:
    import json

    assert json.loads(neighbour_driver.exec_body(["true"], 7)) == {"cmd": ["true"], "timeout": 12}


def test_an_upload_body_is_exactly_its_size() -> None:
    size = 2 * CHUNK + 5
    assert sum(len(chunk) for chunk in neighbour_driver.zeros(size)) == size


def test_the_loads_measured_can_be_chosen() -> None:
    sizes = figures.Sizes(quick=True)
    assert neighbours.chosen(sizes) == list(neighbours.LOADS)
    sizes.neighbour_loads = "walk, upload"
    assert neighbours.chosen(sizes) == ["upload", "walk"]
    sizes.neighbour_loads = "upload,uploads"
    with pytest.raises(ValueError, match="no such load: uploads"):
        neighbours.chosen(sizes)


def test_processes_of_a_uid_are_found() -> None:
    assert os.getpid() in neighbours.uid_processes(os.getuid())


def test_no_isolated_daemon_no_rows_and_a_note(tmp_path: Path) -> None:
    bench = figures.Bench(None, figures.Sizes(quick=True), tmp_path)
    neighbours.section(bench)
    assert bench.rows == []
    assert bench.notes == ["neighbour rows skipped: no isolated daemon"]


def _measured(idle_ms: float, loaded_ms: float) -> dict[str, Any]:
    idle = [idle_ms / 1000] * 100
    loaded = [loaded_ms / 1000] * 90 + [3 * loaded_ms / 1000] * 10  # p50 1x, p99 3x
    return {
        load: {"idle": idle, "loaded": loaded, "seconds": 1.0, "neighbour": {"cycles": 1}}
        for load in neighbours.LOADS
    }


@pytest.mark.parametrize(("loaded_ms", "met"), [(2.0, True), (8.0, False)])
def test_each_load_is_judged_on_its_p99_against_the_idle_p99(loaded_ms: float, met: bool) -> None:
    bench = figures.Bench(None, figures.Sizes(quick=False), Path("/nonexistent"))
    neighbours.add_rows(bench, _measured(2.0, loaded_ms))
    assert len(bench.rows) == len(neighbours.LOADS)
    for row in bench.rows:
        assert row["value"] == pytest.approx(loaded_ms)  # p50
        assert row["p99_ms"] == pytest.approx(3 * loaded_ms)
        assert row["ref"] == "idle p99" and row["ref_value"] == pytest.approx(2.0)
        assert row["ratio"] == pytest.approx(3 * loaded_ms / 2.0)
        assert row["met"] is met
    text = report.table({"meta": _meta(False), "rows": bench.rows, "notes": []})
    assert "p99" in text.splitlines()[3].split()
    assert "fork-bombs to its pids limit" in report.rst({"meta": _meta(False), **_rows(bench)})


def test_a_quick_run_judges_nothing(tmp_path: Path) -> None:
    bench = figures.Bench(None, figures.Sizes(quick=True), tmp_path)
    neighbours.add_rows(bench, _measured(2.0, 8.0))
    assert all(row["target"] is None and row["met"] is None for row in bench.rows)


def _rows(bench: figures.Bench) -> dict[str, Any]:
    return {"rows": bench.rows, "notes": []}


def _meta(quick: bool) -> dict[str, Any]:
    return {
        "quick": quick,
        "revision": "abc",
        "cpus": 2,
        "loadavg_start": [1.0, 1.0, 1.0],
        "loadavg_end": [1.0, 1.0, 1.0],
        "seconds": 1.0,
        "started": "2026-12-02T00:00:00+00:00",
    }
