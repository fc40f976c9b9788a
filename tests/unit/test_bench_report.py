"""bench/sbench/report.py: a quick run judges nothing; a full run keeps its verdicts."""

import json
from pathlib import Path
from typing import Any

import pytest

from bench.sbench import report


def _result(quick: bool) -> dict[str, Any]:
    meta = {
        "quick": quick,
        "revision": "abc123",
        "cpus": 2,
        "loadavg_start": [0.5, 0.4, 0.3],
        "loadavg_end": [0.6, 0.4, 0.3],
        "seconds": 12.0,
        "started": "2026-12-01T00:00:00+00:00",
    }
    rows = [
        {
            "figure": "exec true",
            "variant": "client",
            "value": 9.5,
            "unit": "ms",
            "ref": "floor",
            "ref_value": 1.0,
            "ratio": 9.5,
            "target": "<= 3 x ref",
            "met": False,
        },
        {
            "figure": "stream",
            "variant": "raw",
            "value": 900.0,
            "unit": "MB/s",
            "ref": None,
            "ref_value": None,
            "ratio": None,
            "target": ">= 100 MB/s",
            "met": True,
        },
    ]
    return {"meta": meta, "rows": rows, "notes": []}


def test_quick_table_shows_each_row_ran_and_judges_nothing() -> None:
    text = report.table(_result(quick=True))
    assert "not measurements" in text
    assert "exec true" in text and "9.50 ms" in text
    assert "900 MB/s" in text
    header = next(line for line in text.splitlines() if line.startswith("figure"))
    assert header.split() == ["figure", "variant", "value", "reference"]
    for word in ("NO", "yes", "9.50x", "<= 3 x ref"):
        assert word not in text.split(), word


def test_full_table_keeps_ratio_target_and_verdicts() -> None:
    text = report.table(_result(quick=False))
    assert "not measurements" not in text
    assert "9.50x" in text
    verdicts = [line.split()[-1] for line in text.splitlines() if line.startswith(("exec", "str"))]
    assert verdicts == ["NO", "yes"]


@pytest.mark.parametrize("quick", [True, False])
def test_quick_run_leaves_the_latest_full_figures_alone(tmp_path: Path, quick: bool) -> None:
    (tmp_path / "latest.json").write_text('{"full": true}')
    path = report.write(_result(quick), tmp_path)
    assert json.loads(path.read_text())["meta"]["quick"] is quick
    latest = json.loads((tmp_path / "latest.json").read_text())
    if quick:
        assert path.name.endswith("-quick.json")
        assert latest == {"full": True}
        assert not (tmp_path / "latest.rst").exists()
        assert json.loads((tmp_path / "latest-quick.json").read_text())["meta"]["quick"]
    else:
        assert latest["meta"]["quick"] is False
        assert "exec true" in (tmp_path / "latest.rst").read_text()


def test_a_run_of_some_sections_leaves_every_latest_file_alone(tmp_path: Path) -> None:
    (tmp_path / "latest.json").write_text('{"full": true}')
    result = _result(quick=False)
    result["meta"]["sections"] = ["density"]
    path = report.write(result, tmp_path)
    assert path.name.endswith("-partial.json")
    assert json.loads(path.read_text())["meta"]["sections"] == ["density"]
    assert json.loads((tmp_path / "latest.json").read_text()) == {"full": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, "latest.json"])


def test_readme_table_leaves_a_peer_row_without_a_target_blank() -> None:
    result = _result(quick=False)
    unjudged = {"target": None, "met": None, "ref": None, "ref_value": None, "ratio": None}
    result["rows"].append({**result["rows"][0], **unjudged, "variant": "docker 20.10 (raw)"})
    line = next(row for row in report.rst(result).splitlines() if "docker 20.10" in row)
    assert line.split()[-2:] == ["9.50", "ms"]
    assert "None" not in report.rst(result)


def test_a_row_that_misses_its_target_says_what_limits_it() -> None:
    from bench.sbench import limits

    assert limits.limited_by("exec true", "isolated (raw)") is not None
    fork = limits.limited_by(limits.NEIGHBOURS, "isolated: neighbour fork-bombs to its pids limit")
    assert fork is not None and "pids limit" in fork and limits.WHERE in fork
    assert limits.limited_by(limits.NEIGHBOURS, "isolated: neighbour hums quietly") is None
    typed = limits.limited_by(
        limits.NEIGHBOURS, "isolated: neighbour is typed 10000 bytes/s on a terminal"
    )
    assert typed is not None and typed.startswith("each typed message")
    assert limits.limited_by("a figure nobody profiled", "x") is None

    result = _result(quick=False)
    result["rows"][0]["limited_by"] = "the reactor's own work"
    result["rows"][1]["limited_by"] = "kept only where a target is missed"
    assert report.unmet(result) == ["exec true (client): the reactor's own work"]
    assert "not met: exec true (client): the reactor's own work" in report.table(result)
    assert "not met" not in report.table({**result, "meta": {**result["meta"], "quick": True}})
    readme = report.rst(result)
    assert readme.endswith("- exec true (client): the reactor's own work")
    del result["rows"][0]["limited_by"]
    assert report.unmet(result) == [] and "What limits" not in report.rst(result)


def test_an_unisolated_exec_is_limited_by_its_helper_not_a_zygote() -> None:
    from bench.sbench import limits

    isolated = limits.limited_by("exec true", "isolated (raw)")
    unisolated = limits.limited_by("exec true", "none (raw)")
    assert isolated is not None and "zygote" in isolated and "py-spy" in isolated
    assert unisolated is not None and "helper program" in unisolated
