"""bench: the egress rows (bench/sbench/egress.py): the section is registered, says why it
cannot run, and makes its rows (ratios, targets) from ``bench/egress_names.py``'s samples.

Shape only: the figures are a full run's as root (docs/performance.rst); the measuring itself
is ``bench/egress_names.py``, run by the section.
"""

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH)]

from bench import run as bench_run  # noqa: E402
from bench.sbench import egress, figures  # noqa: E402


def test_the_section_is_one_of_the_bench() -> None:
    assert "egress" in bench_run.SECTIONS
    assert bench_run.parse(["--only", "egress"]).only == ["egress"]
    assert callable(figures.Bench.egress)
    quick, full = figures.Sizes(quick=True), figures.Sizes(quick=False)
    assert full.egress_bulk_bytes == 64 << 20 and quick.egress_bulk_bytes < 64 << 20


def bench(quick: bool) -> Any:
    return figures.Bench(None, figures.Sizes(quick), Path("/nonexistent"))


SAMPLES = {
    "small": {"direct": [0.0003, 0.0002, 0.0004], "proxied": [0.0004, 0.0005, 0.0003]},
    "bulk": {"direct": [0.1, 0.2, 0.1], "proxied": [0.11, 0.5, 0.1]},
    "bulk_bytes": 64 << 20,
    "loadavg_before": [1.0, 1.0, 1.0],
    "loadavg_after": [2.0, 1.0, 1.0],
}


def test_the_rows_are_p50s_and_median_rates_judged_against_direct() -> None:
    full = bench(quick=False)
    egress.record(full, SAMPLES)
    rows = {(row["figure"], row["variant"]): row for row in full.rows}
    small = rows[(egress.SMALL, "through the proxy")]
    assert small["value"] == pytest.approx(0.4) and small["ref_value"] == pytest.approx(0.3)
    assert small["ratio"] == pytest.approx(4 / 3) and small["met"] is False  # > 1.2 x
    rate = (64 << 20) / 1e6
    bulk = rows[(egress.BULK, "through the proxy, 64 MiB")]
    assert bulk["value"] == pytest.approx(rate / 0.11)
    assert rows[(egress.BULK, "direct, 64 MiB")]["value"] == pytest.approx(rate / 0.1)
    assert bulk["share_of_direct"] == pytest.approx(0.1 / 0.11) and bulk["met"] is True
    assert bulk["target"] == "≥ 80% of direct"
    assert egress.share_of(100.0).check(80.0) and not egress.share_of(100.0).check(79.9)
    assert bulk["loadavg"] == [[1.0, 1.0, 1.0], [2.0, 1.0, 1.0]]
    quick = bench(quick=True)
    egress.record(quick, SAMPLES)
    assert all(row["met"] is None for row in quick.rows)  # a quick run judges nothing


def test_the_judged_run_has_rows_of_its_own() -> None:
    full = bench(quick=False)
    judged = {
        **SAMPLES,
        "small": {"direct": [0.0003], "judged": [0.00033]},
        "bulk": {"direct": [0.1], "judged": [0.1]},
    }
    egress.record(full, judged)
    rows = {(row["figure"], row["variant"]): row for row in full.rows}
    small = rows[(egress.SMALL, "judged in the kernel")]
    assert small["ratio"] == pytest.approx(1.1) and small["met"] is True
    assert rows[(egress.SMALL, "direct (beside judged in the kernel)")]["value"] == 0.3
    bulk = rows[(egress.BULK, "judged in the kernel, 64 MiB")]
    assert bulk["share_of_direct"] == pytest.approx(1.0) and bulk["met"] is True


def test_the_section_runs_both_ways_where_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[bool] = []

    def measure(rounds: int, requests: int, size: int, judge: bool = False) -> dict[str, Any]:
        runs.append(judge)
        way = "judged" if judge else "proxied"
        return {**SAMPLES, "small": {"direct": [0.0003], way: [0.0003]},
                "bulk": {"direct": [0.1], way: [0.1]}}  # fmt: skip

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(egress, "measure", measure)
    b = bench(quick=True)
    egress.section(b)
    assert runs == [False, True] and len(b.rows) == 8
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "iptables-nft" else name)
    b = bench(quick=True)
    egress.section(b)
    assert len(b.rows) == 4 and b.notes == [
        "egress rows judged in the kernel skipped: no iptables-nft"
    ]


def test_where_it_cannot_run_one_note_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    b = bench(quick=True)
    egress.section(b)
    assert b.notes == ["egress rows skipped: not root"] and not b.rows
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert egress.unavailable() == "no nft (nftables)"
