"""The unmodified ``e2b-code-interpreter`` SDK (sync and async) against the E2B front
(docs/e2b.rst, "Code interpreter"): a real daemon, real ipykernels from the host's python3,
under no isolation and under the real one (as root)."""

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.e2b.conftest import E2BDaemon, point_sdk_at, running_front

CREATE = {"isolation-none": {}, "isolation-real": {"allow_internet_access": False}}
"""How each front's sandboxes are made: under the real isolation, in a network namespace of
their own with nothing but a loopback (the kernel's sockets must not need a network)."""


@pytest.fixture(scope="module")
def isolated_interpreter_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BDaemon]:
    """The real isolation, its sandboxes without network (no egress lock needed)."""
    tmp = tmp_path_factory.mktemp("e2b-interpreter")
    with running_front(tmp, "--network-allow=none") as front:
        yield front


@pytest.fixture(params=sorted(CREATE))
def front(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Each test runs against both daemons; its value is the create's arguments."""
    name = "unisolated_front" if request.param == "isolation-none" else "isolated_interpreter_front"
    point_sdk_at(monkeypatch, request.getfixturevalue(name))
    return {"timeout": 120, **CREATE[request.param]}


@pytest.fixture
def box(front: dict[str, Any]) -> Iterator[Sandbox]:
    with Sandbox.create(**front) as created:  # the default template: code-interpreter-v1
        yield created


def test_state_output_and_errors(box: Sandbox) -> None:
    box.run_code("x = 1")
    assert box.run_code("x + 1").text == "2"
    out: list[str] = []
    err: list[str] = []
    execution = box.run_code(
        "import sys; print('to out'); print('to err', file=sys.stderr)",
        on_stdout=lambda m: out.append(m.line),
        on_stderr=lambda m: err.append(m.line),
    )
    assert out == ["to out\n"] and err == ["to err\n"]
    assert execution.logs.stdout == ["to out\n"]
    failed = box.run_code("def f():\n    raise ValueError('bad')\nf()")
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("ValueError", "bad")
    assert "raise ValueError('bad')" in failed.error.traceback
    assert box.run_code("import os; os.environ['ONE']", envs={"ONE": "1"}).text == "'1'"


def test_chart_and_table(box: Sandbox) -> None:
    plotted = box.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    [chart] = [r for r in plotted.results if r.png]
    assert chart.png.startswith("iVBORw0KGgo")  # PNG's signature, base64
    table = box.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    assert "<table" in (table.results[0].html or "")


def test_contexts_and_faults(box: Sandbox) -> None:
    context = box.create_code_context()
    box.run_code("y = 5", context=context)
    assert box.run_code("y", context=context).text == "5"
    assert context.id in [c.id for c in box.list_code_contexts()]
    box.restart_code_context(context)
    assert box.run_code("'y' in dir()", context=context).text == "False"

    with pytest.raises(TimeoutException):  # the SDK closes the connection: an interrupt
        box.run_code("kept = 3\nwhile True: pass", context=context, timeout=2)
    assert box.run_code("kept", context=context).text == "3"  # interrupted, state kept

    died = box.run_code("import os; os._exit(1)", context=context)
    assert died.error is not None and died.error.name == "KernelDied"
    assert box.run_code("1 + 1", context=context).text == "2"  # a fresh kernel

    box.remove_code_context(context)
    with pytest.raises(NotFoundException):
        box.run_code("1", context=context)
    with pytest.raises(SandboxException):
        box.run_code("1", context=box.create_code_context(), language="python")


DEAF = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
"""A cell its interrupt does not stop."""


def test_a_cell_deaf_to_its_interrupt_and_a_killed_kernel(box: Sandbox) -> None:
    """The SDK's timeout interrupts; the cell ignores it, so 5 s later its kernel is killed
    and the next call, queued behind it, gets a fresh one. A kernel killed by a signal ends
    its cell with ``KernelDied``, and recovers too."""
    context = box.create_code_context()
    box.run_code("kept = 1", context=context)
    with pytest.raises(TimeoutException):
        box.run_code(DEAF, context=context, timeout=2)
    assert box.run_code("'kept' in dir()", context=context).text == "False"
    box.run_code("kept = 2", context=context)
    died = box.run_code("import os\nos.kill(os.getpid(), 9)", context=context)
    assert died.error is not None and died.error.name == "KernelDied"
    assert box.run_code("'kept' in dir()", context=context).text == "False"


def test_bash(box: Sandbox) -> None:
    box.run_code("x=1; cd /tmp", language="bash")  # the sandbox's bash context, made now
    shown = box.run_code("echo $x; pwd; echo e >&2", language="bash")
    assert "".join(shown.logs.stdout) == "1\n/tmp\n"
    assert "".join(shown.logs.stderr) == "e\n"
    failed = box.run_code("ls /nonexistent", language="bash")
    assert failed.error is not None and (failed.error.name, failed.error.value) == ("", "2")

    context = box.create_code_context(language="bash")
    assert context.language == "bash"
    box.run_code("kept=3", context=context)
    with pytest.raises(TimeoutException):  # the SDK closes the connection: an interrupt
        box.run_code("sleep 60", context=context, timeout=2)
    assert box.run_code("echo $kept", context=context).logs.stdout == ["3\n"]
    died = box.run_code("kill -KILL $PPID", context=context)  # its kernel
    assert died.error is not None and died.error.name == "KernelDied"
    assert box.run_code('echo "[$kept]"', context=context).logs.stdout == ["[]\n"]
    assert "".join(box.run_code("echo $x", language="bash").logs.stdout) == "1\n"


def test_async_sdk(front: dict[str, Any]) -> None:
    async def main() -> None:
        box = await AsyncSandbox.create(**front)
        try:
            await box.run_code("z = 20")
            assert (await box.run_code("z * 2")).text == "40"
        finally:
            await box.kill()

    asyncio.run(main())


def test_another_sandbox_cannot_use_the_kernel(front: dict[str, Any]) -> None:
    with Sandbox.create(**front) as first, Sandbox.create(**front) as second:
        context = first.create_code_context()
        with pytest.raises(NotFoundException):
            second.run_code("1", context=context)


CONNECT_TO = """
import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect({path!r})
    print("connected")
except OSError as e:
    print(type(e).__name__)
"""


def test_another_sandbox_cannot_reach_the_kernel_socket(
    monkeypatch: pytest.MonkeyPatch, isolated_interpreter_front: E2BDaemon
) -> None:
    """Under the real isolation, a kernel's unix sockets lie in its sandbox's ``tmp/``, under
    ``{root}/{rid}/`` (root's, mode 0710: only that sandbox's gid may pass): a connect from
    another sandbox's kernel is refused, even to a socket its owner made ``0777``."""
    point_sdk_at(monkeypatch, isolated_interpreter_front)
    front = {"timeout": 60, "allow_internet_access": False}
    with Sandbox.create(**front) as first, Sandbox.create(**front) as second:
        found = first.run_code("import sys; print(sys.argv[sys.argv.index('-f') + 1])")
        connection_file = "".join(found.logs.stdout).strip()
        shell_socket = connection_file.removesuffix(".json") + "-1"
        own = first.run_code(CONNECT_TO.format(path=shell_socket))
        assert own.logs.stdout == ["connected\n"]  # the path is right: its own sandbox may
        # Even were the sandbox careless with its own socket, its directory stops the other.
        first.run_code(f"import os; os.chmod({shell_socket!r}, 0o777)")
        other = second.run_code(CONNECT_TO.format(path=shell_socket))
        assert other.logs.stdout == ["PermissionError\n"]


def _call(
    front: E2BDaemon, method: str, path: str, raw: bytes, headers: dict[str, str]
) -> tuple[int, bytes]:
    request = urllib.request.Request(front.url + path, data=raw, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_bad_calls_to_the_interpreter(e2b_daemon: E2BDaemon) -> None:
    """What the SDK never sends, answered before any kernel is touched."""
    with Sandbox.create(timeout=60) as box:
        token = box.traffic_access_token
        assert token
        good = {"E2b-Sandbox-Id": box.sandbox_id, "E2b-Sandbox-Port": "49999"}
        keyed = {**good, "E2B-Traffic-Access-Token": token}
        cases = [
            ("/execute", b'{"code": "1"}', {**good, "X-Access-Token": "wrong"}, 401),
            ("/execute", b'{"code": "1"}', {**keyed, "E2b-Sandbox-Id": "f" * 16}, 502),
            ("/execute", b'{"code": "1"}', {**keyed, "E2b-Sandbox-Port": "49998"}, 401),
            ("/execute", b"{", keyed, 400),
            ("/execute", b"[]", keyed, 400),
            ("/execute", b'{"code": 1}', keyed, 400),
            ("/execute", b'{"code": "1", "env_vars": {"A": 1}}', keyed, 400),
            ("/execute", b'{"code": "1", "language": 3}', keyed, 400),
            ("/execute", b'{"code": "1", "context_id": "a", "language": "python"}', keyed, 400),
            ("/execute", b'{"code": "1", "language": "cobol"}', keyed, 400),
            ("/contexts", b'{"language": "cobol"}', keyed, 400),
        ]
        for path, raw, headers, status in cases:
            assert _call(e2b_daemon, "POST", path, raw, headers)[0] == status, (path, raw)
        # The interpreter's paths without its port are the control plane's (its key: none).
        assert _call(e2b_daemon, "GET", "/contexts", b"", {"X-API-Key": "e2b-test-token"})[0] == 404


def test_a_host_without_a_kernel_refuses_the_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_front(tmp_path, "--isolation=none", "--kernel-python=/nonexistent/python3") as e2b:
        point_sdk_at(monkeypatch, e2b)
        with pytest.raises(SandboxException, match="contexts are not available"):
            Sandbox.create(timeout=60)


def test_without_the_gate_the_interpreter_refuses_a_wrong_token(tmp_path: Path) -> None:
    """With ``SANDBOXD_AUTH_GATE=off`` the route's own check is the only one: another token
    is refused before any kernel is touched."""
    with running_front(tmp_path, "--isolation=none", "--auth-gate=off") as e2b:
        key = {"X-API-Key": "e2b-test-token", "Content-Type": "application/json"}
        status, raw = _call(e2b, "POST", "/sandboxes", b'{"templateID": "base"}', key)
        assert status == 201, raw
        sandbox = json.loads(raw)
        port = {"E2b-Sandbox-Id": sandbox["sandboxID"], "E2b-Sandbox-Port": "49999"}
        for wrong in ({"X-Access-Token": "wrong"}, {"E2B-Traffic-Access-Token": "wrong"}):
            assert _call(e2b, "POST", "/execute", b'{"code": "1"}', {**port, **wrong})[0] == 401
        own = {"E2B-Traffic-Access-Token": sandbox["trafficAccessToken"]}
        status, raw = _call(e2b, "GET", "/contexts", b"", {**port, **own})
        assert status == 200, raw
