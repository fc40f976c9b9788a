"""Bash contexts over a real port (docs/extensions.rst, "Contexts"): a real daemon, the bash
kernel on the host's python3 and bash, real cells; and what ends a cell that will not stop.

Every wait is for an event (a frame, the end), bounded by the client's socket timeout only.
"""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process.test_contexts import main_text, run
from tests.support.daemon import Daemon, start_daemon, stop_daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = start_daemon(tmp_path, "--isolation=none", "--keepalive=1s")
    try:
        yield running
    finally:
        stop_daemon(running)


def texts(frames: list[dict[str, object]], stream: str) -> str:
    """What the frames wrote on ``stream`` (in as many frames as the pipes gave)."""
    return "".join(str(f["text"]) for f in frames if f["type"] == stream)


def errors(frames: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [(f["name"], f["value"]) for f in frames if f["type"] == "error"]


def test_state_streams_status_env_and_interrupt(daemon: Daemon) -> None:
    rid = daemon.create()
    context = daemon.json("POST", f"/sandboxes/{rid}/contexts", {"language": "bash"})
    cid = context["id"]
    assert context["language"] == "bash"
    assert run(daemon, rid, cid, "x=1; cd ..")[0] == {"type": "count", "execution_count": 1}
    frames = run(daemon, rid, cid, "echo $x; pwd; echo oops >&2")
    assert texts(frames, "stdout") == "1\n" + str(Path(context["cwd"]).parent) + "\n"
    assert texts(frames, "stderr") == "oops\n"
    assert errors(run(daemon, rid, cid, "false")) == [("", "1")]  # as E2B's bash says it
    frames = run(daemon, rid, cid, 'echo "$ONLY_NOW"', env={"ONLY_NOW": "yes"})
    assert texts(frames, "stdout") == "yes\n"
    assert texts(run(daemon, rid, cid, 'echo "[$ONLY_NOW]"'), "stdout") == "[]\n"
    frames = run(daemon, rid, cid, "echo x", env={"NOT A NAME": "1"})
    assert errors(frames) == [("ValueError", "env: 'NOT A NAME' cannot be a bash variable's name")]

    frames = run(daemon, rid, cid, "sleep 60; echo never", timeout=1)
    assert errors(frames) == [("KeyboardInterrupt", "")]
    assert texts(run(daemon, rid, cid, "echo $x"), "stdout") == "1\n"  # the state kept

    [(name, _)] = errors(run(daemon, rid, cid, "kill -KILL $PPID"))  # the kernel, killed
    assert name == "KernelDied"
    assert texts(run(daemon, rid, cid, 'echo "[$x]"'), "stdout") == "[]\n"  # a fresh one


def test_unknown_languages_name_those_of_the_host(daemon: Daemon) -> None:
    rid = daemon.create()
    status, data = daemon.call("POST", f"/sandboxes/{rid}/contexts", {"language": "cobol"})
    assert status == 400, data
    assert json.loads(data)["detail"] == (
        "language: 'cobol' has no kernel here (languages: python, bash)"
    )


BASHLESS_KERNEL = """#!/bin/sh
# python3 asked for its modules: it answers that it has no bash
if [ "$1" = -c ] && [ "$#" -gt 2 ]; then echo '{"ipykernel": true, "bash": false}'; exit 0; fi
exec /usr/bin/python3 "$@"
"""


def test_a_host_without_bash_names_what_is_missing(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text(BASHLESS_KERNEL)
    python.chmod(0o755)
    running = start_daemon(tmp_path, "--isolation=none", f"--kernel-python={python}")
    try:
        rid = running.create()
        status, data = running.call("POST", f"/sandboxes/{rid}/contexts", {"language": "bash"})
        assert status == 400, data
        assert json.loads(data)["detail"] == (
            "language: 'bash' has no kernel here (languages: python):"
            f" {python} has no bash: install ipykernel (Debian: python3-ipykernel) and bash"
        )
    finally:
        stop_daemon(running)


def test_a_cell_deaf_to_its_interrupt_has_its_kernel_killed(daemon: Daemon) -> None:
    """The timeout's interrupt does not take (the cell ignores ``SIGINT``): 5 s later the
    kernel is killed, the execution ends with ``KernelDied``, the next starts a fresh one."""
    rid = daemon.create()
    cid = daemon.json("POST", f"/sandboxes/{rid}/contexts", {})["id"]
    run(daemon, rid, cid, "kept = 1")
    deaf = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
    [(name, value)] = errors(run(daemon, rid, cid, deaf, timeout=1))
    assert name == "KernelDied"
    assert str(value).startswith("the cell did not stop within 5s of its interrupt")
    assert main_text(run(daemon, rid, cid, "'kept' in dir()")) == "False"

    [(name, _)] = errors(run(daemon, rid, cid, "import os, signal; os.kill(os.getpid(), 9)"))
    assert name == "KernelDied"
    assert main_text(run(daemon, rid, cid, "6 * 7")) == "42"
