"""The daemon's end of one kernel: Jupyter's messaging over ``ipc://`` sockets (worker threads).

The kernel binds its five sockets as unix sockets in the sandbox's own ``tmp/`` (a directory
only that sandbox's uid and root may enter: docs/isolation.rst, "Layout"), so the daemon reaches
it without any network (the sandbox's network namespace is not crossed, no TCP port opens on the
host) and no other sandbox can reach it; each message is signed with a key of its own per
kernel. Every call here blocks: the manager runs them in a thread pool of their own, one call at
a time per kernel (a context's queue), never on the reactor.
"""

import contextlib
import json
import os
import queue
import secrets
import threading
from collections.abc import Callable, Mapping
from typing import Any

from sandboxd.core.contexts.events import Count, Error, Event, Output, Result

POLL = 0.1
"""Seconds between looks at whether the kernel died or the call was given up, while waiting."""
SOCKET_PATH_MAX = 100
"""Longest unix socket path taken (the kernel's limit is 107 bytes, the ports' suffix too)."""
CHANNELS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


class KernelGone(Exception):
    """The kernel process ended, or stopped answering in time."""


def connection_info(socket_prefix: str) -> dict[str, Any]:
    """A connection file's content: ``ipc`` transport, sockets ``{socket_prefix}-1`` to ``-5``,
    a fresh signing key. ``ValueError`` when the paths would be too long for a unix socket."""
    if len(socket_prefix.encode()) + 2 > SOCKET_PATH_MAX:
        raise ValueError(
            f"the kernel's socket path {socket_prefix!r} is over {SOCKET_PATH_MAX} bytes:"
            " use a shorter SANDBOXD_ROOT"
        )
    info: dict[str, Any] = {name: number for number, name in enumerate(CHANNELS, 1)}
    info.update(
        transport="ipc",
        ip=socket_prefix,
        key=secrets.token_hex(32),
        signature_scheme="hmac-sha256",
        kernel_name="",
    )
    return info


def write_connection_file(path: str, info: Mapping[str, Any]) -> None:
    """Write ``info`` at ``path``, mode 0600, never through a symlink or over a file (the
    caller runs this as the sandbox)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(dict(info), out)


class KernelLink:
    """A connected client of one kernel, used from one worker thread at a time."""

    def __init__(self, info: Mapping[str, Any], alive: Callable[[], bool]) -> None:
        self.alive = alive
        """False once the kernel's process has ended: every wait gives up with
        :class:`KernelGone`."""
        self.given_up = threading.Event()
        """Set by the manager to end the current wait (the context is being removed)."""
        # Jupyter's client imported with the first context: the daemon starts without it
        from jupyter_client.blocking.client import BlockingKernelClient

        from sandboxd.core.contexts.session import UndatedSession

        self.client = BlockingKernelClient(session=UndatedSession())
        self.client.load_connection_info(dict(info))  # type: ignore[arg-type]
        self.client.start_channels(hb=False)
        # The channels' own blocking reads: the client's get_*_msg wrap each one in a run of
        # an asyncio loop (a few hundred microseconds per message: a warm cell's fifth).
        self.get_shell_msg = self.client.shell_channel.get_msg
        self.get_iopub_msg = self.client.iopub_channel.get_msg

    def close(self) -> None:
        """Close the sockets and their ZMQ context at once (a context left to the garbage
        collector would wait forever for a dead kernel to take what was sent to it)."""
        self.client.stop_channels()
        self.client.context.destroy(linger=0)

    def wait_ready(self, timeout: float) -> None:
        """Return once the kernel answers on its shell socket and publishes on iopub (so no
        output of the first cell is missed); :class:`KernelGone` if it dies or ``timeout``
        seconds pass first."""
        waited = 0.0
        while waited < timeout:
            self._check()
            self.client.kernel_info()
            try:
                self.get_iopub_msg(timeout=POLL * 5)
            except queue.Empty:
                waited += POLL * 5
                continue
            self._drain()
            return
        raise KernelGone(f"the kernel did not answer within {timeout:g}s")

    def _drain(self) -> None:
        for get in (self.get_shell_msg, self.get_iopub_msg):
            while True:
                try:
                    get(timeout=POLL)
                except queue.Empty:
                    break

    def _check(self) -> None:
        if not self.alive():
            raise KernelGone("the kernel ended")
        if self.given_up.is_set():
            raise KernelGone("the context was removed")

    def run_silently(self, code: str, timeout: float | None = None) -> None:
        """Run ``code`` without history, count or output (the per-execution environment, the
        working directory); :class:`KernelGone` past ``timeout`` seconds."""
        self.execute(code, lambda event: None, silent=True, timeout=timeout)

    def execute(
        self,
        code: str,
        deliver: Callable[[Event], None],
        silent: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Run one cell, telling ``deliver`` each event of it in order (called in this
        thread), until the kernel is idle again; :class:`KernelGone` if it dies first, or
        (with a ``timeout``) does not finish within that many seconds."""
        msg_id = self.client.execute(
            code, silent=silent, store_history=not silent, allow_stdin=False, stop_on_error=False
        )
        waited = 0.0
        while True:
            self._check()
            try:
                message = self.get_iopub_msg(timeout=POLL)
            except queue.Empty:
                waited += POLL
                if timeout is not None and waited > timeout:
                    raise KernelGone(f"the kernel did not finish within {timeout:g}s") from None
                continue
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = message["msg_type"]
            content = message["content"]
            if kind == "status" and content.get("execution_state") == "idle":
                break
            event = _event_of(kind, content)
            if event is not None:
                deliver(event)
        with contextlib.suppress(queue.Empty):  # its execute_reply: replies never pile up
            self.get_shell_msg(timeout=POLL)


def _event_of(kind: str, content: Mapping[str, Any]) -> Event | None:
    if kind == "execute_input":
        return Count(int(content["execution_count"]))
    if kind == "stream":
        return Output(str(content["name"]), str(content["text"]))
    if kind in ("execute_result", "display_data"):
        return Result(dict(content["data"]), kind == "execute_result")
    if kind == "error":
        return Error(
            str(content["ename"]), str(content["evalue"]), tuple(map(str, content["traceback"]))
        )
    return None
