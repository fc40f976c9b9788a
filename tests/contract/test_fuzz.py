"""Schemathesis against a live daemon: no 5xx, nothing outside ``docs/openapi.yaml``.

One real ``twistd -n sandboxd`` (``--isolation=none``, a tmp root, a token) is fuzzed by the
schemathesis CLI from the document: its boundary-value ("coverage") phase, then random
valid and invalid requests ("fuzzing"), a bounded number per operation. The checks: no 5xx,
every status code and media type documented, every body valid against its schema. Then the
daemon must still be healthy: serving, its sandboxes usable, nothing logged as an unexpected
error, no exec left counted as running.

``SANDBOXD_FUZZ_EXAMPLES`` (default 25) sets the examples per operation; the whole run takes
about two minutes at the default. The figures (inputs tried, failures, 5xx seen) are printed.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.security.live_daemon import (
    OPENAPI,
    PENDING,
    call,
    create,
    daemon_env,
    exec_frames,
    new_token,
    start_daemon,
    stop_daemon,
    write_token,
)

HERE = Path(__file__).resolve().parent
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
    ]
)
EXAMPLES = int(os.environ.get("SANDBOXD_FUZZ_EXAMPLES", "25"))
BOUND = 900
"""Seconds the schemathesis run may take at most (it normally takes about two minutes)."""


def server_errors(log: Path) -> list[str]:
    """Access-log lines of 5xx answers, and failures the daemon logged (an unexpected error
    answering a request, an exec failing in band after its 200, ...)."""
    lines = log.read_text(errors="replace").splitlines()
    return [line for line in lines if 'HTTP/1.1" 5' in line or "#critical]" in line]


def in_flight(daemon: Any, token: str) -> float:
    for line in call(daemon, "GET", "/metrics", token=token).body.decode().splitlines():
        if line.startswith("sandboxd_execs_in_flight "):
            return float(line.split()[1])
    raise AssertionError("no sandboxd_execs_in_flight in /metrics")


@pytest.mark.slow
def test_schemathesis_finds_no_5xx_and_no_schema_violation(tmp_path: Path) -> None:
    try:
        import schemathesis  # noqa: F401
    except ImportError:
        pytest.fail("schemathesis is not installed: it belongs in setup.py's test extra")
    token = new_token()
    token_file = write_token(tmp_path / "token", token)
    daemon = start_daemon(
        tmp_path,
        "--isolation=none",
        f"--token-file={token_file}",
        f"--tools-dir={tmp_path / 'tools'}",
        "--exec-timeout=5s",
        "--log-timeout=5s",
        "--keepalive=1s",
        "--max-output=64K",
        "--max-body=4M",
    )
    try:
        live = [create(daemon, token) for _ in range(3)]
        for rid in live:
            call(daemon, "PUT", f"/sandboxes/{rid}/file?path=a/b.txt", raw=b"b", token=token)
        report = tmp_path / "report"
        env = daemon_env()
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])
        env["SCHEMATHESIS_HOOKS"] = "fuzz_hooks"
        env["SANDBOXD_FUZZ_RIDS"] = ",".join(live)
        processes = []
        for rid in live:
            begun = call(
                daemon,
                "POST",
                f"/sandboxes/{rid}/processes",
                {"cmd": ["sleep", "600"]},
                token=token,
            )
            processes.append(f"{rid}:{begun.json()['id']}")
        env["SANDBOXD_FUZZ_PROCESSES"] = ",".join(processes)
        argv = [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            str(OPENAPI),
            "--url",
            daemon.url,
            "--header",
            f"Authorization: Bearer {token}",
            "--checks",
            CHECKS,
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            str(EXAMPLES),
            "--exclude-path",
            "/drain",  # it would stop the daemon under test: checked by the contract tests
            "--exclude-path",
            "/sandboxes/{rid}/watch",  # a stream without end: tests/process drives it
            "--workers",
            "1",
            "--request-timeout",
            "60",
            "--generation-database",
            "none",
            "--report",
            "json",
            "--report-dir",
            str(report),
            "--no-color",
        ]
        for _, path in PENDING:
            argv += ["--exclude-path", path]
        started = time.monotonic()
        result = subprocess.run(
            argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=BOUND
        )
        took = time.monotonic() - started
        output = result.stdout + result.stderr
        # A schemathesis that did not finish (killed: returncode < 0) leaves no report, or an
        # empty one: say so with its own words, not with a JSON error.
        summaries = [p for p in report.glob("*.json") if p.stat().st_size]
        assert len(summaries) == 1, (result.returncode, output[-20000:])
        figures = json.loads(summaries[0].read_text())
        cases = figures["test_cases"]
        errors = server_errors(daemon.log)
        print(
            f"\nschemathesis: {cases['generated']} inputs in {took:.0f} s, "
            f"{cases['with_failures']} failing, {len(figures['errors'])} errors, "
            f"{len(errors)} 5xx; seed {figures['seed']}"
        )
        assert result.returncode == 0, output[-20000:]
        assert cases["generated"] >= EXAMPLES * 10, figures["test_cases"]
        assert errors == [], errors[:20]

        # Still healthy afterwards.
        assert daemon.process.poll() is None
        health = call(daemon, "GET", "/healthz")
        assert health.status == 200 and health.json()["status"] == "ok", health
        assert call(daemon, "GET", "/readyz").status == 200
        for rid in live:
            status, frames = exec_frames(daemon, rid, {"cmd": ["echo", "ok"]}, token)
            assert status == 200 and frames[-1]["exit"] == 0, frames[-1]
        assert in_flight(daemon, token) == 0
        rid = create(daemon, token)
        assert call(daemon, "DELETE", f"/sandboxes/{rid}", token=token).status == 204
    finally:
        stop_daemon(daemon)
