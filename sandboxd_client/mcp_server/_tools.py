"""
The MCP tools of ``sandboxctl mcp``: sandboxes as a model uses them, on one ``HttpSandbox``.

Each tool is a thin translation: arguments to one or two client calls (on the reactor thread,
through ``ReactorThread.call``), the result to a structured value. Every failure the client
raises becomes a tool error (``isError``) whose text names it, never a protocol error, so
the model can read it and act (recreate a sandbox, fix a path).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

from attrs import frozen
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from .. import HttpSandbox, SandboxError, SandboxHandle, SandboxSpec, WalkEntry
from ._bridge import ReactorThread
from ._code import add_run_code
from ._inputs import Socks5Proxy
from ._output import LiveText, clip, file_bytes, file_content
from ._paths import shown, to_workspace
from ._results import (
    CommandResult,
    CreatedSandbox,
    FileContent,
    FileEntry,
    Killed,
    Listing,
    Written,
)
from ._sdk import connection_of, lives_across_requests
from ._session import Created, Registry, Sandboxes, UnknownSandbox

T = TypeVar("T")
VERSION = "0.1.0"
STATE_KEY = "sandboxd.sandboxes"

INSTRUCTIONS = """\
Sandboxes on a sandboxd host: each is a private Linux workspace with its own user, memory,
CPU and process limits. Create one with create_sandbox, then run commands and move files in
it by its name (sb1, sb2, ...), which stays valid until kill_sandbox, until the host reaps
the sandbox after a long idle time, or until this session ends (without a session: until this
server stops); pass keep=true to let it outlive the session.

Commands run in the sandbox's workspace, and file tools reach only the workspace: a path is
relative to it (src/app.py) or absolute under it (create_sandbox gives its absolute path), and
names the same file for a command: write src/app.py, then run python3 src/app.py. Any other
absolute path (/src/app.py) is refused by the file tools."""


SandboxName = Annotated[str, Field(description="A sandbox name from create_sandbox (sb1, ...).")]
WorkspacePath = Annotated[
    str,
    Field(
        description="Relative to the workspace, where commands run (src/app.py), or absolute "
        "under it (<workspace>/src/app.py)."
    ),
]
WHERE_COMMANDS_RUN = ["sh", "-c", "pwd"]


@frozen
class Limits:
    """How much of a command's output and of a file a tool result carries."""

    output_bytes: int = 64 << 10
    file_bytes: int = 1 << 20
    listed_files: int = 1000


def describe(e: BaseException) -> str:
    """The text of a tool error: the failure's type and message."""
    if isinstance(e, SandboxError):
        return f"{type(e).__name__}: {e.detail}"
    if isinstance(e, OSError) and e.strerror:
        return f"{type(e).__name__}: {e.strerror}"
    return f"{type(e).__name__}: {e}"


async def tool_call(call: Awaitable[T]) -> T:
    """Await a client call; its failures become tool errors."""
    try:
        return await call
    except (SandboxError, OSError, ValueError, LookupError, NotImplementedError) as e:
        raise ToolError(describe(e)) from e


def session_sandboxes(
    ctx: Context, registry: Registry, kill: Callable[[Sandboxes], Any]
) -> Sandboxes:
    """This session's sandboxes; the first call registers their kill at the session's end.

    A request without a session (2026-07-28 makes a connection per request; or the SDK does
    not say which session a request belongs to) uses the server's own sandboxes, which
    outlive every request and are killed when the server stops.
    """
    connection = connection_of(ctx)
    session = connection if connection is not None and lives_across_requests(connection) else None
    state: dict[str, Any] = session.state if session is not None else registry.shared
    sandboxes = state.get(STATE_KEY)
    if isinstance(sandboxes, Sandboxes):
        return sandboxes
    sandboxes = registry.open()
    state[STATE_KEY] = sandboxes
    if session is not None:
        session.exit_stack.push_async_callback(kill, sandboxes)
    return sandboxes


def build_server(
    client: HttpSandbox,
    bridge: ReactorThread,
    registry: Registry,
    limits: Limits | None = None,
    **settings: Any,
) -> MCPServer:
    """The MCP server whose tools drive ``client`` (running on ``bridge``'s reactor)."""
    limits = limits if limits is not None else Limits()
    mcp = MCPServer("sandboxd", version=VERSION, instructions=INSTRUCTIONS, **settings)

    async def kill_session(sandboxes: Sandboxes) -> None:
        for handle in sandboxes.take_unkept():
            with contextlib.suppress(Exception):  # gone already, or the host is unreachable
                await bridge.call(client.kill, handle)
        registry.close(sandboxes)

    def mine(ctx: Context) -> Sandboxes:
        return session_sandboxes(ctx, registry, kill_session)

    def named(ctx: Context, sandbox: str) -> Created:
        try:
            return mine(ctx).get(sandbox)
        except UnknownSandbox as e:
            raise ToolError(describe(e)) from None

    def place(created: Created, path: str) -> str:
        try:
            return to_workspace(path, created.workspace)
        except ValueError as e:
            raise ToolError(describe(e)) from None

    async def workspace_of(handle: SandboxHandle) -> str:
        """Where the new sandbox's commands run; a sandbox whose commands cannot say is
        killed (the model never learnt its name)."""
        try:
            ran = await tool_call(bridge.call(client.exec, handle, WHERE_COMMANDS_RUN))
            if ran.exit_code != 0 or not ran.stdout.startswith(b"/"):
                raise ToolError(
                    f"the new sandbox's commands cannot run: {clip(ran.stderr, 500)[0]}"
                )
        except BaseException:
            with contextlib.suppress(Exception):
                await bridge.call(client.kill, handle)
            raise
        return ran.stdout.decode("utf-8", "surrogateescape").rstrip("\n")

    @mcp.tool(
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
        description=(
            "Create a sandbox: a fresh, empty Linux workspace with its own user and cgroup "
            "(memory, CPU and process limits). Takes milliseconds; it holds a user id and "
            "disk on the host until killed, and is killed when this session (or without one, "
            "this server) ends unless keep is true. network: 'none' (loopback only), "
            "'egress' (outbound internet, never the host or other sandboxes) or 'host'; "
            "omitted means the host's default. allow_out and deny_out (egress only): "
            "addresses, CIDRs and host names (api.example.com, *.example.com) it may reach, and "
            "may not (deny wins; no allow_out: all the "
            "host permits). rules (egress only): {host: {header: value}}, headers the host sets "
            "on the sandbox's plain HTTP requests to that host (api.example.com, "
            "*.example.com); the sandbox never sees the values. socks5 (egress only): a "
            "SOCKS5 proxy all its TCP leaves through. "
            "item_id restores a saved workspace of that name first (slower: a copy)."
        ),
    )
    async def create_sandbox(
        ctx: Context,
        network: Annotated[
            Literal["none", "egress", "host"] | None, Field(description="Network mode.")
        ] = None,
        item_id: Annotated[
            str | None, Field(description="Restore this saved workspace (archive item).")
        ] = None,
        keep: Annotated[bool, Field(description="Keep it after this session ends.")] = False,
        allow_out: Annotated[
            list[str] | None, Field(description="egress: only these addresses/CIDRs/host names.")
        ] = None,
        deny_out: Annotated[
            list[str] | None, Field(description="egress: never these addresses/CIDRs/host names.")
        ] = None,
        rules: Annotated[
            dict[str, dict[str, str]] | None,
            Field(description="egress: headers set per host, {host: {header: value}}."),
        ] = None,
        socks5: Annotated[Socks5Proxy | None, Field(description="egress: its own proxy.")] = None,
    ) -> CreatedSandbox:
        spec = SandboxSpec(
            item_id=item_id,
            network=network,
            allow_out=allow_out,
            deny_out=deny_out or (),
            rules=rules or {},
            socks5=None if socks5 is None else socks5.to_socks5(),
        )
        handle = await tool_call(bridge.call(client.create, spec))
        workspace = await workspace_of(handle)
        name = mine(ctx).add(handle, keep, workspace)
        return CreatedSandbox(sandbox=name, workspace=workspace, kept=keep)

    @mcp.tool(
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True),
        description=(
            "Run a shell command (sh -c) in a sandbox and wait for it to exit. It runs in the "
            "workspace (or cwd, a workspace path), so the file tools' relative paths work "
            "as they are. "
            "Output streams as progress notifications while it runs; the result has the exit "
            f"code and stdout and stderr, each cut to {limits.output_bytes // 1024} KiB "
            "(beginning and end kept, truncated marked). A non-zero exit is a result, not an "
            "error. Costs the command's own time, bounded by timeout (seconds, capped by the "
            "host; exit code 124 when it fires). No terminal; stdin is empty unless given."
        ),
    )
    async def run_command(
        ctx: Context,
        sandbox: SandboxName,
        command: Annotated[str, Field(description="The command line, run with sh -c.")],
        cwd: Annotated[
            str | None,
            Field(description="Working directory (workspace path); default the workspace."),
        ] = None,
        env: Annotated[
            dict[str, str] | None, Field(description="Extra environment variables.")
        ] = None,
        timeout: Annotated[
            float | None, Field(gt=0, description="Seconds before the command is killed.")
        ] = None,
        stdin: Annotated[str | None, Field(description="Text fed to the command's stdin.")] = None,
    ) -> CommandResult:
        created = named(ctx, sandbox)
        directory = None if cwd is None else place(created, cwd)
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[bytes] = asyncio.Queue()
        on_output = bridge.to_loop(loop, chunks.put_nowait)
        run = asyncio.ensure_future(
            bridge.call(
                client.exec,
                created.handle,
                ["sh", "-c", command],
                on_output=on_output,
                env=env,
                cwd=directory,
                timeout=timeout,
                stdin=None if stdin is None else stdin.encode("utf-8"),
            )
        )
        live, streamed = LiveText(), 0
        try:
            async for chunk in _until_done(run, chunks):
                streamed += len(chunk)
                await ctx.report_progress(streamed, None, live.feed(chunk))
            result = await tool_call(run)
        finally:
            run.cancel()
        stdout, cut_out = clip(result.stdout, limits.output_bytes)
        stderr, cut_err = clip(result.stderr, limits.output_bytes)
        truncated = result.truncated or cut_out or cut_err
        return CommandResult(
            exit_code=result.exit_code, stdout=stdout, stderr=stderr, truncated=truncated
        )

    @mcp.tool(
        annotations=ToolAnnotations(read_only_hint=True),
        description=(
            "Read a file from a sandbox's workspace. UTF-8 text comes back as text, anything "
            f"else as base64; at most {limits.file_bytes // 1024} KiB (truncated marked, size "
            "is the whole file's). Cheap: one read on the host."
        ),
    )
    async def read_file(ctx: Context, sandbox: SandboxName, path: WorkspacePath) -> FileContent:
        created = named(ctx, sandbox)
        where = place(created, path)
        data = await tool_call(bridge.call(client.download, created.handle, where))
        kept = data[: limits.file_bytes]
        content, encoding = file_content(kept)
        return FileContent(
            path=shown(where),
            size=len(data),
            content=content,
            encoding=encoding,  # type: ignore[arg-type]
            truncated=len(kept) < len(data),
        )

    @mcp.tool(
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True
        ),
        description=(
            "Write a file in a sandbox's workspace, creating parent directories and replacing "
            "any file there. content is text (encoding utf-8, the default) or base64 of the "
            "bytes (encoding base64). Cheap: one write on the host."
        ),
    )
    async def write_file(
        ctx: Context,
        sandbox: SandboxName,
        path: WorkspacePath,
        content: Annotated[str, Field(description="The file's content.")],
        encoding: Annotated[
            Literal["utf-8", "base64"], Field(description="How content is encoded.")
        ] = "utf-8",
    ) -> Written:
        created = named(ctx, sandbox)
        where = place(created, path)
        try:
            data = file_bytes(content, encoding)
        except ValueError as e:
            raise ToolError(describe(e)) from None
        await tool_call(bridge.call(client.upload, created.handle, where, data))
        return Written(path=shown(where), bytes=len(data))

    @mcp.tool(
        annotations=ToolAnnotations(read_only_hint=True),
        description=(
            "List the regular files under a directory of a sandbox's workspace, recursively, "
            f"with their sizes and paths relative to the workspace (at most "
            f"{limits.listed_files}, sorted by path; truncated marked). Costs a walk of that "
            "tree on the host: list a subdirectory of a big tree rather than all of it."
        ),
    )
    async def list_files(
        ctx: Context,
        sandbox: SandboxName,
        root: Annotated[
            str, Field(description="The directory to list (workspace path); default all of it.")
        ] = ".",
    ) -> Listing:
        created = named(ctx, sandbox)
        where = place(created, root)
        walk: Awaitable[list[WalkEntry]] = bridge.call(client.walk, created.handle, where)
        entries = sorted(await tool_call(walk), key=lambda e: e.path)
        listed = entries[: limits.listed_files]
        return Listing(
            files=[FileEntry(path=shown(e.path), size=e.size) for e in listed],
            truncated=len(listed) < len(entries),
        )

    @mcp.tool(
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True),
        description=(
            "Kill a sandbox: stop every process in it and delete its workspace, for good. "
            "Frees its share of the host at once (a sandbox is killed anyway when this "
            "session ends, unless it was created with keep)."
        ),
    )
    async def kill_sandbox(ctx: Context, sandbox: SandboxName) -> Killed:
        created = named(ctx, sandbox)
        await tool_call(bridge.call(client.kill, created.handle))
        mine(ctx).forget(sandbox)
        return Killed(sandbox=sandbox, killed=True)

    add_run_code(mcp, client, bridge, named, tool_call, limits.output_bytes)
    return mcp


async def _until_done(
    run: asyncio.Future[Any], chunks: asyncio.Queue[bytes]
) -> AsyncIterator[bytes]:
    """Each batch of ``chunks`` (joined) as it arrives, until ``run`` is done and every chunk
    queued before its end was given out."""
    while True:
        waiting = asyncio.ensure_future(chunks.get())
        await asyncio.wait({run, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done():
            waiting.cancel()
            break
        batch = [waiting.result()]
        while not chunks.empty():
            batch.append(chunks.get_nowait())
        yield b"".join(batch)
    rest = []
    while not chunks.empty():
        rest.append(chunks.get_nowait())
    if rest:
        yield b"".join(rest)
