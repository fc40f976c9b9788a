"""bench/sbench/density.py: the rows made of what the section measured (shape and verdicts;
the figures themselves are ``bench/run``'s)."""

from pathlib import Path
from typing import Any

import pytest

from bench.sbench import density, figures


def _census(live: int) -> dict[str, int]:
    return {
        "daemon_rss_kib": 60_000 + 2 * live,
        "tree_pss_kib": 50_000 + 2 * live,
        "mem_available_kib": 20_000_000 - 700 * live,
        "slab_kib": 2_000_000 + 700 * live,
        "host_processes": 120,
        "tree_processes": 2,
        "tree_fds": 20,
        "mounts": 50 + 3 * live,
        "cgroups": 5 * live,
        "veths": live,
        "sandbox_dirs": live,
        "uid_processes": 0,
    }


def _measured(n: int, left_mounts: int = 0, leftovers: list[str] | None = None) -> dict[str, Any]:
    after = _census(0)
    after["mounts"] += left_mounts
    return {
        "count": n,
        "asked": n,
        "budget_s": 900.0,
        "in_flight": 8,
        "network": "egress",
        "capabilities": ["isolation.mount", "network.egress"],
        "cold_ms": [1.5, 1.8, 2.5],
        "create_ms": [1.0] * (n // 2) + [3.0] * (n - n // 2),
        "first_tenth_p50_ms": 1.0,
        "last_tenth_p50_ms": 3.0,
        "wall_s": n / 600,
        "kill_wall_s": n / 300,
        "before": _census(0),
        "full": _census(n),
        "after": after,
        "host_leftovers": leftovers or [],
        "loadavg_fill_start": [1.0, 1.0, 1.0],
        "loadavg_fill_end": [1.0, 1.0, 1.0],
    }


def _rows(bench: figures.Bench) -> dict[str, dict[str, Any]]:
    return {f"{r['figure']} | {r['variant'].split(' /')[0]}": r for r in bench.rows}


def test_per_sandbox_costs_targets_and_a_clean_end(tmp_path: Path) -> None:
    bench = figures.Bench(None, figures.Sizes(quick=False), tmp_path)
    density.add_rows(bench, _measured(1000))
    rows = _rows(bench)
    cold = rows[
        "cold create, every layer on | isolated (raw, one at a time; every layer, network egress)"
    ]
    assert cold["value"] == 1.8 and cold["met"] is True
    rate = next(r for r in bench.rows if r["figure"] == "creates sustained, every layer on")
    assert rate["value"] == pytest.approx(600) and rate["met"] is True
    assert rows["daemon memory per idle sandbox | isolated: daemon RSS"]["value"] == 2
    assert rows["host memory per idle sandbox | isolated: MemAvailable drop"]["value"] == 700
    assert rows["mounts per idle sandbox | isolated: daemon's mount table"]["value"] == 3
    assert rows["cgroups per idle sandbox | isolated: sandbox cgroup dirs"]["value"] == 5
    assert rows["processes per idle sandbox | isolated: host processes"]["value"] == 0
    left = next(r for r in bench.rows if r["figure"] == "left after killing them all")
    assert left["value"] == 0 and left["met"] is True


@pytest.mark.parametrize(
    ("left_mounts", "leftovers"), [(3, []), (0, ["/sys/fs/cgroup/memory/x/sandboxd-1"])]
)
def test_anything_left_fails_the_clean_end(
    tmp_path: Path, left_mounts: int, leftovers: list[str]
) -> None:
    bench = figures.Bench(None, figures.Sizes(quick=False), tmp_path)
    density.add_rows(bench, _measured(10, left_mounts, leftovers))
    left = next(r for r in bench.rows if r["figure"] == "left after killing them all")
    assert left["value"] > 0 and left["met"] is False
    assert left["host_leftovers"] == leftovers


def test_host_leftovers_names_what_is_still_there(tmp_path: Path) -> None:
    gone, kept = tmp_path / "gone", tmp_path / "kept"
    kept.mkdir()
    assert density.host_leftovers([gone, kept], tmp_path / "nothing") == [str(kept)]
    assert density.host_leftovers([], tmp_path) == [str(tmp_path)]


def test_the_pool_is_waited_for_and_named_in_the_labels(tmp_path: Path) -> None:
    pool = tmp_path / ".ns" / ".pool"
    info = tmp_path / "mountinfo"
    info.write_text(
        f"36 35 0:4 net:[1] {pool}/0 rw - nsfs nsfs rw\n"
        f"37 35 0:4 net:[2] {pool}x/1 rw - nsfs nsfs rw\n"
        f"38 35 0:4 net:[3] {pool}/1 rw - nsfs nsfs rw\n"
    )
    density.wait_pool(tmp_path, 0)  # no pool: nothing to wait for
    density.wait_pool(tmp_path, 2, limit=60)  # the daemon has no pool: nothing to wait for
    pool.mkdir(parents=True)
    assert density.pinned(pool, str(info)) == 2
    density.wait_pool(tmp_path, 3, limit=0.01, mountinfo=str(info))  # not full: gives up
    density.wait_pool(tmp_path, 2, limit=60, mountinfo=str(info))  # full: returns at once
    assert density.pool_label(0) == ""
    assert density.pool_label(8) == ", netns pool 8"
