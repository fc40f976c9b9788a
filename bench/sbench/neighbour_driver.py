"""The neighbour's driver (``python -m sbench.neighbour_driver PORT RID LOAD PARAMS``): the
tenant of a neighbour sandbox (``sbench.neighbours``), a process of its own, so that its work
takes nothing from the bench's interpreter. It runs one load through the daemon's API, again
and again, until SIGTERM."""

import json
import select
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

from .rawhttp import CHUNK, RawHTTP
from .terminals import TerminalSocket

KEY_FRAME = 50
"""Bytes per WebSocket message of the ``keystrokes`` load: a fast typist's burst or a paste."""
TREE = "/tree"


class Stop(Exception):
    """Raised in the driver by SIGTERM: stop the load and report."""


def exec_body(cmd: list[str], bound: float) -> bytes:
    """An exec request whose own timeout comes after the ``timeout -s KILL bound`` inside it
    (that one kills the command's whole process group; the daemon's kills its process)."""
    return json.dumps({"cmd": cmd, "timeout": bound + 5}).encode()


def drive(port: int, rid: str, load: str, params: dict[str, Any]) -> None:
    """Run ``load`` again and again until SIGTERM; print ``started`` once the first request is
    on its way, and a JSON summary (cycles, bytes read; ``typed`` for keystrokes) at the end."""

    def stop(signum: int, frame: Any) -> None:
        # ``timeout`` passes a SIGTERM on to its child and then to its whole group: only the
        # first one stops the load, the second must not interrupt the summary.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Stop

    signal.signal(signal.SIGTERM, stop)
    raw = RawHTTP(port)
    got = [0, 0]  # bytes read, bytes typed
    cycles = 0

    def sink(chunk: bytes) -> None:
        got[0] += len(chunk)

    def started() -> None:
        if cycles == 0:
            print("started", flush=True)

    base = f"/sandboxes/{rid}"
    try:
        if load == "terminal":
            read_terminal(raw, base, params["cmd"], got)
        if load == "keystrokes":
            type_keys(raw, base, params["cmd"], params["rate"], got)
        while True:
            started()
            if params.get("cmd"):
                body = exec_body(params["cmd"], params["bound"])
                status, _ = raw.request("POST", f"{base}/exec", body, sink=sink)
            elif load == "upload":
                size = int(params["bytes"])
                status, _ = raw.request(
                    "PUT",
                    f"{base}/file?path=/upload.bin",
                    zeros(size),
                    {"Content-Length": str(size), "Content-Type": "application/octet-stream"},
                )
                got[0] += size
            else:
                status, _ = raw.request("GET", f"{base}/walk?root={TREE}", sink=sink)
            if not 200 <= status < 300:
                raise RuntimeError(f"{load}: HTTP {status}")
            cycles += 1
    except Stop:
        pass
    finally:
        raw.close()
    summary = {"cycles": cycles, "bytes": got[0]}
    if load == "keystrokes":
        summary["typed"] = got[1]
    print(json.dumps(summary), flush=True)


def read_terminal(raw: RawHTTP, base: str, cmd: list[str], got: list[int]) -> None:
    """Open a terminal running ``cmd`` and read its output until SIGTERM (:class:`Stop`)."""
    terminal = raw.json("POST", f"{base}/terminals", {"cmd": cmd})["id"]
    socket = TerminalSocket(raw.port, f"{base}/terminals/{terminal}")
    print("started", flush=True)
    try:
        while True:
            take(socket, got)
    finally:
        socket.close()


def type_keys(raw: RawHTTP, base: str, cmd: list[str], rate: int, got: list[int]) -> None:
    """Open a terminal running ``cmd`` (a program that prints ``ready`` then echoes what it
    reads) and type ``rate`` bytes a second into it, :data:`KEY_FRAME` to a message, paced by
    the monotonic clock, its echo read as it comes, until SIGTERM (:class:`Stop`)."""
    terminal = raw.json("POST", f"{base}/terminals", {"cmd": cmd})["id"]
    socket = TerminalSocket(raw.port, f"{base}/terminals/{terminal}")
    try:
        socket.until(b"ready")  # the pty is raw: typed now, the bytes pass as they come
        print("started", flush=True)
        keys = (b"abcdefghijklmnopqrstuvwxyz" * (KEY_FRAME // 26 + 1))[:KEY_FRAME]
        start = time.monotonic()
        while True:
            socket.send(keys)
            got[1] += len(keys)
            deadline = start + got[1] / rate
            while (left := deadline - time.monotonic()) > 0:
                if socket.buffer or select.select([socket.sock], [], [], left)[0]:
                    take(socket, got)
    finally:
        socket.close()


def take(socket: TerminalSocket, got: list[int]) -> None:
    """Read one message of a terminal's output (its end is an error: the load stopped)."""
    opcode, payload = socket.receive()
    if opcode != 0x2:
        raise RuntimeError(f"terminal: the socket ended: {payload[:200]!r}")
    got[0] += len(payload)


def zeros(size: int) -> Iterator[bytes]:
    block = bytes(CHUNK)
    left = size
    while left > 0:
        yield block[: min(left, CHUNK)]
        left -= min(left, CHUNK)


if __name__ == "__main__":
    drive(int(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
