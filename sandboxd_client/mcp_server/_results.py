"""What the MCP tools answer: structured results, whose JSON schemas the model is shown."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class CreatedSandbox(BaseModel):
    sandbox: str = Field(description="The name to pass to the other tools.")
    workspace: str = Field(
        description="The workspace's absolute path: where commands run, and what file-tool "
        "paths are relative to."
    )
    kept: bool = Field(description="True: the sandbox outlives this session.")


class CommandResult(BaseModel):
    exit_code: int = Field(description="The command's exit code (124 timeout, 127 not found).")
    stdout: str
    stderr: str
    truncated: bool = Field(description="True: stdout or stderr was cut (host cap or ours).")


class FileContent(BaseModel):
    path: str = Field(description="Relative to the workspace.")
    size: int
    content: str
    encoding: Literal["utf-8", "base64"]
    truncated: bool = Field(description="True: only the first bytes are in content.")


class Written(BaseModel):
    path: str = Field(description="Relative to the workspace.")
    bytes: int


class FileEntry(BaseModel):
    path: str = Field(description="Relative to the workspace.")
    size: int


class Listing(BaseModel):
    files: list[FileEntry]
    truncated: bool = Field(description="True: more files exist than are listed.")


class Killed(BaseModel):
    sandbox: str
    killed: bool
