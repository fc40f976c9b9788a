"""Templates built from a Dockerfile, for real (docs/extensions.rst, "Building a template"): a
real daemon as root with real isolation (nothing here depends on the cgroup version), each
``RUN`` as root in a user namespace with the build's files as its root, then a sandbox of the
built template running what the build put there.

``FROM debian:<suite>`` downloads Debian (``mmdebstrap``): that test runs only with
``SANDBOXD_SLOW_TESTS=1`` (its tarball cached in ``/var/cache/sandboxd-test``)."""

import contextlib
import http.client
import io
import json
import os
import signal
import socket
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from tests.kernel.kernel_http import Box, KernelDaemon, isolation_problem
from tests.support.daemon import Daemon, start_daemon, stop_daemon
from tests.templates.rootfs import rootfs

pytestmark = [pytest.mark.kernel]

DEBIAN_CACHE = "/var/cache/sandboxd-test"
HOST_MARKER = Path("/etc/sandboxd-build-test-marker")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


@pytest.fixture(scope="module")
def kd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelDaemon]:
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    daemon = KernelDaemon.start(
        tmp_path_factory.mktemp("templates-build"),
        "--memory-max=256M",
        "--template-max=1G",
        env={"SANDBOXD_DEBIAN_CACHE": DEBIAN_CACHE},
    )
    try:
        capabilities = daemon.call("GET", "/healthz").json()["capabilities"]
        assert "templates.build" in capabilities
        answer = daemon.client.request("PUT", "/templates/busybox", rootfs())
        assert answer.status == 201, answer
        yield daemon
    finally:
        daemon.stop()


def context(files: dict[str, bytes]) -> bytes:
    """A context tar holding ``files`` (``name: content``, mode 0644; ``/`` makes dirs)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def build(kd: KernelDaemon, name: str, files: dict[str, bytes], query: str = "") -> Any:
    """The build's status and NDJSON frames."""
    answer = kd.client.request(
        "POST", f"/templates/{name}/build{query}", context(files), timeout=1800
    )
    if answer.status != 200:
        return answer.status, answer.json()
    return 200, [json.loads(line) for line in answer.body.splitlines() if line.strip()]


def leftovers(kd: KernelDaemon) -> list[str]:
    return sorted(p.name for p in (kd.root / ".templates").iterdir() if p.name != ".cache")


def create(kd: KernelDaemon, template: str) -> Box:
    answer = kd.call("POST", "/sandboxes", {"template": template})
    assert answer.status == 200, answer
    box = Box(kd, answer.json()["remote_id"])
    kd.rids.append(box.rid)
    return box


DOCKERFILE = b"""\
# a comment
FROM busybox
ENV GREETING=hello \\
    WHO="the builder"
WORKDIR /app
COPY greet.sh data/ ./
RUN echo "$GREETING from uid $(id -u)" > made-by-run && mkdir -p /opt/x \\
    && echo "uid $(id -u)" > /opt/x/uid && ls /proc/1/ >/dev/null && echo step-output
"""


def test_a_build_from_a_template_runs_in_a_sandbox_of_the_result(kd: KernelDaemon) -> None:
    files = {
        "Dockerfile": DOCKERFILE,
        "greet.sh": b'#!/bin/sh\necho "$GREETING, $WHO, in $(pwd)"\n',
        "data/one.txt": b"one\n",
    }
    status, frames = build(kd, "built", files)
    assert status == 200, frames
    starts = [f for f in frames if "instruction" in f and "end" not in f]
    assert [f["instruction"].split()[0] for f in starts] == [
        *("FROM", "ENV", "WORKDIR", "COPY", "RUN")
    ]
    assert [f["line"] for f in starts] == [2, 3, 5, 6, 7]
    outputs = [f["output"] for f in frames if "output" in f]
    assert "step-output" in outputs
    end = frames[-1]
    assert end["end"] == "built", end
    template = end["template"]
    assert template["digest"].startswith("sha256:") and template["workdir"] == "/app"
    assert template["env"]["GREETING"] == "hello" and template["env"]["WHO"] == "the builder"
    assert kd.call("GET", "/templates/built").json() == template
    assert leftovers(kd) == ["built", "busybox"]

    box = create(kd, "built")
    try:
        assert box.ok("./greet.sh") == "hello, the builder, in /app"
        assert box.ok("cat made-by-run /opt/x/uid one.txt") == "hello from uid 0\nuid 0\none"
        assert box.ok("whoami") == "user"
        assert box.ok("stat -c %u /opt/x/uid") == "0"  # the build's root is the host's root
        listing = kd.call("GET", "/sandboxes").json()["sandboxes"]
        assert {e["remote_id"]: e["template"] for e in listing}[box.rid] == "built"
    finally:
        box.kill()


def test_a_run_sees_nothing_of_the_hosts_root(kd: KernelDaemon) -> None:
    HOST_MARKER.write_text("host only\n")
    try:
        dockerfile = f"FROM busybox\nRUN cat {HOST_MARKER} 2>/dev/null || echo host-unseen\n"
        status, frames = build(kd, "unseen", {"Dockerfile": dockerfile.encode()})
    finally:
        HOST_MARKER.unlink()
    assert status == 200 and frames[-1]["end"] == "built", frames
    assert [f["output"] for f in frames if "output" in f] == ["host-unseen"]


SWAPPINESS = Path("/proc/sys/vm/swappiness")


def test_a_run_cannot_change_the_hosts_sysctls(kd: KernelDaemon) -> None:
    """The RUN's uid 0 is the host's, which ``/proc/sys`` checks instead of a capability: it
    writes the value the host has (so that a failure of the protection changes nothing)."""
    value = SWAPPINESS.read_text().strip()
    script = (
        "ln -s busybox /bin/umount;"
        f" echo {value} > {SWAPPINESS} && echo wrote || echo refused;"
        " umount /proc/sys 2>/dev/null && echo unmounted || echo kept"
    )
    status, frames = build(kd, "sysctl", {"Dockerfile": f"FROM busybox\nRUN {script}\n".encode()})
    assert status == 200 and frames[-1]["end"] == "built", frames
    outputs = [f["output"] for f in frames if "output" in f]
    assert [line for line in outputs if "Read-only" not in line] == ["refused", "kept"]
    assert SWAPPINESS.read_text().strip() == value


def test_a_failing_run_reports_its_step_and_leaves_nothing(kd: KernelDaemon) -> None:
    dockerfile = b"FROM busybox\nRUN touch /made\nRUN echo before-failing; exit 3\nRUN true\n"
    status, frames = build(kd, "failing", {"Dockerfile": dockerfile})
    assert status == 200
    end = frames[-1]
    assert end["end"] == "failed"
    assert (end["step"], end["line"], end["exit_code"]) == (3, 3, 3)
    assert end["instruction"] == "RUN echo before-failing; exit 3"
    assert end["output"] == ["before-failing"]
    assert "exited with 3" in end["error"]
    assert kd.call("GET", "/templates/failing").status == 404
    assert "failing" not in leftovers(kd) and not any(n.startswith(".") for n in leftovers(kd))


def test_an_unsupported_instruction_is_refused_by_name(kd: KernelDaemon) -> None:
    dockerfile = b"FROM busybox\nRUN true\nEXPOSE 80\n"
    status, body = build(kd, "refused", {"Dockerfile": dockerfile})
    assert status == 400
    assert body["detail"] == (
        "Dockerfile line 3: instruction EXPOSE is not supported"
        " (only FROM, RUN, COPY, ENV, WORKDIR)"
    )
    assert kd.call("GET", "/templates/refused").status == 404


def test_a_copy_through_dotdot_is_refused_and_writes_nothing_outside(kd: KernelDaemon) -> None:
    dockerfile = b"FROM busybox\nCOPY evil /\n"
    files = {"Dockerfile": dockerfile, "evil/../../../../escaped": b"x"}
    status, frames = build(kd, "dotdot", files)
    assert status == 200
    assert frames[-1]["end"] == "failed" and "'..'" in frames[-1]["error"]
    assert not (kd.root / "escaped").exists() and not Path("/escaped").exists()


@pytest.mark.skipif(
    os.environ.get("SANDBOXD_SLOW_TESTS") != "1", reason="downloads Debian: SANDBOXD_SLOW_TESTS=1"
)
def test_a_build_from_debian_installs_a_package(kd: KernelDaemon) -> None:
    dockerfile = (
        b"FROM debian:bookworm\n"
        b"RUN apt-get update && apt-get install -y --no-install-recommends hello python3-pip\n"
        b"COPY host-ca.crt /etc/host-ca.crt\n"
        b"RUN pip install --break-system-packages --no-cache-dir --cert /etc/host-ca.crt"
        b" six==1.16.0\n"
    )
    # The host's trusted certificates, which its way to PyPI may need (a TLS-inspecting
    # egress here): the template's own bundle is Debian's.
    files = {"Dockerfile": dockerfile, "host-ca.crt": HOST_CA.read_bytes()}
    started = time.monotonic()
    status, frames = build(kd, "hello", files, "?network=host")
    print(f"debian build: {time.monotonic() - started:.0f} s")
    assert status == 200 and frames[-1]["end"] == "built", frames[-1]
    box = create(kd, "hello")
    try:
        assert box.ok("hello") == "Hello, world!"
        assert box.ok("python3 -c 'import six; print(six.__version__)'") == "1.16.0"
        assert box.ok("whoami") == "user"
    finally:
        box.kill()


@pytest_twisted.ensureDeferred
async def test_the_client_and_sandboxctl_build_and_report(kd: KernelDaemon, tmp_path: Path) -> None:
    from twisted.internet import reactor

    from sandboxd_client import HttpSandbox, TemplateBuildFailed
    from sandboxd_client.cli import Console, main_async

    (tmp_path / "Dockerfile").write_text(
        "FROM busybox\nCOPY hello.txt /srv/\nRUN cat /srv/hello.txt\n"
    )
    (tmp_path / "hello.txt").write_text("from the context\n")
    url = f"http://127.0.0.1:{kd.daemon.port}"
    client = HttpSandbox(url, reactor=reactor)
    try:
        frames: list[dict[str, Any]] = []
        built = await client.build_template("from-client", str(tmp_path), on_frame=frames.append)
        assert built.name == "from-client" and built.size > 0
        assert {"step": 3, "output": "from the context"} in frames
        (tmp_path / "Dockerfile").write_text("FROM busybox\nRUN echo no; exit 3\n")
        with pytest.raises(TemplateBuildFailed) as failed:
            await client.build_template("failed-client", str(tmp_path))
        assert (failed.value.step, failed.value.line, failed.value.exit_code) == (2, 2, 3)
        assert failed.value.output == ["no"]
    finally:
        await client.close()

    (tmp_path / "Dockerfile").write_text("FROM busybox\nENV A=1\nRUN echo $A-ran\n")
    out, err = io.BytesIO(), io.StringIO()
    argv = ["--url", url, "template", "build", "from-cli", str(tmp_path)]
    code = await main_async(reactor, argv, Console(out, err, tty=False))
    lines = out.getvalue().decode().splitlines()
    assert code == 0, err.getvalue()
    assert lines[:4] == [
        "Step 1/3 (line 1): FROM busybox",
        "Step 2/3 (line 2): ENV A=1",
        "Step 3/3 (line 3): RUN echo $A-ran",
        "  1-ran",
    ]
    assert lines[4].startswith("from-cli  ")
    (tmp_path / "Dockerfile").write_text("FROM busybox\nRUN exit 3\n")
    out, err = io.BytesIO(), io.StringIO()
    argv = ["--url", url, "--json", "template", "build", "failed-cli", str(tmp_path)]
    code = await main_async(reactor, argv, Console(out, err, tty=False))
    assert code == 1 and "step 2 (line 2: RUN exit 3) failed" in err.getvalue()
    assert json.loads(out.getvalue().splitlines()[-1])["step"] == 2
    (tmp_path / "Dockerfile").write_text("FROM busybox\nRUN echo json-ran\n")
    out, err = io.BytesIO(), io.StringIO()
    argv = ["--url", url, "--json", "template", "build", "json-cli", str(tmp_path)]
    code = await main_async(reactor, argv, Console(out, err, tty=False))
    printed = [json.loads(text) for text in out.getvalue().splitlines()]
    assert code == 0, err.getvalue()
    assert {"step": 2, "output": "json-ran"} in printed
    assert printed[-1]["end"] == "built" and printed[-1]["template"]["name"] == "json-cli"


def build_until_killed(daemon: Daemon) -> None:
    body = context({"Dockerfile": b"FROM busybox\nRUN sleep 41.5\n"})
    with contextlib.suppress(OSError, http.client.HTTPException):  # killed mid-answer
        daemon.call("POST", "/templates/killed/build", raw=body)


def sleepers(marker: bytes = b"41.5") -> list[int]:
    """The processes whose argv holds ``marker`` (a ``sleep``'s odd duration)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                found.append(int(pid))
    return found


def test_a_daemon_killed_mid_build_leaves_nothing_after_its_restart(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("builds need root")
    running = start_daemon(tmp_path, "--isolation=none")
    store = running.root / ".templates"
    sender = threading.Thread(target=build_until_killed, args=(running,), daemon=True)
    try:
        assert running.call("PUT", "/templates/busybox", raw=rootfs())[0] == 201
        sender.start()
        deadline = time.monotonic() + 60
        while not sleepers():
            assert time.monotonic() < deadline, "the build's RUN never started"
            time.sleep(0.01)
        assert any(n.startswith(".build-") for n in os.listdir(store))
        running.process.send_signal(signal.SIGKILL)
        running.process.wait(30)
    finally:
        if running.process.poll() is None:
            running.process.kill()  # not stop_daemon: it would remove the state root
        running.process.wait(30)
    sender.join(30)
    deadline = time.monotonic() + 10
    while sleepers():  # the build's processes die with the daemon
        assert time.monotonic() < deadline, f"the build's RUN outlived its daemon: {sleepers()}"
        time.sleep(0.01)
    restarted = start_daemon(tmp_path, "--isolation=none")
    try:
        assert os.listdir(store) == ["busybox"]
        assert [t["name"] for t in restarted.json("GET", "/templates")["templates"]] == ["busybox"]
        assert "removing" in restarted.log.read_text()
    finally:
        stop_daemon(restarted)


def test_a_json_body_builds_without_a_context(kd: KernelDaemon) -> None:
    json_type = {"content-type": "application/json"}
    body = {"dockerfile": "FROM busybox\nRUN echo from-json", "network": "none"}
    answer = kd.client.request(
        "POST", "/templates/from-json/build", json.dumps(body).encode(), headers=json_type
    )
    assert answer.status == 200
    frames = [json.loads(line) for line in answer.body.splitlines()]
    assert {"step": 2, "output": "from-json"} in frames and frames[-1]["end"] == "built"
    answer = kd.client.request(
        "POST", "/templates/bad-json/build", b'{"dockerfile": 1}', headers=json_type
    )
    assert (answer.status, answer.json()["detail"]) == (
        400,
        "dockerfile: must be the Dockerfile's text",
    )
    answer = kd.client.request("POST", "/templates/not-tar/build", b"FROM busybox\n" * 50)
    assert answer.status == 400 and "not a tar" in answer.json()["detail"]


def test_a_client_that_goes_cancels_its_build(kd: KernelDaemon) -> None:
    body = context({"Dockerfile": b"FROM busybox\nRUN echo started; sleep 42.5\n"})
    request = (
        b"POST /templates/cancelled/build HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    with socket.create_connection(("127.0.0.1", kd.daemon.port), timeout=30) as connection:
        connection.sendall(request)
        received = b""
        while b'"output":"started"' not in received:  # the RUN runs
            chunk = connection.recv(4096)
            assert chunk, received
            received += chunk
    deadline = time.monotonic() + 30
    while any(n.startswith(".build-") for n in leftovers(kd)) or sleepers(b"42.5"):
        assert time.monotonic() < deadline, (leftovers(kd), sleepers(b"42.5"))
        time.sleep(0.02)
    assert not any(n.startswith(".build-") for n in leftovers(kd))
    assert kd.call("GET", "/templates/cancelled").status == 404
    assert not sleepers(b"42.5")
