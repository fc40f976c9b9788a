"""Smoke checks of sandboxd.service, run inside the test VM by sandboxd-smoke.service.

Standard library only (Debian's python3 in the image). Every check prints one
``SMOKE ok: …`` or ``SMOKE FAIL: …`` line; the last line is ``SMOKE RESULT: PASS`` or
``SMOKE RESULT: FAIL``, which tests/systemd/run.sh reads from the serial log.
"""

import base64
import json
import os
import subprocess
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

API = "http://127.0.0.1:8080"
UNIT = "sandboxd.service"
ENV_FILE = "/etc/sandboxd/sandboxd.env"
TOKEN = Path("/etc/sandboxd/token").read_text(encoding="ascii").strip()
CREATES_IN_A_ROW = 500
failures: list[str] = []


def say(line: str) -> None:
    print(line, flush=True)


def check(name: str, condition: bool, detail: object = "") -> bool:
    if condition:
        say(f"SMOKE ok: {name}")
    else:
        say(f"SMOKE FAIL: {name}: {detail}")
        failures.append(name)
    return condition


def settings() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in Path(ENV_FILE).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            values[name] = value
    return values


def call(
    method: str, path: str, body: Any = None, token: str | None = TOKEN, timeout: float = 120
) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(API + path, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def call_json(method: str, path: str, body: Any = None) -> Any:
    status, data = call(method, path, body)
    if status != 200:
        raise AssertionError(f"{method} {path}: {status} {data[:300]!r}")
    return json.loads(data)


def run_exec(rid: str, cmd: list[str]) -> dict[str, Any]:
    """The final frame of an exec, with ``out``/``err`` decoded to text."""
    status, data = call("POST", f"/sandboxes/{rid}/exec", {"cmd": cmd}, timeout=300)
    if status != 200:
        raise AssertionError(f"exec {cmd}: {status} {data[:300]!r}")
    frame = json.loads(data.strip().splitlines()[-1])
    for name in ("out", "err"):
        if name in frame:
            frame[name] = base64.b64decode(frame[name]).decode(errors="replace")
    return frame


def unit(*properties: str) -> dict[str, str]:
    args = ["systemctl", "show", UNIT, *(f"--property={p}" for p in properties)]
    text = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def wait_for(what: str, predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if predicate():
                return check(what, True)
        except (OSError, AssertionError, ValueError):
            pass
        time.sleep(0.5)
    return check(what, False, f"not within {seconds}s")


def cgroup_of(pid: int | str) -> str:
    with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip()
    return ""


def smoke() -> None:
    config = settings()
    isolation = config.get("SANDBOXD_ISOLATION", "auto")
    began = time.monotonic()

    # Type=notify: this unit is ordered after sandboxd.service, so systemd only started us once
    # the daemon said READY=1. It must answer at once, without a retry.
    state = unit("ActiveState", "SubState", "Type", "NotifyAccess", "MainPID", "NRestarts")
    check("unit active (Type=notify, READY=1 received)", state["ActiveState"] == "active", state)
    check("unit type notify", state["Type"] == "notify", state)
    status, body = call("GET", "/healthz", token=None, timeout=10)
    check("/healthz answers at once after READY=1", status == 200, (status, body))
    health = json.loads(body)
    say(f"SMOKE info: capabilities {health.get('capabilities')}")
    if isolation != "auto":
        check(
            f"isolation.{isolation} reported",
            f"isolation.{isolation}" in health.get("capabilities", []),
            health,
        )
    status, body = call("GET", "/readyz", token=None)
    check("/readyz 200", status == 200, (status, body))

    # Auth: the token came from LoadCredential=; without it every route but health is refused.
    status, body = call("POST", "/sandboxes", {}, token=None)
    check("create without the token is 401", status == 401, (status, body))
    main_pid = state["MainPID"]
    with open(f"/proc/{main_pid}/environ", "rb") as f:
        environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    token_file = environ.get(b"SANDBOXD_TOKEN_FILE", b"").decode()
    check(
        "token handed over as a credential",
        token_file.startswith("/run/credentials/sandboxd.service/"),
        token_file,
    )

    # Creates in a row: the unit's own mount namespace (PrivateTmp=, ProtectHome=) pins every
    # sandbox's namespaces, whichever CPU makes them.
    failed = []
    for _ in range(CREATES_IN_A_ROW):
        status, body = call("POST", "/sandboxes", {})
        if status != 200:
            failed.append((status, body[:200]))
            continue
        call("DELETE", f"/sandboxes/{json.loads(body)['remote_id']}")
    check(f"{CREATES_IN_A_ROW} creates in a row all succeed", not failed, failed[:3])

    # Create, then exec inside the sandbox.
    created = call_json("POST", "/sandboxes", {})
    rid = created["remote_id"]
    check("create", bool(rid), created)
    frame = run_exec(rid, ["sh", "-c", "echo hello; id -u; cat /proc/self/cgroup"])
    check("exec exits 0 with its output", frame.get("exit") == 0 and "hello" in frame["out"], frame)
    lines = frame.get("out", "").split()
    uid = int(lines[1]) if len(lines) > 1 and lines[1].isdigit() else -1
    if isolation != "none":
        low = int(config.get("SANDBOXD_UID_MIN", "200000"))
        high = int(config.get("SANDBOXD_UID_MAX", "201999"))
        check("exec runs as a pool uid", low <= uid <= high, frame)
        path = next((x for x in lines if x.startswith("0::")), "")[3:]
        check(
            "exec runs in the sandbox's own cgroup under the unit's delegated subtree",
            path.startswith(f"/system.slice/{UNIT}/") and path.endswith(f"/{rid}"),
            path,
        )
        memory_max = Path(f"/sys/fs/cgroup{path}/memory.max").read_text(encoding="ascii").strip()
        check(
            "memory.max of the sandbox is SANDBOXD_MEMORY_MAX", memory_max == "67108864", memory_max
        )
        daemon_cgroup = cgroup_of(main_pid)
        check(
            "the daemon moved itself into a leaf of its delegated cgroup",
            daemon_cgroup == f"/system.slice/{UNIT}/sandboxd-supervisor",
            daemon_cgroup,
        )
        frame = run_exec(rid, ["sh", "-c", f"cat {token_file} /etc/sandboxd/token; env; exit 0"])
        check(
            "the token is not visible to a sandbox",
            TOKEN not in frame.get("out", "") + frame.get("err", ""),
            "token leaked",
        )

        # A command past its memory limit is OOM-killed: 137.
        frame = run_exec(rid, ["python3", "-c", "b = b'x' * (256 << 20); print(len(b))"])
        check(
            "a command over SANDBOXD_MEMORY_MAX is OOM-killed with 137",
            frame.get("exit") == 137,
            frame,
        )
        stats = call_json("GET", f"/sandboxes/{rid}/stats")
        check("stats count the OOM kill", stats.get("oom_kills", 0) >= 1, stats)
        frame = run_exec(rid, ["sh", "-c", "echo still-alive"])
        check("the sandbox keeps working after the OOM kill", frame.get("exit") == 0, frame)

    # Restart=on-failure: a crash (SIGKILL to the daemon) restarts it; it reclaims the leftovers.
    subprocess.run(["systemctl", "kill", "--kill-who=main", "--signal=SIGKILL", UNIT], check=True)
    wait_for(
        "restarted after a crash",
        lambda: (
            unit("ActiveState", "MainPID")["MainPID"] not in ("0", main_pid)
            and unit("ActiveState")["ActiveState"] == "active"
            and call("GET", "/healthz", token=None, timeout=5)[0] == 200
        ),
        900,
    )
    state = unit("NRestarts", "MainPID")
    check("NRestarts is 1", state["NRestarts"] == "1", state)
    status, body = call("GET", f"/sandboxes/{rid}/ready")
    check("the crashed daemon's sandbox is gone after the restart", status == 404, (status, body))
    if isolation != "none":
        leftover = f"/sys/fs/cgroup{path}"
        check("its cgroup was reclaimed", not os.path.exists(leftover), leftover)

    # systemctl stop drains: a running command finishes, new creates are refused, exit 0.
    rid = call_json("POST", "/sandboxes", {})["remote_id"]
    result: dict[str, Any] = {}

    def long_exec() -> None:
        try:
            result.update(run_exec(rid, ["sh", "-c", "sleep 30; echo drained-ok"]))
        except Exception as e:  # reported below
            result["error"] = repr(e)

    worker = threading.Thread(target=long_exec)
    worker.start()
    wait_for(
        "the long command is running",
        lambda: any(s.get("execs") for s in call_json("GET", "/sandboxes")["sandboxes"]),
        300,
    )
    stop_began = time.monotonic()
    stopper = subprocess.Popen(["systemctl", "stop", UNIT])
    wait_for(
        "/readyz turns 503 while draining",
        lambda: call("GET", "/readyz", token=None, timeout=5)[0] == 503,
        60,
    )
    status, body = call("POST", "/sandboxes", {}, timeout=10)
    check(
        "create is refused with 503 Draining", status == 503 and b"Draining" in body, (status, body)
    )
    state = unit("ActiveState", "SubState")
    check("the unit is deactivating while it drains", state["ActiveState"] == "deactivating", state)
    worker.join(300)
    check(
        "the running command finished during the drain",
        result.get("exit") == 0 and "drained-ok" in result.get("out", ""),
        result,
    )
    stopper.wait(300)
    took = time.monotonic() - stop_began
    state = unit("ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
    check("systemctl stop returned 0", stopper.returncode == 0, stopper.returncode)
    check(
        "the unit stopped cleanly (Result=success)",
        state["ActiveState"] == "inactive" and state["Result"] == "success",
        state,
    )
    # twistd re-raises the SIGTERM it stopped on; systemd counts that as a clean exit.
    check(
        "the daemon exited cleanly",
        (state["ExecMainCode"], state["ExecMainStatus"]) in (("1", "0"), ("2", "15")),
        state,
    )
    check("the drain took less than TimeoutStopSec", took < 90, f"{took:.1f}s")
    say(f"SMOKE info: stop (drain) took {took:.1f}s")
    check(
        "no cgroup left behind", not os.path.exists(f"/sys/fs/cgroup/system.slice/{UNIT}"), "left"
    )
    journal = subprocess.run(
        ["journalctl", "-u", UNIT, "--no-pager", "-o", "cat"], capture_output=True, text=True
    ).stdout
    check("the journal narrates the drain", "drained" in journal, journal[-2000:])
    say(f"SMOKE info: smoke checks took {time.monotonic() - began:.1f}s")


def main() -> None:
    try:
        smoke()
    except Exception:
        for line in traceback.format_exc().splitlines():
            say(f"SMOKE FAIL: {line}")
        failures.append("exception")
    journal = subprocess.run(
        ["journalctl", "-u", UNIT, "--no-pager", "-o", "short-monotonic", "-n", "60"],
        capture_output=True,
        text=True,
    ).stdout
    for line in journal.splitlines():
        say(f"JOURNAL | {line}")
    say(f"SMOKE RESULT: {'FAIL ' + ', '.join(failures) if failures else 'PASS'}")


if __name__ == "__main__":
    main()
