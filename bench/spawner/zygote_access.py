#!/usr/bin/env python3
"""What a sandbox's own processes can do to its zygote (docs/spawner-design.rst); root.

    sudo nice -n 19 .venv/bin/python bench/spawner/zygote_access.py

Starts one zygote (``spawner.c zygote``) in a sandbox's isolation made as ``run.py`` makes it,
prints its credentials and filter state from ``/proc/PID/status``, then tries, as the sandbox's
uid (``setpriv``), to list its descriptors, read its environment, ptrace it (``strace -p``) and
signal it (``kill -0``), printing each outcome; then lists the descriptors a command started
through the zygote holds.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.spawner import run


def command_fds(zygote: run.Server) -> str:
    """What ``/proc/self/fd`` holds in a command started by ``zygote`` (the listing's own
    descriptor included)."""
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    argv = ["python3", "-c", "import os; print(sorted(os.listdir('/proc/self/fd'), key=int))"]
    body = b"".join(a.encode() + b"\0" for a in argv) + b"\0"
    body += b"".join(f"{k}={v}".encode() + b"\0" for k, v in run.ENV.items())
    socket.send_fds(zygote.sock, [body], [zygote.devnull, out_w, err_w])
    os.close(out_w)
    os.close(err_w)
    pid = int.from_bytes(zygote.sock.recv(4), sys.byteorder, signed=True)
    with os.fdopen(out_r, "rb") as out, os.fdopen(err_r, "rb") as err:
        text = out.read().decode().strip() + err.read().decode().strip()
    os.waitpid(pid, 0)
    return text


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="spawnbench-"))
    os.chmod(base, 0o755)
    helper, binary = str(base / "sandboxd-exec"), str(base / "spawner")
    run.build(run.HELPER_SOURCE, Path(helper))
    run.build(run.HERE / "spawner.c", Path(binary))
    sandbox = run.Sandbox(helper, base)
    try:
        zygote = run.Server(binary, "zygote", sandbox.setup_args())
        zygote.request(["true"], run.ENV)  # ready once it answered
        pid = zygote.process.pid
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        print([line for line in status if line.startswith(("Uid", "Seccomp", "NoNewPrivs"))])
        as_uid = ["setpriv", f"--reuid={run.UID}", f"--regid={run.UID}", "--clear-groups", "--"]
        attempts = [
            ["ls", f"/proc/{pid}/fd"],
            ["cat", f"/proc/{pid}/environ"],
            ["strace", "-p", str(pid), "-e", "trace=none", "-o", "/dev/null", "--", "true"],
            ["kill", "-0", str(pid)],
        ]
        for argv in attempts:
            done = subprocess.run(as_uid + argv, capture_output=True, text=True, timeout=10)
            said = (done.stderr or done.stdout).strip()[:100]
            print(" ".join(argv[:2]), "->", done.returncode, said)
        print("descriptors a command gets:", command_fds(zygote))
        zygote.close()
    finally:
        sandbox.close()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
