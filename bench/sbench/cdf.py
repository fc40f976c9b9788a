"""A latency CDF of exec ``true``, sandboxd beside Docker, as a small standalone SVG.

    python bench/sbench/cdf.py [RESULT.json] [-o OUT.svg]

The samples are those a run keeps in its JSON (``samples_ms`` of the ``exec true`` rows the
``docker`` section writes, ``sbench.versus``): one step line per variant, the share of samples
at or below each latency, on a logarithmic time axis. No plotting library: the SVG is written
here, from the standard library alone. ``report.write`` calls :func:`write` for every run that
kept such samples.
"""

import argparse
import json
import math
import statistics
import sys
from html import escape
from pathlib import Path
from typing import Any

FIGURE = "exec true"
WIDTH, HEIGHT = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 64, 24, 48, 56
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def series(result: dict[str, Any], figure: str = FIGURE) -> dict[str, list[float]]:
    """Sorted samples (ms) of every row of ``figure`` that kept them, by variant."""
    found = {}
    for row in result["rows"]:
        if row["figure"] == figure and row.get("samples_ms"):
            found[row["variant"]] = sorted(float(x) for x in row["samples_ms"])
    return found


def decades(low: float, high: float) -> list[float]:
    """Tick values 1, 2, 5 x 10^k spanning ``low``..``high``."""
    ticks = []
    for exponent in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1):
        for mantissa in (1, 2, 5):
            value = mantissa * 10.0**exponent
            if low <= value <= high:
                ticks.append(value)
    return ticks


def label(value: float) -> str:
    return f"{value:g}"


def svg(result: dict[str, Any], figure: str = FIGURE) -> str | None:
    """The SVG text, or ``None`` when the run kept no samples of ``figure``."""
    lines = series(result, figure)
    if not lines:
        return None
    every = [x for samples in lines.values() for x in samples if x > 0]
    low = 10 ** math.floor(math.log10(min(every)))
    high = 10 ** math.ceil(math.log10(max(every)))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(ms: float) -> float:
        return LEFT + plot_w * (math.log10(max(ms, low)) - math.log10(low)) / math.log10(high / low)

    def y_of(share: float) -> float:
        return TOP + plot_h * (1 - share)

    meta = result.get("meta", {})

    def load(key: str) -> str:
        return " ".join(f"{x:.2f}" for x in meta.get(key) or []) or "?"

    title = f"{figure}: latency CDF{' (quick run)' if meta.get('quick') else ''}"
    subtitle = (
        f"{meta.get('started', '?')}, {meta.get('revision', '?')}, {meta.get('cpus', '?')} CPUs,"
        f" load average {load('loadavg_start')} (start) / {load('loadavg_end')} (end)"
    )
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}"'
        f' viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="18" text-anchor="middle">{escape(title)}</text>',
        f'<text x="{WIDTH / 2}" y="34" text-anchor="middle" font-size="10">'
        f"{escape(subtitle)}</text>",
    ]
    for tick in decades(low, high):
        x = x_of(tick)
        out.append(
            f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + plot_h}" stroke="#ddd"/>'
            f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{label(tick)}</text>'
        )
    for share in (0, 0.25, 0.5, 0.75, 0.9, 0.99, 1):
        y = y_of(share)
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{share:g}</text>'
        )
    out.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none"'
        f' stroke="#444"/>'
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 16}" text-anchor="middle">'
        "latency, ms (log scale)</text>"
        f'<text x="16" y="{TOP + plot_h / 2}" text-anchor="middle"'
        f' transform="rotate(-90 16 {TOP + plot_h / 2})">share of samples ≤ latency</text>'
    )
    for index, (variant, samples) in enumerate(lines.items()):
        colour = COLOURS[index % len(COLOURS)]
        points = [f"{x_of(samples[0]):.1f},{y_of(0):.1f}"]
        for rank, ms in enumerate(samples, 1):
            x = x_of(ms)
            points.append(f"{x:.1f},{y_of((rank - 1) / len(samples)):.1f}")
            points.append(f"{x:.1f},{y_of(rank / len(samples)):.1f}")
        out.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.6"'
            f' points="{" ".join(points)}"/>'
        )
        median = statistics.median(samples)
        y = TOP + plot_h - 12 - 16 * (len(lines) - 1 - index)  # bottom right: empty in a CDF
        end = LEFT + plot_w - 10
        out.append(
            f'<line x1="{end - 20}" y1="{y - 4}" x2="{end}" y2="{y - 4}"'
            f' stroke="{colour}" stroke-width="2"/>'
            f'<text x="{end - 26}" y="{y}" text-anchor="end">{escape(variant)}:'
            f" p50 {median:.2f} ms, n {len(samples)}</text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write(result: dict[str, Any], path: Path) -> Path | None:
    """Write the CDF to ``path``; ``None`` (nothing written) when there are no samples."""
    text = svg(result)
    if text is None:
        return None
    path.write_text(text)
    return path


def main(argv: list[str]) -> int:
    results = Path(__file__).resolve().parents[1] / "results"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", nargs="?", type=Path, default=results / "latest.json")
    parser.add_argument("-o", "--out", type=Path, default=results / "latest-exec-cdf.svg")
    args = parser.parse_args(argv)
    written = write(json.loads(args.result.read_text()), args.out)
    if written is None:
        print(f"{args.result}: no {FIGURE!r} row kept samples (a run with Docker's rows does)")
        return 1
    print(f"written: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
