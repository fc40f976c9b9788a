"""E2B's own SDK suite against the front (``bench/e2b_suite.py``), as a section of the run.

Where a mirror of e2b-dev/E2B is present (``--e2b-mirror``, or ``E2B_MIRROR``), a full run runs
the suite once per SDK release in :data:`RELEASES` (the older ``POST /sandboxes`` create and the
current ``/v2``), isolated as root (else ``--isolation=none``), and records one row per release:
the tests passed, with the failed and skipped beside them and one note each. A quick run, or a
run without a mirror, notes why it has no such row. What still fails, and why, is listed in
docs/e2b.rst (*E2B's own test suite*).
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent
RELEASES = ("2.45.1", "2.63.0")
"""The ``e2b`` releases the suite runs with: the first whose create is ``POST /sandboxes``."""
SECONDS = 3600
"""How long one release's run may take (a few minutes on an idle 2-core machine)."""
FIGURE = "E2B's own SDK suite"


def skipped(quick: bool, mirror: str | None) -> str | None:
    """Why the section has no row (``None``: it runs)."""
    if quick:
        return "E2B suite rows skipped (a quick run: bench/run runs it)"
    if not mirror:
        return (
            "E2B suite rows skipped: no mirror of e2b-dev/E2B (--e2b-mirror or E2B_MIRROR: "
            "its git directory)"
        )
    if not os.path.isdir(mirror):
        return f"E2B suite rows skipped: {mirror} is no directory"
    return None


def command(mirror: str, release: str, isolated: bool) -> list[str]:
    """``bench/e2b_suite.py`` for one release (its suite: the release's tag in the mirror)."""
    line = [sys.executable, str(BENCH / "e2b_suite.py"), "--mirror", mirror, "--e2b", release]
    return line + (["--isolated"] if isolated else [])


def outcome(output: str) -> dict[str, Any] | None:
    """The counts the script printed last (one JSON line), or ``None`` without them."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                return None
            return found if isinstance(found, dict) and "passed" in found else None
    return None


def add_row(bench: Any, counts: dict[str, Any], isolated: bool) -> None:
    """One release's row: tests passed (the failed and skipped beside them) and its note."""
    isolation = "isolated" if isolated else "isolation none"
    total = counts["passed"] + counts["failed"] + counts["skipped"]
    bench.row(
        FIGURE,
        f"e2b {counts['e2b']} ({isolation}; suite at {counts['suite']})",
        float(counts["passed"]),
        "passed",
        extra={"failed": counts["failed"], "skipped": counts["skipped"], "tests": total},
    )
    bench.notes.append(
        f"E2B suite, e2b {counts['e2b']}: {counts['passed']} passed, {counts['failed']} failed,"
        f" {counts['skipped']} skipped of {total} (report: {counts['report']})"
    )


def section(bench: Any, mirror: str | None, isolated: bool) -> None:
    """The suite's rows (``bench``: a ``figures.Bench``), or one note saying why there are none.
    A release whose run gave no counts fails the section."""
    why = skipped(bool(bench.sizes.quick), mirror)
    if why is not None:
        bench.notes.append(why)
        return
    assert mirror is not None
    failed = []
    for release in RELEASES:
        run = subprocess.run(
            command(mirror, release, isolated),
            capture_output=True,
            text=True,
            timeout=SECONDS,
            check=False,
        )
        counts = outcome(run.stdout)
        if counts is None:
            failed.append(f"e2b {release}: {(run.stderr or run.stdout).strip()[-300:]}")
            continue
        add_row(bench, counts, isolated)
    if failed:
        raise RuntimeError("the E2B suite gave no counts: " + "; ".join(failed))
