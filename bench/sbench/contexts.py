"""Contexts (issue 31) as a section of the run: ``bench/code_interpreter.py`` once per daemon
kind (isolated as root, and ``--isolation=none``), each on a daemon of its own with the E2B
front, its figures recorded as rows.

Rows, each a p50 in ms with its p90 beside it: ``run_code("1")`` warm (the context's kernel
running) through the native API and through the unmodified ``e2b-code-interpreter`` SDK (the
target: 5 ms native), cold (a new context and its first execution: the kernel started), a bash
context's ``true`` warm and cold, and the HTTP floor (a ``GET`` of the sandbox's contexts on
the same connection). Every row carries the load average before and after its run.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent
FIGURE = 'run_code("1") round trip'
SECONDS = 1800
ROWS = {
    "native_warm": "native, warm",
    "sdk_warm": "E2B SDK, warm",
    "native_cold": "native, cold (new context + first run)",
    "sdk_cold": "E2B SDK, cold (new context + first run)",
    "native_bash_warm": "bash context true, native, warm",
    "native_bash_cold": "bash context true, native, cold",
    "http_floor": "HTTP floor (GET contexts)",
}
WARM_TARGET_MS = 5.0


def measure(isolated: bool, runs: int, cold_runs: int) -> dict[str, Any]:
    """``bench/code_interpreter.py``'s figures, in a process of its own (it sets the SDK's
    environment and starts its own daemon)."""
    argv = [sys.executable, str(BENCH / "code_interpreter.py"), f"--runs={runs}"]
    argv += [f"--cold-runs={cold_runs}", *(["--isolated"] if isolated else [])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=SECONDS, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"code_interpreter.py: {(done.stderr or done.stdout)[-500:]}")
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


def section(bench: Any) -> None:
    """The rows of every daemon kind the run has (``bench``: a ``figures.Bench``)."""
    from .figures import at_most

    runs, cold_runs = (10, 1) if bench.sizes.quick else (200, 5)
    for label in bench.daemons:
        figures = measure(label == "isolated", runs, cold_runs)
        for key, variant in ROWS.items():
            target = at_most(WARM_TARGET_MS, " ms") if key == "native_warm" else None
            bench.row(
                FIGURE,
                f"{label}: {variant}",
                figures[key]["p50_ms"],
                "ms",
                target=target,
                extra={"p90_ms": figures[key]["p90_ms"], "loadavg": figures["loadavg"]},
            )
