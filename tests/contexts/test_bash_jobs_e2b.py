"""What a bash context leaves running, through the unmodified ``e2b-code-interpreter`` SDK
(docs/extensions.rst, "Contexts"): a real daemon with the E2B front, under no isolation and
under the real one (as root: the sandbox's own PID namespace, system call filter and uid).

What runs in the sandbox is looked at from the sandbox (its pids are its own), by a cell of
another context; every wait is for an event, bounded by a deadline in the cell.
"""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b_code_interpreter import Sandbox

from tests.e2b.conftest import point_sdk_at, running_front

FRONTS = {"isolation-none": ("--isolation=none",), "isolation-real": ("--network-allow=none",)}
CREATE = {"isolation-none": {}, "isolation-real": {"allow_internet_access": False}}

GONE = """
for _ in $(seq {looks}); do
  state=
  [ -r /proc/{pid}/stat ] && read -r _ _ state _ < /proc/{pid}/stat
  if [ -z "$state" ] || [ "$state" = Z ]; then echo gone; exit 0; fi
  sleep 0.05
done
echo running
"""
"""A bash cell that says whether ``pid`` has ended, looking ``looks`` times 50 ms apart (a
zombie not yet reaped has)."""


@pytest.fixture(params=sorted(FRONTS))
def box(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Sandbox]:
    with running_front(tmp_path, *FRONTS[request.param]) as front:
        point_sdk_at(monkeypatch, front)
        with Sandbox.create(timeout=120, **CREATE[request.param]) as created:
            yield created


def state_of(box: Sandbox, pid: str, looks: int = 200) -> str:
    """Whether ``pid`` ended (``gone``) or not (``running``) within ``looks``, asked in a
    context of its own (its bash exits: a new one replaces it)."""
    looker = box.create_code_context(language="bash")
    cell = GONE.format(pid=int(pid), looks=looks)
    return "".join(box.run_code(cell, context=looker).logs.stdout).split()[-1]


def test_background_jobs_end_with_their_shell_or_kernel(box: Sandbox) -> None:
    context = box.create_code_context(language="bash")
    started = time.monotonic()
    ended = box.run_code("echo before; sleep 601 & echo $!; exit", context=context, timeout=30)
    assert time.monotonic() - started < 20  # it waited for its timeout, then 5 s more
    assert ended.error is not None and ended.error.name == "ShellExited"
    before, sleeper = "".join(ended.logs.stdout).split()
    assert before == "before"
    assert int(sleeper) > 0
    assert state_of(box, sleeper) == "gone"

    sleeper = "".join(box.run_code("sleep 602 & echo $!", context=context).logs.stdout)
    assert state_of(box, sleeper, looks=1) == "running"
    box.restart_code_context(context)
    assert state_of(box, sleeper) == "gone"
    sleeper = "".join(box.run_code("sleep 603 & echo $!", context=context).logs.stdout)
    box.remove_code_context(context)
    assert state_of(box, sleeper) == "gone"
