"""What an exec promises whatever starts it (the helper, the spawn server, a zygote): the exit
codes and messages of the helper's last step, stdin, and a missing working directory."""

import base64
import json

from tests.kernel.kernel_http import SLOW, Box, KernelDaemon


def exec_frames(kd: KernelDaemon, box: Box, body: dict[str, object]) -> dict[str, object]:
    """The exit frame of an exec of ``body`` in ``box``."""
    answer = kd.call("POST", box.url("exec"), body, timeout=60 * SLOW)
    assert answer.status == 200, answer
    last: dict[str, object] = json.loads(answer.body.splitlines()[-1])
    return last


def check_the_helpers_exit_codes(kd: KernelDaemon, box: Box) -> None:
    """An exit code and both streams; 126 and 127 with the helper's messages; exit 2 for a
    working directory that is not there; stdin."""
    result = box.run("echo out; echo err >&2; exit 3")
    assert (result.exit, result.out, result.err) == (3, b"out\n", b"err\n")
    script = box.workspace / "script"
    script.write_text("#!/bin/sh\necho never\n")
    script.chmod(0o644)
    not_executable = box.exec(["./script"])
    assert not_executable.exit == 126, not_executable
    assert b"Permission denied" in not_executable.err
    not_found = box.exec(["no-such-command"])
    assert (not_found.exit, not_found.err) == (
        127,
        b"sandboxd-exec: no-such-command: command not found\n",
    )
    no_cwd = exec_frames(kd, box, {"cmd": ["true"], "cwd": "gone"})
    assert no_cwd["exit"] == 2, no_cwd
    assert b"sandboxd-exec: cd " in base64.b64decode(str(no_cwd["err"]))
    stdin = exec_frames(kd, box, {"cmd": ["cat"], "stdin": base64.b64encode(b"in\n").decode()})
    assert (stdin["exit"], base64.b64decode(str(stdin["out"]))) == (0, b"in\n")
