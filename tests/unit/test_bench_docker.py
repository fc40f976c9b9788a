"""bench: Docker's rows (bench/sbench/versus.py, dockerd.py): their shape, and the skip line.

Shape only: no figure is asserted (the figures are ``bench/run``'s), and Docker itself is not
started here (a full run starts it; a quick run only when it is cached).
"""

import argparse
import os
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH)]

from bench import run as bench_run  # noqa: E402
from bench.sbench import dockerd, figures, report, versus  # noqa: E402


def test_exec_output_is_taken_from_the_multiplexed_stream() -> None:
    frames = b"".join(
        struct.pack(">BxxxI", stream, len(data)) + data
        for stream, data in ((1, b"out\n"), (2, b"err\n"), (1, b"more"))
    )
    assert dockerd.demultiplex(frames) == b"out\nerr\nmore"
    assert dockerd.demultiplex(b"") == b""


def _args(quick: bool, no_docker: bool = False) -> argparse.Namespace:
    return argparse.Namespace(quick=quick, no_docker=no_docker)


def test_missing_dockerd_skips_the_rows_with_one_line_and_a_quick_run_installs_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = dockerd
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(module, "dockerd_program", lambda: None)

    def no_install() -> str:
        raise AssertionError("a quick run must not install docker.io")

    monkeypatch.setattr(module, "install", no_install)
    notes: list[str] = []
    meta: dict[str, Any] = {}
    assert bench_run.start_docker(_args(quick=True), tmp_path, notes, meta) is None
    assert notes == [
        "Docker rows skipped: dockerd not installed"
        " (a quick run never installs docker.io: run bench/run)"
    ]
    assert "docker" not in meta
    assert "bench: Docker rows skipped: dockerd not installed" in capsys.readouterr().err


def test_a_quick_run_needs_the_cached_image(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = dockerd
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(module, "dockerd_program", lambda: "/usr/sbin/dockerd")
    monkeypatch.setattr(module, "IMAGE_READY", tmp_path / "absent")
    assert "not cached" in str(module.unavailable(setup=False))


@pytest.mark.parametrize(
    ("uid", "no_docker", "why"), [(1000, False, "not root"), (0, True, "--no-docker")]
)
def test_other_skip_reasons(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, uid: int, no_docker: bool, why: str
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: uid)
    notes: list[str] = []
    assert bench_run.start_docker(_args(False, no_docker), tmp_path, notes, {}) is None
    assert len(notes) == 1 and notes[0].startswith(f"Docker rows skipped: {why}")


def test_no_docker_no_rows(tmp_path: Path) -> None:
    bench = figures.Bench(None, figures.Sizes(quick=True), tmp_path)
    versus.section(bench)
    assert bench.rows == []


def _measured(docker_ms: float, isolated_ms: float) -> tuple[Any, Any, Any]:
    samples = {
        name: {op: [ms / 1000] * 3 for op in versus.OPS}
        for name, ms in (("docker", docker_ms), ("isolated", isolated_ms), ("none", isolated_ms))
    }
    memory = {
        name: {"pss_kib": kib, "mem_available_kib": kib * 2}
        for name, kib in (("docker", 6000.0), ("isolated", 4.0), ("none", 5.0))
    }
    rates = {"docker": [20.0, 22.0], "isolated": [300.0, 310.0], "none": [400.0, 380.0]}
    return samples, memory, rates


@pytest.mark.parametrize(("isolated_ms", "met"), [(1.5, True), (3.0, False)])
def test_every_row_has_dockers_figure_beside_it(
    tmp_path: Path, isolated_ms: float, met: bool
) -> None:
    bench = figures.Bench(None, figures.Sizes(quick=False), tmp_path)
    versus.add_rows(bench, "docker 20.10 (Engine API, raw)", *_measured(49.0, isolated_ms))
    figures_seen = {row["figure"] for row in bench.rows}
    assert figures_seen == {
        *versus.OPS,
        "memory per idle one",
        "host memory per idle one",
        "execs/s, 32 at once",
    }
    for figure in figures_seen:
        mine = [r for r in bench.rows if r["figure"] == figure and r["ref"] == "Docker"]
        docker = [r for r in bench.rows if r["figure"] == figure and r["ref"] is None]
        assert len(docker) == 1 and docker[0]["variant"].startswith("docker")
        assert sorted(r["variant"].split()[0].rstrip(":") for r in mine) == ["isolated", "none"]
        assert all(r["ref_value"] == docker[0]["value"] for r in mine)
    judged = {(r["figure"], r["variant"]): r["met"] for r in bench.rows if r["target"]}
    assert judged[("create", "isolated (raw)")] is met
    assert judged[("exec true", "isolated (raw)")] is met
    assert judged[("memory per idle one", "isolated: PSS of its process tree / 50")] is True
    result = {"meta": _meta(), "rows": bench.rows, "notes": []}
    text = report.table(result)
    assert "p99" in text.splitlines()[3].split()
    readme = report.rst(result)
    assert "docker 20.10 (Engine API, raw)" in readme
    assert "exec python3 -c pass" in readme


def _meta() -> dict[str, Any]:
    return {
        "quick": False,
        "revision": "abc",
        "cpus": 2,
        "loadavg_start": [1.0, 1.0, 1.0],
        "loadavg_end": [1.0, 1.0, 1.0],
        "seconds": 1.0,
        "started": "2026-12-01T00:00:00+00:00",
    }


def test_a_second_run_leaves_the_cached_daemon_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import fcntl
    import os

    monkeypatch.setattr(dockerd, "CACHE", tmp_path)
    monkeypatch.setattr(dockerd, "DATA_ROOT", tmp_path / "docker")
    monkeypatch.setattr(dockerd, "dockerd_program", lambda: "/usr/sbin/dockerd")
    held = os.open(tmp_path / "docker.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        daemon = dockerd.Dockerd(tmp_path / "run")
        with pytest.raises(RuntimeError, match="another bench run"):
            daemon.start()
        assert daemon.process is None
        daemon.stop()  # nothing of the other run's is unmounted or removed
        assert (tmp_path / "docker").is_dir()
    finally:
        os.close(held)
