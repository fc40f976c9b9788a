"""
``sandboxctl``: the sandboxd client at a terminal (docs/client.rst, "sandboxctl").

    sandboxctl [--url URL] [--token-file FILE] [--json] COMMAND ...

    create [--image I] [--env K=V]... [--port P]... [--item-id ID] [--network M]
           [--allow ADDR]... [--deny ADDR]...
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
import functools
import json
import os
import signal
import sys
import time
from typing import Any, BinaryIO, NoReturn, TextIO

from attrs import asdict
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import react

from .. import HttpSandbox, SandboxError, SandboxSpec
from .._types import OutputChunk, SandboxHandle
from . import _code, _processes, _shell, _stdin, _templates, _trees
from ._handle import resolve_handle
from ._parser import build_parser, parse_args
from ._progress import MIB, ProgressBar

EXEC_FAILED = 125

__all__ = ["Console", "build_parser", "main_async", "parse_args", "run"]


def describe(e: BaseException) -> str:
    """One line naming the failure for a person."""
    if isinstance(e, SandboxError):
        return f"{type(e).__name__}: {e.detail}"
    if isinstance(e, OSError) and e.strerror:
        return f"{type(e).__name__}: {e.strerror}" + (f": {e.filename}" if e.filename else "")
    return f"{type(e).__name__}: {e}"


class Console:
    """Where ``run`` writes: binary stdout (command output, results) and text stderr."""

    def __init__(
        self,
        out: BinaryIO,
        err: TextIO,
        *,
        tty: bool | None = None,
        stdin: BinaryIO | None = None,
    ) -> None:
        self.out = out
        self.err = err
        self.tty = err.isatty() if tty is None else tty
        self._stdin = stdin
        self.reactor: Any = None
        """The reactor stdin is read on (``main_async``'s; the global one when unset)."""

    @property
    def stdin(self) -> BinaryIO:
        """Where ``put -`` and ``exec -i`` read (this process's stdin unless given)."""
        return sys.stdin.buffer if self._stdin is None else self._stdin

    def note(self, message: str) -> None:
        """A remark for the person (``no sandboxes``) on stderr: stdout keeps only data."""
        self.err.write(f"{message}\n")
        self.err.flush()

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


async def _transfer(console: Console, label: str, call: Any, *args: Any) -> Any:
    """Run an upload/download, drawing a progress bar when ``console`` wants one."""
    bar: list[ProgressBar | None] = []

    def on_progress(done: int, total: int | None) -> None:
        if not bar:
            bar.append(console.progress(label, total))
        if bar[0] is not None:
            bar[0].update(done, total)

    try:
        return await call(*args, on_progress=on_progress)
    finally:
        if bar and bar[0] is not None:
            bar[0].finish()


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


async def _tree_capable(client: HttpSandbox, handle: SandboxHandle, dash: str | None) -> bool:
    """Whether the sandbox's replica takes trees as tar streams (``files.tree``); with
    ``dash`` (a ``-`` operand that needs them), ``ValueError`` saying so when it does not."""
    capable = _trees.TREE_CAPABILITY in await client.capabilities(handle)
    if not capable and dash is not None:
        raise ValueError(f"{dash}: this sandboxd has no tar streams (files.tree): upgrade it")
    return capable


async def _put(
    client: HttpSandbox, handle: SandboxHandle, args: argparse.Namespace, console: Console
) -> None:
    """A file; a directory's tree (one tar stream; per file on an older daemon); or, for
    ``-``, the tar stream on stdin (as ``docker cp - …``)."""
    remote = args.remote
    if args.local == "-":
        await _tree_capable(client, handle, "put -")
        await _transfer(console, remote, client.upload_tar, handle, remote, console.stdin)
    elif not os.path.isdir(args.local):
        await _transfer(console, remote, client.upload_file, handle, remote, args.local)
    elif await _tree_capable(client, handle, None):
        await _transfer(console, remote, client.upload_tree, handle, remote, args.local)
    else:
        put = functools.partial(_trees.put_tree, client, handle, args.local, remote)
        await _transfer(console, remote, put)


async def _get(
    client: HttpSandbox, handle: SandboxHandle, args: argparse.Namespace, console: Console
) -> None:
    """A file; a directory's tree (one tar stream; per file on an older daemon); or, for
    ``-``, the tree (or file) as a tar stream on stdout (as ``docker cp … -``)."""
    remote, local = args.remote, args.local
    if local == "-":
        await _tree_capable(client, handle, "get … -")
        await client.download_tar(handle, remote, console.out)
        return

    def one_file() -> Any:
        return _transfer(console, remote, client.download_to_file, handle, remote, local)

    if await client.size(handle, remote) is not None:
        await one_file()
    elif await _tree_capable(client, handle, None):
        await _transfer(console, remote, client.download_tree, handle, remote, local)
    else:
        get = functools.partial(
            _trees.get_tree, client, handle, remote, local, download_file=one_file
        )
        await _transfer(console, remote, get)


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
