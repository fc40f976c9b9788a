"""The MCP tool ``run_code``: a cell of Python (or bash) in a sandbox's interpreter, which
keeps its variables between calls (docs/extensions.rst, "Contexts")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

from .. import ContextNotFound, HttpSandbox, SandboxHandle
from ._bridge import ReactorThread
from ._output import clip
from ._session import Created


class CodeResult(BaseModel):
    text: str | None = Field(description="The value of the cell's last expression, as text.")
    stdout: str
    stderr: str
    error: str | None = Field(description="The exception the cell raised, with its traceback.")
    images: int = Field(description="How many images (charts) the cell displayed.")
    truncated: bool = Field(description="True: stdout or stderr was cut.")


def add_run_code(
    mcp: MCPServer,
    client: HttpSandbox,
    bridge: ReactorThread,
    named: Callable[[Context, str], Created],
    tool_call: Callable[[Any], Any],
    output_bytes: int,
) -> None:
    """Register ``run_code``: each sandbox's cells run in one context per language, made at
    its first."""
    contexts: dict[tuple[SandboxHandle, str], str] = {}

    async def context_of(handle: SandboxHandle, language: str) -> str:
        if (handle, language) not in contexts:
            made = await tool_call(bridge.call(client.create_context, handle, language))
            contexts[handle, language] = made.id
        return contexts[handle, language]

    @mcp.tool(
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True),
        description=(
            "Run Python code in a sandbox's interpreter, like a notebook cell: variables, "
            "imports and the working directory (the workspace) stay for the next call. The "
            "result has the value of the last expression as text, stdout, stderr, and the "
            "exception with its traceback if one was raised (a result, not a tool error). "
            "numpy, pandas and matplotlib are there where the host has them. The first call "
            "in a sandbox starts its interpreter (about a second). timeout (seconds) "
            "interrupts the cell. language bash runs the code in a bash shell of the sandbox "
            "that keeps its variables and working directory (a non-zero exit status is the "
            "error)."
        ),
    )
    async def run_code(
        ctx: Context,
        sandbox: Annotated[str, Field(description="A sandbox name from create_sandbox.")],
        code: Annotated[str, Field(description="The code to run (Python, or bash).")],
        timeout: Annotated[
            float | None, Field(gt=0, description="Seconds before the cell is interrupted.")
        ] = None,
        language: Annotated[
            Literal["python", "bash"], Field(description="The interpreter: python or bash.")
        ] = "python",
    ) -> CodeResult:
        handle = named(ctx, sandbox).handle
        context = await context_of(handle, language)
        try:
            ran = await bridge.call(client.run_code, handle, context, code, timeout=timeout)
        except ContextNotFound:  # removed by another client: a fresh one, once
            contexts.pop((handle, language), None)
            context = await context_of(handle, language)
            ran = await tool_call(
                bridge.call(client.run_code, handle, context, code, timeout=timeout)
            )
        stdout, cut_out = clip("".join(ran.stdout).encode(), output_bytes)
        stderr, cut_err = clip("".join(ran.stderr).encode(), output_bytes)
        error = None
        if ran.error is not None:
            name, value = ran.error.name, ran.error.value
            said = f"{name}: {value}" if name else f"exit status {value}"  # bash's: no name
            error = "\n".join([said, *ran.error.traceback])
        images = sum(1 for r in ran.results if any(k.startswith("image/") for k in r))
        return CodeResult(
            text=ran.text,
            stdout=stdout,
            stderr=stderr,
            error=error,
            images=images,
            truncated=cut_out or cut_err,
        )
