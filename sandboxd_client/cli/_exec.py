"""``sandboxctl exec``: a command's output streamed live, its exit code as ``sandboxctl``'s,
stdin streamed when it is a pipe or a file (``_stdin``); exec's own failures exit 125."""

from __future__ import annotations

import argparse

from .. import HttpSandbox
from .._types import OutputChunk, SandboxHandle
from . import _stdin
from ._console import Console
from ._handle import resolve_handle

EXEC_FAILED = 125


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


NO_TERMINALS = (
    "exec -t: terminals (a PTY) come in a later release of sandboxd; -i streams stdin without one"
)


async def _exec(client: HttpSandbox, args: argparse.Namespace, console: Console) -> int:
    argv = args.cmd
    if args.tty:
        console.error(NO_TERMINALS)
        return 2
    handle = resolve_handle(args.handle, args.url)
    if not argv:
        raise ValueError("exec needs a command: sandboxctl exec HANDLE CMD...")
    stdin: bytes | None = None
    source = console.stdin
    fd = _stdin.fd_of(source)
    if _stdin.wants_stdin(fd, args.stdin):
        if fd is not None and _stdin.PROCESSES in await client.capabilities(handle):
            code = await _exec_streamed(client, handle, args, console, fd)
            return await _exec_own_failure(client, handle, args, console, code)
        stdin = _stdin.buffered(source)

    def live(chunk: bytes) -> None:
        console.out.write(chunk)
        console.out.flush()

    def live_stderr(chunk: bytes) -> None:
        console.err.write(chunk.decode("utf-8", "replace"))
        console.err.flush()

    result = await client.exec(
        handle,
        argv,
        on_output=None if args.json else live,
        env=dict(args.env) or None,
        cwd=args.cwd,
        timeout=args.timeout,
        stdin=stdin,
        on_stderr=None if args.json else live_stderr,
    )
    if args.json:
        console.json(
            {
                "exit_code": result.exit_code,
                "stdout": _text(result.stdout),
                "stderr": _text(result.stderr),
                "truncated": result.truncated,
            }
        )
    return await _exec_own_failure(client, handle, args, console, result.exit_code)


CWD_FAILED = 2
"""What the daemon answers when the command could not enter its ``cwd`` (a shell's ``cd``)."""


async def _exec_own_failure(
    client: HttpSandbox,
    handle: SandboxHandle,
    args: argparse.Namespace,
    console: Console,
    code: int,
) -> int:
    """``code``, unless it is exec's own failure: the daemon answers a ``--cwd`` it cannot
    enter as the command's exit 2, as a shell's ``cd`` would (docs/extensions.rst, "Exec
    fields"); ``exec`` exits 125 for one that is no directory of the workspace, as ``docker
    exec`` does, with one line naming the option. Asked only after an exit 2 with ``--cwd``: a
    command's own exit 2 costs one look at the workspace, others none. (A directory closed to
    the sandbox's uid stays 2: the wire has no sign of which process failed.)"""
    if code != CWD_FAILED or args.cwd is None:
        return code
    if await client.exists(handle, args.cwd) and await client.size(handle, args.cwd) is None:
        return code  # a directory: the command's own exit 2
    console.error(f"exec: --cwd {args.cwd}: no such directory in the sandbox's workspace")
    return EXEC_FAILED


async def _exec_streamed(
    client: HttpSandbox,
    handle: SandboxHandle,
    args: argparse.Namespace,
    console: Console,
    fd: int,
) -> int:
    """``exec`` with stdin streamed (see ``_stdin``); ``--json`` gathers the output."""
    kept: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    def write(chunk: OutputChunk) -> None:
        if args.json:
            kept[chunk.stream] += chunk.data
        elif chunk.stream == "stdout":
            console.out.write(chunk.data)
            console.out.flush()
        else:
            console.err.write(_text(chunk.data))
            console.err.flush()

    reader = _stdin.reader_of(console.reactor, fd)
    code = await _stdin.streamed(client, handle, args, reader, write)
    if args.json:
        console.json(
            {
                "exit_code": code,
                "stdout": _text(bytes(kept["stdout"])),
                "stderr": _text(bytes(kept["stderr"])),
                "truncated": False,
            }
        )
    return code
