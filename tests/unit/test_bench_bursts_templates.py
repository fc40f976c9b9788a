"""bench: the bursts and templates rows (bench/sbench/bursts.py, templates.py): the sections
are registered, their sizes parse, and a first exec that did not echo is an error, not a
figure.

Shape only: no figure is asserted (``bench/run.py --quick`` runs the section against a real
daemon with every layer in CI; the figures are a full run's, docs/performance.rst).
"""

import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH)]

from bench import run as bench_run  # noqa: E402
from bench.sbench import bursts, figures  # noqa: E402


class Answers:
    """A connection answering the create, then the exec with ``last``."""

    def __init__(self, last: dict[str, Any]) -> None:
        self.last = last
        self.asked: list[tuple[str, str]] = []

    def json(self, method: str, path: str, payload: Any = None) -> Any:
        self.asked.append((method, path))
        return {"remote_id": "r1"}

    def request(self, method: str, path: str, body: bytes, headers: Any) -> tuple[int, bytes]:
        self.asked.append((method, path))
        frames = [{"o": base64.b64encode(b"first\n").decode()}, self.last]
        return 200, b"\n".join(json.dumps(f).encode() for f in frames) + b"\n"


def test_the_section_is_one_of_the_bench() -> None:
    assert "bursts" in bench_run.SECTIONS
    assert bench_run.parse(["--only", "bursts"]).only == ["bursts"]
    assert callable(figures.Bench.bursts)
    assert figures.Sizes(quick=False).bursts == "100,1000"


def test_a_first_exec_that_echoed_is_timed() -> None:
    out = base64.b64encode(b"first\n").decode()
    raw = Answers({"exit": 0, "out": out, "err": ""})
    rid, seconds = bursts.create_and_first_output(raw, "egress")  # type: ignore[arg-type]
    assert rid == "r1" and seconds >= 0
    assert raw.asked == [("POST", "/sandboxes"), ("POST", "/sandboxes/r1/exec")]


@pytest.mark.parametrize(
    "last", [{"exit": 1, "out": "", "err": ""}, {"error": "SpawnFailed", "detail": "no"}]
)
def test_a_first_exec_that_failed_is_an_error(last: dict[str, Any]) -> None:
    with pytest.raises(RuntimeError, match="the first exec in r1"):
        bursts.create_and_first_output(Answers(last), "egress")  # type: ignore[arg-type]


def test_the_templates_section_is_one_of_the_bench() -> None:
    from bench.sbench import templates

    assert "templates" in bench_run.SECTIONS
    assert callable(figures.Bench.templates)
    sizes = figures.Sizes(quick=False)
    assert sizes.template_fork_bytes == 1024 * 2**20  # issue 30: fork of a 1 GiB workspace
    assert templates.NAME.count(":") == 1  # a tagged name, as images are
