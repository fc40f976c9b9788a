"""``sandboxctl`` commands for background processes and workspace watch (docs/extensions.rst).

run -d HANDLE [--env K=V]... [--cwd D] [--timeout S] [--tag T] [-i] -- CMD...
                                 start CMD in the background; print its id (its pid on stderr)
logs [-f] [--offset N] HANDLE ID its output (stdout to stdout, stderr to stderr); -f
                                 follows it to its end and exits with its exit code
ps HANDLE                        the sandbox's background processes
signal HANDLE ID NAME            TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP or CONT
watch HANDLE [ROOT] [--flat]     print each change under ROOT until Ctrl-C
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from attrs import asdict

from .._types import OutputChunk, SandboxHandle, WatchEvent
from ._handle import resolve_handle

if TYPE_CHECKING:
    from .. import HttpSandbox

COMMANDS = ("run", "logs", "ps", "signal", "watch")


async def run(client: HttpSandbox, args: argparse.Namespace, console: Any) -> int:
    """Carry out one of :data:`COMMANDS`; return the exit code."""
    handle = resolve_handle(args.handle, args.url)
    if args.command == "run":
        if not args.cmd:
            raise ValueError("run needs a command: sandboxctl run -d HANDLE -- CMD...")
        started = await client.start_process(
            handle,
            args.cmd,
            env=dict(args.env) or None,
            cwd=args.cwd,
            timeout=args.timeout,
            tag=args.tag,
            stdin=args.stdin,
        )
        if args.json:
            console.json({"id": started.id, "pid": started.pid})
        else:
            console.print(started.id)  # alone, for P=$(sandboxctl run -d ...); logs "$P"
            console.note(f"pid {started.pid}")
        return 0
    if args.command == "logs":
        return await _logs(client, handle, args, console)
    if args.command == "ps":
        found = await client.processes(handle)
        if not found and not args.json:
            console.note("no background processes")
        if args.json:
            console.json([asdict(p) for p in found])
        for p in [] if args.json else found:
            state = "running" if p.running else f"exit={p.exit_code}"
            console.print(f"{p.id}  {p.pid}  {state:10}  {p.tag or '-'}  {' '.join(p.cmd)}")
        return 0
    if args.command == "signal":
        await client.signal(handle, args.id, args.signal.upper().removeprefix("SIG"))
        return 0
    await client.watch(handle, args.root, not args.flat, lambda e: _event(console, e, args.json))
    return 0  # pragma: no cover - a watch ends by Ctrl-C or with the sandbox (an error)


async def _logs(
    client: HttpSandbox, handle: SandboxHandle, args: argparse.Namespace, console: Any
) -> int:
    at = [args.offset]

    def write(chunk: OutputChunk) -> None:
        target = console.out if chunk.stream == "stdout" else sys.stderr.buffer
        target.write(chunk.data)
        target.flush()
        at[0] = chunk.end

    try:
        result = await client.output(handle, args.id, args.offset, args.follow, write)
    except Exception:
        console.error(f"the output stream failed: resume with --offset {at[0]}")
        raise
    if result.dropped:
        console.error(f"{result.dropped} bytes fell out of the host's log before they were read")
    if args.follow and result.exit_code is not None:
        return result.exit_code
    return 0


def _event(console: Any, event: WatchEvent, as_json: bool) -> None:
    if as_json:
        console.json(asdict(event))
    else:
        console.print(f"{event.event:8} {event.path or ''}{'/' if event.dir else ''}")
