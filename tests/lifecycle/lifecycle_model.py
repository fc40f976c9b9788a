"""The model the state machine checks the daemon against: what each call must answer.

A workspace is a map of paths (tuples of components, ``()`` the root) to their content: bytes
for a regular file, ``None`` for a directory. Each operation returns the answer the wire
contract (docs/contract.rst) and ``sandboxd.core.files.workspace`` give for it, and changes the
workspace only when the call succeeds: ``(status, wire error type or None)``.
"""

from __future__ import annotations

from typing import Literal

import attrs

Parts = tuple[str, ...]
Answer = tuple[int, str | None]
Kind = Literal["file", "dir", "missing"]

OK: Answer = (204, None)
BAD: Answer = (400, "BadRequest")
NOT_FOUND: Answer = (404, "FileNotFoundError")


def render(parts: Parts) -> str:
    """The wire form of a path, ``/``-rooted (as walk answers)."""
    return "/" + "/".join(parts)


def strictly_under(inner: Parts, outer: Parts) -> bool:
    return len(inner) > len(outer) and inner[: len(outer)] == outer


@attrs.define
class Workspace:
    """The expected files and directories of one sandbox."""

    entries: dict[Parts, bytes | None] = attrs.field(factory=dict)

    def kind(self, parts: Parts) -> Kind:
        """What the path is, following the lookup the daemon does one component at a time."""
        if not parts:
            return "dir"
        for i in range(1, len(parts)):
            if self.entries.get(parts[:i], b"") is not None:
                return "missing"  # a prefix is a file (ENOTDIR) or is missing (ENOENT)
        if parts not in self.entries:
            return "missing"
        return "dir" if self.entries[parts] is None else "file"

    def parent_blocked(self, parts: Parts) -> bool:
        """Whether a strict prefix is a regular file: ``mkdir -p`` of the parents fails."""
        return any(isinstance(self.entries.get(parts[:i]), bytes) for i in range(1, len(parts)))

    def files(self) -> dict[Parts, bytes]:
        return {p: v for p, v in self.entries.items() if v is not None}

    def dirs(self) -> set[Parts]:
        return {p for p, v in self.entries.items() if v is None}

    def _make_parents(self, parts: Parts) -> None:
        for i in range(1, len(parts)):
            self.entries[parts[:i]] = None

    def _remove_tree(self, parts: Parts) -> None:
        for p in [p for p in self.entries if p == parts or strictly_under(p, parts)]:
            del self.entries[p]

    # The file calls

    def upload(self, parts: Parts, data: bytes) -> Answer:
        if not parts:
            return BAD
        if self.parent_blocked(parts):
            return NOT_FOUND
        if self.kind(parts) == "dir":
            return BAD
        self._make_parents(parts)
        self.entries[parts] = data
        return OK

    def download(self, parts: Parts) -> tuple[Answer, bytes | None]:
        kind = self.kind(parts)
        if kind == "file":
            return (200, None), self.entries[parts]
        if kind == "dir":
            return BAD, None
        return NOT_FOUND, None

    def delete(self, parts: Parts) -> Answer:
        if not parts:
            return BAD
        kind = self.kind(parts)
        if kind == "missing":
            return NOT_FOUND
        if kind == "dir":
            return BAD
        del self.entries[parts]
        return OK

    def mkdir(self, parts: Parts) -> Answer:
        if not parts:
            return OK
        if self.parent_blocked(parts):
            return NOT_FOUND
        if self.kind(parts) == "file":
            return BAD
        self._make_parents(parts)
        self.entries[parts] = None
        return OK

    def rmdir(self, parts: Parts) -> Answer:
        if not parts:
            return BAD
        kind = self.kind(parts)
        if kind == "missing":
            return NOT_FOUND
        if kind == "file":
            return BAD
        self._remove_tree(parts)
        return OK

    def rename(self, source: Parts, target: Parts) -> Answer:
        if not source or not target:
            return BAD
        if strictly_under(target, source) or strictly_under(source, target):
            return BAD
        if self.kind(source) == "missing":
            return NOT_FOUND
        if self.parent_blocked(target):
            return NOT_FOUND
        if source == target:
            return OK
        moved = {
            target + p[len(source) :]: v
            for p, v in self.entries.items()
            if p == source or strictly_under(p, source)
        }
        self._remove_tree(source)
        self._make_parents(target)
        self._remove_tree(target)
        self.entries.update(moved)
        return OK

    def exists(self, parts: Parts) -> bool:
        return self.kind(parts) != "missing"

    def size(self, parts: Parts) -> int | None:
        if self.kind(parts) != "file":
            return None
        data = self.entries[parts]
        assert data is not None
        return len(data)

    def walk(self, root: Parts) -> dict[str, int]:
        """``{path: size}`` of every regular file under ``root`` (the file itself if one)."""
        kind = self.kind(root)
        if kind == "missing":
            return {}
        if kind == "file":
            return {render(root): len(self.entries[root] or b"")}
        return {
            render(p): len(v)
            for p, v in self.files().items()
            if p == root or strictly_under(p, root)
        }

    # Commands that touch files (``sh`` redirections, ``cat``)

    def shell_write(self, parts: Parts, data: bytes) -> bool:
        """``printf > path`` from the workspace: succeeds when the parent is a directory."""
        if not parts or self.kind(parts[:-1]) != "dir" or self.kind(parts) == "dir":
            return False
        self.entries[parts] = data
        return True


@attrs.define
class SandboxModel:
    """What one sandbox should be."""

    workspace: Workspace = attrs.field(factory=Workspace)
    ready: bool = False
    env: dict[str, str] = attrs.field(factory=dict)
    background: bool = False
    """A detached process was left running in it (kernel variant: kill must sweep it)."""
    versions: dict[str, str] = attrs.field(factory=dict)
    """Last version seen by walk for each path."""
    rewritten: set[str] = attrs.field(factory=set)
    """Paths replaced by an upload since the last walk: their version must have changed."""
