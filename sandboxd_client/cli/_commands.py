"""
``sandboxctl``: the sandboxd client at a terminal (SPEC §6).

    sandboxctl [--url URL] [--token-file FILE] [--json] COMMAND ...

    create [--image I] [--env K=V]... [--port P]... [--item-id ID] [--network M]
                                     print a new handle
    kill HANDLE
    exec HANDLE [--env K=V]... [--cwd D] [--timeout S] [-i] -- CMD...
    put HANDLE LOCAL REMOTE          upload a local file (progress bar on a terminal)
    get HANDLE REMOTE LOCAL          download to a local file (progress bar on a terminal)
    ls HANDLE [ROOT]                 every file under ROOT (default /)
    rm HANDLE PATH [-r]              delete a file (-r: a directory and its contents)
    list [--pod URL]                 live sandboxes (operators)
    health [--pod URL]
    run -d, logs [-f], ps, signal, watch   background processes and workspace watch
                                     (see sandboxd_client.cli._processes)
    mcp [--transport stdio|http] [--host H] [--port P] [--path /mcp]
                                     a Model Context Protocol server (needs the [mcp] extra)

``exec`` streams the command's output (stdout and stderr, interleaved as produced) live to
stdout and exits with the command's exit code, like ``docker exec``; its own failures exit 125.
Every other failure prints one line on stderr and exits 1. ``--url`` defaults to
``$SANDBOXD_URL`` (else http://127.0.0.1:8080), ``--token-file`` to ``$SANDBOXD_TOKEN_FILE``.
``--json`` prints machine-readable results on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any, BinaryIO, NoReturn, TextIO

from attrs import asdict
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import react

from .. import HttpSandbox, SandboxError, SandboxHandle, SandboxSpec
from . import _processes
from ._progress import MIB, ProgressBar

DEFAULT_URL = "http://127.0.0.1:8080"
EXEC_FAILED = 125


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; global options are accepted before or after the subcommand."""
    parser = argparse.ArgumentParser(prog="sandboxctl", description="Drive a sandboxd service.")
    common = argparse.ArgumentParser(add_help=False)
    for p, default in ((parser, True), (common, False)):

        def d(value: Any, default: bool = default) -> Any:
            return value if default else argparse.SUPPRESS

        p.add_argument("--url", default=d(os.environ.get("SANDBOXD_URL", DEFAULT_URL)))
        p.add_argument("--token-file", default=d(os.environ.get("SANDBOXD_TOKEN_FILE")))
        p.add_argument("--json", action="store_true", default=d(False), help="JSON output")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common])

    p = add("create", "create a sandbox and print its handle")
    p.add_argument("--image")
    p.add_argument("--env", type=_env_pair, action="append", default=[])
    p.add_argument("--port", type=int, action="append", default=[])
    p.add_argument("--item-id")
    p.add_argument("--network", choices=("none", "egress", "host"))
    add("kill", "kill a sandbox").add_argument("handle")
    p = add("exec", "run a command, streaming its output")
    p.add_argument("handle")
    p.add_argument("--env", type=_env_pair, action="append", default=[])
    p.add_argument("--cwd")
    p.add_argument("--timeout", type=float)
    p.add_argument("-i", "--stdin", action="store_true", help="send this process's stdin")
    p.add_argument("cmd", nargs="*", help="the command (put it after -- if it has options)")
    p = add("put", "upload a local file")
    p.add_argument("handle")
    p.add_argument("local")
    p.add_argument("remote")
    p = add("get", "download a file")
    p.add_argument("handle")
    p.add_argument("remote")
    p.add_argument("local")
    p = add("ls", "list files under ROOT")
    p.add_argument("handle")
    p.add_argument("root", nargs="?", default="/")
    p = add("rm", "delete a file (or, with -r, a directory)")
    p.add_argument("handle")
    p.add_argument("path")
    p.add_argument("-r", "--recursive", action="store_true")
    _processes.add_parsers(add, _env_pair)
    add("list", "list live sandboxes").add_argument("--pod")
    add("health", "show service health").add_argument("--pod")
    p = add("mcp", "serve the sandboxes to an MCP client (stdio, or streamable HTTP)")
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="http: the address to listen on")
    p.add_argument("--port", type=int, default=8765, help="http: the port to listen on")
    p.add_argument("--path", default="/mcp", help="http: the endpoint's path")
    p.add_argument(
        "--max-output", type=int, default=64 << 10, help="bytes of stdout/stderr per result"
    )
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """
    Parse a command line; for ``exec``, everything after the first ``--`` is the command
    verbatim (options included), so ``exec HANDLE --cwd d -- ls -l`` works.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        if args.command in ("exec", "run"):
            args.cmd = [*args.cmd, *argv[cut + 1 :]]
            return args
    return parser.parse_args(argv)


def describe(e: BaseException) -> str:
    """One line naming the failure for a person."""
    if isinstance(e, SandboxError):
        return f"{type(e).__name__}: {e.detail}"
    if isinstance(e, OSError) and e.strerror:
        return f"{type(e).__name__}: {e.strerror}" + (f": {e.filename}" if e.filename else "")
    return f"{type(e).__name__}: {e}"


class Console:
    """Where ``run`` writes: binary stdout (command output, results) and text stderr."""

    def __init__(self, out: BinaryIO, err: TextIO, *, tty: bool | None = None) -> None:
        self.out = out
        self.err = err
        self.tty = err.isatty() if tty is None else tty

    def print(self, text: str) -> None:
        self.out.write(text.encode("utf-8") + b"\n")
        self.out.flush()

    def error(self, message: str) -> None:
        """One line on stderr: ``sandboxctl: <message>``."""
        self.err.write(f"sandboxctl: {message}\n")
        self.err.flush()

    def json(self, value: object) -> None:
        self.print(json.dumps(value, sort_keys=True))

    def progress(self, label: str, total: int | None) -> ProgressBar | None:
        """A progress bar on stderr, only on a terminal and only for large transfers."""
        if self.tty and (total is None or total >= MIB):
            return ProgressBar(self.err, label)
        return None


async def _transfer(console: Console, label: str, call: Any, *args: Any) -> None:
    """Run an upload/download, drawing a progress bar when ``console`` wants one."""
    bar: list[ProgressBar | None] = []

    def on_progress(done: int, total: int | None) -> None:
        if not bar:
            bar.append(console.progress(label, total))
        if bar[0] is not None:
            bar[0].update(done, total)

    try:
        await call(*args, on_progress=on_progress)
    finally:
        if bar and bar[0] is not None:
            bar[0].finish()


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


async def _exec(client: HttpSandbox, args: argparse.Namespace, console: Console) -> int:
    argv = args.cmd
    if not argv:
        raise ValueError("exec needs a command: sandboxctl exec HANDLE -- CMD...")
    stdin = sys.stdin.buffer.read() if args.stdin else None

    def live(chunk: bytes) -> None:
        console.out.write(chunk)
        console.out.flush()

    result = await client.exec(
        SandboxHandle(args.handle),
        argv,
        on_output=None if args.json else live,
        env=dict(args.env) or None,
        cwd=args.cwd,
        timeout=args.timeout,
        stdin=stdin,
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
    return result.exit_code


async def run(client: HttpSandbox, args: argparse.Namespace, console: Console) -> int:
    """Carry out one parsed command; return the exit code (exceptions are the caller's)."""
    cmd, as_json = args.command, args.json
    if cmd == "exec":
        return await _exec(client, args, console)
    if cmd in _processes.COMMANDS:
        return await _processes.run(client, args, console)
    if cmd == "create":
        spec = SandboxSpec(args.image, dict(args.env), tuple(args.port), args.item_id, args.network)
        handle = await client.create(spec)
        if as_json:
            console.json({"handle": handle.id})
        else:
            console.print(handle.id)
        return 0
    if cmd in ("list", "health"):
        if cmd == "list":
            infos = await client.list_sandboxes(args.pod)
            lines = [
                f"{i.remote_id}  {'ready' if i.ready else '-':5}  execs={i.execs}  "
                f"last_active={i.last_active}"
                for i in infos
            ]
            value: object = [asdict(i) for i in infos]
        else:
            health = await client.health(args.pod)
            lines = [f"{health.status}  {health.version}  {' '.join(health.capabilities)}"]
            value = asdict(health)
        if as_json:
            console.json(value)
        for line in [] if as_json else lines:
            console.print(line)
        return 0
    handle = SandboxHandle(args.handle)
    if cmd == "ls":
        entries = sorted(await client.walk(handle, args.root), key=lambda e: e.path)
        if as_json:
            console.json([asdict(e) for e in entries])
        for e in [] if as_json else entries:
            console.print(f"{e.size:>12}  {e.path}")
        return 0
    if cmd == "kill":
        await client.kill(handle)
    elif cmd == "put":
        await _transfer(console, args.remote, client.upload_file, handle, args.remote, args.local)
    elif cmd == "get":
        await _transfer(
            console, args.remote, client.download_to_file, handle, args.remote, args.local
        )
    elif cmd == "rm":
        await (client.rmdir if args.recursive else client.delete)(handle, args.path)
    if as_json:
        console.json({"ok": True})
    return 0


def read_token(path: str | None) -> str | None:
    """The bearer token in ``path`` (surrounding whitespace stripped), or ``None``."""
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().strip() or None


async def main_async(
    reactor: Any, argv: list[str] | None, console: Console, *, interruptible: bool = False
) -> int:
    """
    Parse ``argv``, run the command, and return the exit code; failures become one line on
    ``console.err``. ``interruptible``: Ctrl-C cancels the command (an exec is then killed on
    the host because its stream is dropped) and the exit code is 130.
    """
    args = parse_args(argv)
    failed = EXEC_FAILED if args.command == "exec" else 1
    try:
        client = HttpSandbox(args.url, token=read_token(args.token_file), reactor=reactor)
    except (OSError, ValueError) as e:
        console.error(describe(e))
        return failed
    work: Deferred[int] = Deferred.fromCoroutine(run(client, args, console))
    if interruptible:

        def interrupt(signum: int, frame: object) -> None:
            reactor.callFromThread(work.cancel)

        reactor.callWhenRunning(signal.signal, signal.SIGINT, interrupt)
    try:
        return await work
    except CancelledError:
        console.error("interrupted")
        return 130
    except Exception as e:
        console.error(describe(e))
        return failed
    finally:
        await client.close()


async def _main(reactor: Any, argv: list[str] | None) -> None:
    console = Console(sys.stdout.buffer, sys.stderr)
    raise SystemExit(await main_async(reactor, argv, console, interruptible=True))


MCP_MISSING = "sandboxctl mcp needs the mcp extra: pip install 'sandboxd-client[mcp]'"


def mcp(args: argparse.Namespace, err: TextIO) -> int:
    """``sandboxctl mcp``: serve until the MCP client goes; 1 if the ``mcp`` extra is absent."""
    try:
        from ..mcp_server import run_from_args
    except ImportError as e:
        if e.name is None or not e.name.startswith("mcp"):
            raise
        err.write(f"sandboxctl: {MCP_MISSING} ({e})\n")
        return 1
    return run_from_args(args)


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point: parse ``argv`` (default ``sys.argv[1:]``) and exit.

    ``mcp`` runs the MCP SDK's own event loop in this thread (the reactor gets a thread of
    its own); every other command runs on the reactor here.
    """
    args = parse_args(argv)
    if args.command == "mcp":
        raise SystemExit(mcp(args, sys.stderr))
    react(_main, [argv])
    raise AssertionError("react() returned")  # pragma: no cover
