"""
``sandboxctl``: the sandboxd client at a terminal (docs/client.rst, "sandboxctl").

    sandboxctl [--url URL] [--token-file FILE] [--json] COMMAND ...

    create [--image I] [--env K=V]... [--port P]... [--item-id ID] [--network M]
           [--allow ADDR|HOST]... [--deny ADDR|HOST]...
           [--socks5 ADDR:PORT [--socks5-user U] [--socks5-tls]
            [--socks5-tls-server-name NAME] [--socks5-ca-file F]
            [--socks5-password-env VAR | --socks5-password-file F]]
           [--template T]            print a new handle
    fork HANDLE                      a new sandbox with a copy of HANDLE's files: its handle
    kill HANDLE
    exec HANDLE [--env K=V]... [--cwd D] [--timeout S] [-i] [--] CMD...
                                     stdin is streamed to CMD as it comes (EOF at its end)
                                     when it is a pipe or a file, or with -i
    put HANDLE LOCAL REMOTE          upload a file, or a directory's whole tree (modes,
                                     symlinks, empty directories); LOCAL - : a tar on stdin
    get HANDLE REMOTE LOCAL          download a file, or a directory's whole tree;
                                     LOCAL - : the tree as a tar on stdout
    ls HANDLE [ROOT]                 every file under ROOT (default /)
    rm HANDLE PATH [-r]              delete a file (-r: a directory and its contents)
    list [--pod URL]                 live sandboxes (operators)
    health [--pod URL]
    run -d, logs [-f], ps, signal, watch   background processes and workspace watch
                                     (see sandboxd_client.cli._processes)
    template import NAME FILE | ls | rm NAME  [--pod URL]
                                     a replica's templates (sandboxd_client.cli._templates)
    run-code HANDLE [CODE]           Python in the sandbox's interpreter, state kept between
                                     calls (see sandboxd_client.cli._code)
    mcp [--transport stdio|http] [--host H] [--port P] [--path /mcp]
                                     a Model Context Protocol server (needs the [mcp] extra)

HANDLE is what ``create`` prints, or a sandbox id as ``list`` prints it (on ``--url``).
``exec`` streams the command's stdout live to stdout and its stderr to stderr, and exits
with the command's exit code, like ``docker exec``; its own failures exit 125. The command
starts at the first word after HANDLE that is not an option of ``exec`` (``exec H ls -la``);
``--`` marks it explicitly. ``--cwd`` is relative to the workspace (``/`` is its top).
Every other failure prints one line on stderr and exits 1; stdout carries only data, and a
note such as "no sandboxes" goes to stderr. ``--url`` defaults to ``$SANDBOXD_URL`` (else
http://127.0.0.1:8080), ``--token-file`` to ``$SANDBOXD_TOKEN_FILE`` (a ``401`` says which
setting to change), ``--cacert`` to ``$SANDBOXD_CA_FILE`` (the CA an ``https`` URL is
verified against instead of the system's). ``--json`` prints
machine-readable results on stdout. On a terminal, large transfers show bytes, rate and ETA.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any, NoReturn, TextIO

from attrs import asdict
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import react

from .. import HttpSandbox, SandboxSpec
from .._types import SandboxHandle
from . import _code, _processes, _shell, _templates
from ._console import Console, describe
from ._exec import EXEC_FAILED, _exec
from ._files import _get, _put
from ._handle import resolve_handle
from ._parser import build_parser, parse_args
from ._rules import rules_of
from ._socks5 import socks5_of

__all__ = ["Console", "build_parser", "main_async", "parse_args", "run"]


async def run(client: HttpSandbox, args: argparse.Namespace, console: Console) -> int:
    """Carry out one parsed command; return the exit code (exceptions are the caller's)."""
    cmd, as_json = args.command, args.json
    if cmd == "exec":
        return await _exec(client, args, console)
    if cmd in _processes.COMMANDS:
        return await _processes.run(client, args, console)
    if cmd in _shell.COMMANDS:
        return await _shell.run(client, args, console)
    if cmd in _templates.COMMANDS:
        return await _templates.run(client, args, console)
    if cmd in _code.COMMANDS:
        return await _code.run(client, args, console)
    if cmd == "create":
        spec = SandboxSpec(
            args.image,
            dict(args.env),
            tuple(args.port),
            args.item_id,
            args.network,
            allow_out=args.allow,
            deny_out=args.deny,
            rules=rules_of(args.rule, args.rule_env, args.rules_file, os.environ),
            socks5=socks5_of(
                args.socks5,
                args.socks5_user,
                args.socks5_password_env,
                args.socks5_password_file,
                args.socks5_tls,
                os.environ,
                args.socks5_tls_server_name,
                args.socks5_ca_file,
            ),
            template=args.template,
        )
        return _print_handle(await client.create(spec), as_json, console)
    if cmd in ("list", "health"):
        if cmd == "list":
            infos = await client.list_sandboxes(args.pod)
            now = time.time()
            lines = [
                f"{i.remote_id}  {'ready' if i.ready else '-':5}  execs={i.execs:<4}  "
                f"created {ago(now, i.created)}  active {ago(now, i.last_active)}"
                for i in infos
            ]
            if not infos and not as_json:
                console.note(f"no sandboxes on {args.pod or args.url}")
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
    handle = resolve_handle(args.handle, args.url)
    if cmd == "fork":
        return _print_handle(await client.fork(handle), as_json, console)
    if cmd == "ls":
        entries = sorted(await client.walk(handle, args.root), key=lambda e: e.path)
        if not entries and not as_json:
            console.note(f"no files under {args.root}")
        if as_json:
            console.json([asdict(e) for e in entries])
        for e in [] if as_json else entries:
            console.print(f"{e.size:>12}  {e.path}")
        return 0
    if cmd == "kill":
        await client.kill(handle)
    elif cmd == "put":
        await _put(client, handle, args, console)
    elif cmd == "get":
        await _get(client, handle, args, console)
    else:  # rm, the last of the commands on a sandbox's files
        await (client.rmdir if args.recursive else client.delete)(handle, args.path)
    if as_json:
        console.json({"ok": True})
    return 0


def _print_handle(handle: SandboxHandle, as_json: bool, console: Console) -> int:
    """A new sandbox's handle on stdout (``{"handle": ...}`` with ``--json``)."""
    if as_json:
        console.json({"handle": handle.id})
    else:
        console.print(handle.id)
    return 0


def ago(now: float, then: object) -> str:
    """``42s ago``, ``5m ago``, ``3h ago``, ``2d ago``: the largest unit, rounded down
    (``-`` for a time the service did not give as a number)."""
    if isinstance(then, bool) or not isinstance(then, int | float):
        return "-"
    seconds = max(0.0, now - then)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def read_token(path: str | None) -> str | None:
    """The bearer token in ``path`` (surrounding whitespace stripped), or ``None``."""
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().strip() or None


def token_hint(token_file: str | None) -> str:
    """What to change after a ``401``: the setting that carries the token, and what it held."""
    if not token_file:
        return "no token was sent: name its file with --token-file or SANDBOXD_TOKEN_FILE"
    return (
        f"the token in {token_file} was refused: --token-file or SANDBOXD_TOKEN_FILE must name"
        " the file holding the daemon's token (its SANDBOXD_TOKEN_FILE)"
    )


async def main_async(
    reactor: Any, argv: list[str] | None, console: Console, *, interruptible: bool = False
) -> int:
    """
    Parse ``argv``, run the command, and return the exit code; failures become one line on
    ``console.err``. ``interruptible``: Ctrl-C (SIGINT) or SIGTERM cancels the command (an
    exec is then killed on the host because its stream is dropped) and the exit code is 130 or
    143, never a transport error from a reactor stopped under the command.
    """
    args = parse_args(argv)
    console.reactor = reactor
    failed = EXEC_FAILED if args.command == "exec" else 1
    try:
        client = HttpSandbox(
            args.url,
            token=read_token(args.token_file),
            reactor=reactor,
            ca_file=args.cacert or None,
        )
    except (OSError, ValueError) as e:
        console.error(describe(e))
        return failed
    work: Deferred[int] = Deferred.fromCoroutine(run(client, args, console))
    stopped_by = [signal.SIGINT]
    if interruptible:

        def interrupt(signum: int, frame: object) -> None:
            stopped_by[0] = signal.Signals(signum)
            reactor.callFromThread(work.cancel)

        for signum in (signal.SIGINT, signal.SIGTERM):
            reactor.callWhenRunning(signal.signal, signum, interrupt)
    try:
        return await work
    except CancelledError:
        console.error("interrupted" if stopped_by[0] == signal.SIGINT else "terminated")
        return 128 + stopped_by[0]
    except PermissionError as e:
        console.error(f"{describe(e)} ({token_hint(args.token_file)})")
        return failed
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


def main_parsed(args: argparse.Namespace, argv: list[str] | None) -> NoReturn:
    """Run the parsed command line ``args`` (of ``argv``) and exit.

    ``mcp`` runs the MCP SDK's own event loop in this thread (the reactor gets a thread of
    its own); every other command runs on the reactor here.
    """
    if args.command == "mcp":
        raise SystemExit(mcp(args, sys.stderr))
    react(_main, [argv])
    raise AssertionError("react() returned")  # pragma: no cover
