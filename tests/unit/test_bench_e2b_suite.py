"""bench/sbench/e2bsuite.py: when the E2B suite's section runs, what it runs, its rows.

Shape only: the counts are ``bench/e2b_suite.py``'s (a full run of ``bench/run`` with a mirror
of e2b-dev/E2B; docs/e2b.rst lists them)."""

import json
import sys
from pathlib import Path

import pytest

from bench.sbench import e2bsuite, figures

COUNTS = {
    "e2b": "2.45.1",
    "suite": "@e2b/python-sdk@2.45.1",
    "passed": 928,
    "failed": 156,
    "skipped": 3,
    "report": "/cache/junit-e2b-2.45.1-isolated.xml",
}


def test_without_a_mirror_or_in_a_quick_run_one_note_says_why(tmp_path: Path) -> None:
    for quick, mirror, why in (
        (True, str(tmp_path), "a quick run"),
        (False, None, "no mirror of e2b-dev/E2B"),
        (False, str(tmp_path / "absent"), "is no directory"),
    ):
        bench = figures.Bench(None, figures.Sizes(quick), tmp_path)
        e2bsuite.section(bench, mirror, isolated=False)
        assert bench.rows == [] and len(bench.notes) == 1 and why in bench.notes[0]
    assert e2bsuite.skipped(False, str(tmp_path)) is None


def test_each_release_runs_the_script_with_its_isolation() -> None:
    line = e2bsuite.command("/m.git", "2.45.1", isolated=True)
    assert line[0] == sys.executable and line[1].endswith("bench/e2b_suite.py")
    assert line[2:] == ["--mirror", "/m.git", "--e2b", "2.45.1", "--isolated"]
    assert "--isolated" not in e2bsuite.command("/m.git", "2.63.0", isolated=False)
    assert e2bsuite.RELEASES == ("2.45.1", "2.63.0")


def test_the_counts_are_the_scripts_last_json_line() -> None:
    printed = "FAILED a::b: {not json}\n" + json.dumps(COUNTS) + "\n"
    assert e2bsuite.outcome(printed) == COUNTS
    assert e2bsuite.outcome("pytest crashed\n") is None
    assert e2bsuite.outcome("{broken\n") is None
    assert e2bsuite.outcome('{"other": 1}\n') is None


def test_one_row_and_note_per_release(tmp_path: Path) -> None:
    bench = figures.Bench(None, figures.Sizes(False), tmp_path)
    e2bsuite.add_row(bench, COUNTS, isolated=True)
    [row] = bench.rows
    assert row["figure"] == e2bsuite.FIGURE and row["unit"] == "passed"
    assert row["variant"] == "e2b 2.45.1 (isolated; suite at @e2b/python-sdk@2.45.1)"
    assert (row["value"], row["failed"], row["skipped"], row["tests"]) == (928, 156, 3, 1087)
    assert row["target"] is None and row["ratio"] is None
    assert bench.notes == [
        "E2B suite, e2b 2.45.1: 928 passed, 156 failed, 3 skipped of 1087"
        " (report: /cache/junit-e2b-2.45.1-isolated.xml)"
    ]


@pytest.mark.parametrize("value", [928.0, 0.0])
def test_the_table_says_passed(value: float) -> None:
    from bench.sbench import report

    assert report.fmt(value, "passed") == f"{value:.0f} passed"
