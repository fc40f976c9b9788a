"""``sandboxctl run-code``: a cell of Python in a sandbox's interpreter (docs/extensions.rst,
"Contexts").

run-code HANDLE [CODE] [--context ID] [--timeout S]
    runs CODE (or, without it, all of stdin) in the context ID, else in the sandbox's first
    context (made if it has none; every context is Python's), so that variables stay between
    calls. The cell's stdout goes to stdout as it comes, its stderr to stderr, then the value
    of its last expression to stdout; a raised exception's traceback goes to stderr and the
    exit code is 1. ``--json`` prints the whole execution as one object instead.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from attrs import asdict

from .._types import SandboxHandle
from ._handle import resolve_handle

if TYPE_CHECKING:
    from .. import HttpSandbox

COMMANDS = ("run-code",)


async def _context(client: HttpSandbox, handle: SandboxHandle) -> str:
    """The sandbox's first context (every context is Python's), made if it has none."""
    found = await client.contexts(handle)
    return found[0].id if found else (await client.create_context(handle)).id


async def run(client: HttpSandbox, args: argparse.Namespace, console: Any) -> int:
    """Run the cell; its exit code is 1 when it raised, else 0."""
    handle = resolve_handle(args.handle, args.url)
    code = args.code if args.code is not None else console.stdin.read().decode("utf-8")
    context = args.context or await _context(client, handle)

    def out(text: str) -> None:
        console.out.write(text.encode("utf-8"))
        console.out.flush()

    def err(text: str) -> None:
        console.err.write(text)
        console.err.flush()

    live = not args.json
    ran = await client.run_code(
        handle,
        context,
        code,
        timeout=args.timeout,
        on_stdout=out if live else None,
        on_stderr=err if live else None,
    )
    if args.json:
        console.json({"context": context, **asdict(ran)})
    else:
        if ran.text is not None:
            console.print(ran.text)
        if ran.error is not None:
            err("\n".join([*ran.error.traceback, f"{ran.error.name}: {ran.error.value}"]) + "\n")
    return 1 if ran.error is not None else 0
