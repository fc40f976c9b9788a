"""The table printed at the end of a run, and the JSON written beside it."""

import datetime
import json
import math
from pathlib import Path
from typing import Any

from . import cdf

FORMATS = {
    "ms": "{:.2f} ms",
    "s": "{:.3f} s",
    "MB/s": "{:.0f} MB/s",
    "/s": "{:.0f}/s",
    "passed": "{:.0f} passed",
}


def fmt(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return FORMATS.get(unit, "{:.1f} " + unit).format(value)


QUICK_NOTE = (
    "quick run: tiny sizes, so these values are not measurements and no target is judged;"
    " it shows that every row ran (figures: a full run, bench/run)"
)


def table(result: dict[str, Any]) -> str:
    """A plain-text table: figure, variant, p50 (or rate), reference, ratio, target, met.

    A quick run has no ratio, target or met column: its tiny sizes prove that each row runs,
    not how fast it is, so it judges nothing and says so. A ``p99`` column follows the value
    when some row has one (``p99_ms``).
    """
    meta = result["meta"]
    quick = bool(meta["quick"])
    tails = any("p99_ms" in row for row in result["rows"])
    head: tuple[str, ...] = ("figure", "variant", "value", *(("p99",) if tails else ()))
    head = (*head, "reference", *(() if quick else ("ratio", "target", "met")))
    lines = []
    for row in result["rows"]:
        ref = "" if row["ref"] is None else f"{row['ref']} = {fmt(row['ref_value'], row['unit'])}"
        value = fmt(row["value"], row["unit"])
        cells: tuple[str, ...] = (row["figure"], row["variant"], value)
        if tails:
            cells = (*cells, fmt(row["p99_ms"], "ms") if "p99_ms" in row else "")
        cells = (*cells, ref)
        if not quick:
            ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x"
            met = {None: "", True: "yes", False: "NO"}[row["met"]]
            cells = (*cells, ratio, row["target"] or "", met)
        lines.append(cells)
    widths = [max(len(str(r[i])) for r in [head, *lines]) for i in range(len(head))]
    out = [
        f"sandboxd bench ({'quick' if meta['quick'] else 'full'}), {meta['revision']},"
        f" {meta['cpus']} CPUs, load average {fmt_load(meta['loadavg_start'])} at start,"
        f" {fmt_load(meta.get('loadavg_end'))} at end, {meta.get('seconds', '?')} s",
        QUICK_NOTE
        if quick
        else "ratio: value/reference for times, reference/value for rates (> 1: slower than it)",
        "",
        "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    for r in lines:
        out.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    if not quick:  # a quick run judges nothing
        out += [f"not met: {line}" for line in unmet(result)]
    for note in result["notes"]:
        out.append(f"note: {note}")
    return "\n".join(out)


def unmet(result: dict[str, Any]) -> list[str]:
    """A line for each row that missed its target and says what limits it (``limited_by``)."""
    return [
        f"{row['figure']} ({row['variant']}): {row['limited_by']}"
        for row in result["rows"]
        if row["met"] is False and row.get("limited_by")
    ]


def fmt_load(load: list[float] | None) -> str:
    return "?" if not load else " ".join(f"{x:.2f}" for x in load)


def write(result: dict[str, Any], directory: Path) -> Path:
    """``<directory>/<UTC time>.json`` and copies as ``latest.json`` and ``latest.rst``, and
    the CDF of exec ``true`` (``latest-exec-cdf.svg``, :mod:`sbench.cdf`) when the run kept its
    samples (the ``docker`` section).

    A quick run writes ``<UTC time>-quick.json``, ``latest-quick.json`` and
    ``latest-quick-exec-cdf.svg`` only, and a run of some sections (``--only``) writes
    ``<UTC time>-partial.json`` only: the latest figures (what README.rst shows) stay those of
    the last full run.
    """
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    text = json.dumps(result, indent=1, default=str)
    quick, partial = result["meta"]["quick"], bool(result["meta"].get("sections"))
    path = directory / f"{stamp}{'-quick' if quick else '-partial' if partial else ''}.json"
    path.write_text(text)
    if quick:
        (directory / "latest-quick.json").write_text(text)
        cdf.write(result, directory / "latest-quick-exec-cdf.svg")
    elif not partial:
        (directory / "latest.json").write_text(text)
        (directory / "latest.rst").write_text(rst(result) + "\n")
        cdf.write(result, directory / "latest-exec-cdf.svg")
    return path


def rst(result: dict[str, Any]) -> str:
    """The rows with a target or measured against Docker, as an RST table for README.rst, then
    what limits each target not met (:func:`unmet`)."""
    meta = result["meta"]
    head = ("figure", "sandboxd", "p50 / rate", "reference", "ratio", "target", "met")
    lines = []
    for row in result["rows"]:
        if (
            row["target"] is None
            and row["ref"] != "Docker"
            and not row["variant"].startswith("docker")
        ):
            continue
        ref = "" if row["ref"] is None else f"{row['ref']} {fmt(row['ref_value'], row['unit'])}"
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        met = {None: "", True: "yes", False: "no"}[row["met"]]
        value = fmt(row["value"], row["unit"])
        target = "" if row["target"] is None else row["target"]
        lines.append((row["figure"], row["variant"], value, ref, ratio, target, met))
    widths = [max(len(str(r[i])) for r in [head, *lines]) for i in range(len(head))]
    rule = "  ".join("=" * w for w in widths)
    out = [
        f"Last run: {meta['started']}, {meta['revision']}, {meta['cpus']} CPUs, load average"
        f" {fmt_load(meta['loadavg_start'])} (start) / {fmt_load(meta.get('loadavg_end'))} (end).",
        "",
        rule,
        "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)),
        rule,
    ]
    for r in lines:
        out.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    out.append(rule)
    why = unmet(result)
    if why:
        out += ["", "What limits each target not met, from its profile:", ""]
        out += [f"- {line}" for line in why]
    return "\n".join(out)
