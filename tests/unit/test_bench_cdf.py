"""bench/sbench/cdf.py: the exec latency CDF drawn from the samples a run keeps."""

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from bench.sbench import cdf, report

SVG = "{http://www.w3.org/2000/svg}"


def _row(variant: str, samples: list[float] | None, figure: str = "exec true") -> dict[str, Any]:
    row: dict[str, Any] = {
        "figure": figure,
        "variant": variant,
        "value": 1.0,
        "unit": "ms",
        "ref": None,
        "ref_value": None,
        "ratio": None,
        "target": None,
        "met": None,
    }
    if samples is not None:
        row["samples_ms"] = samples
    return row


def _result(rows: list[dict[str, Any]], quick: bool = False) -> dict[str, Any]:
    meta = {
        "quick": quick,
        "revision": "abc123",
        "cpus": 2,
        "loadavg_start": [1.5, 1.0, 0.5],
        "loadavg_end": [1.0, 1.0, 0.5],
        "started": "2026-12-02T00:00:00+00:00",
    }
    return {"meta": meta, "rows": rows, "notes": []}


def _points(polyline: ET.Element) -> list[tuple[float, float]]:
    return [
        (float(x), float(y))
        for x, y in (pair.split(",") for pair in polyline.attrib["points"].split())
    ]


def test_one_rising_step_line_per_variant_that_kept_samples() -> None:
    docker = [48.0, 52.0, 50.0, 120.0, 49.0]
    mine = [4.1, 3.9, 4.0, 9.0, 4.2]
    result = _result(
        [
            _row("docker 20.10 (Engine API, raw)", docker),
            _row("isolated (raw)", mine),
            _row("isolated (client)", None),  # no samples kept: no line
            _row("create", [1.0], figure="create"),  # another figure: no line
        ]
    )
    text = cdf.svg(result)
    assert text is not None
    root = ET.fromstring(text)
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == 2
    for line, samples in zip(lines, (docker, mine), strict=True):
        points = _points(line)
        assert len(points) == 1 + 2 * len(samples)
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        assert xs == sorted(xs)  # latencies in order
        assert ys == sorted(ys, reverse=True)  # the share only grows (SVG's y points down)
        assert ys[0] > ys[-1]
    # Docker's line lies right of sandboxd's: slower at every share.
    assert min(p[0] for p in _points(lines[0])) > max(p[0] for p in _points(lines[1]))
    legend = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    assert "docker 20.10 (Engine API, raw): p50 50.00 ms, n 5" in legend
    assert "isolated (raw): p50 4.10 ms, n 5" in legend
    assert "load average 1.50 1.00 0.50 (start) / 1.00 1.00 0.50 (end)" in legend


def test_no_samples_no_plot(tmp_path: Path) -> None:
    result = _result([_row("isolated (raw)", None)])
    assert cdf.svg(result) is None
    assert cdf.write(result, tmp_path / "x.svg") is None
    assert not (tmp_path / "x.svg").exists()


@pytest.mark.parametrize("quick", [False, True])
def test_report_writes_the_plot_beside_the_json(tmp_path: Path, quick: bool) -> None:
    result = _result([_row("docker", [50.0, 60.0]), _row("isolated (raw)", [4.0])], quick)
    report.write(result, tmp_path)
    name = "latest-quick-exec-cdf.svg" if quick else "latest-exec-cdf.svg"
    assert ET.parse(tmp_path / name).getroot().tag == f"{SVG}svg"
    other = "latest-exec-cdf.svg" if quick else "latest-quick-exec-cdf.svg"
    assert not (tmp_path / other).exists()


def test_command_line_writes_the_file(tmp_path: Path) -> None:
    source = tmp_path / "run.json"
    source.write_text(json.dumps(_result([_row("isolated (raw)", [4.0, 5.0])])))
    out = tmp_path / "plot.svg"
    assert cdf.main([str(source), "-o", str(out)]) == 0
    assert out.read_text().startswith("<svg")
    source.write_text(json.dumps(_result([])))
    assert cdf.main([str(source), "-o", str(tmp_path / "none.svg")]) == 1
