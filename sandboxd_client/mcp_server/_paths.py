"""
One path vocabulary for a model: the paths its commands see.

A sandbox's commands start in its workspace (``run_command``'s working directory; its absolute
path is what ``pwd`` prints there, learnt once at create). A file tool's path is relative to
that directory (``src/app.py``), or absolute under it: either way it names the file a command
reaches by the same string. Any other absolute path (``/src/app.py``, ``/etc/hosts``) is
refused with a hint, never taken as a workspace path, so that a file written by a tool is
never found missing by a command. Paths the tools give back are relative to the workspace.

``HttpSandbox`` itself takes ``/``-rooted workspace paths; ``..`` that climbs out of the
workspace is refused by the host.
"""

from __future__ import annotations


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def to_workspace(path: str, workspace: str) -> str:
    """The ``/``-rooted workspace path (as ``HttpSandbox`` takes it) that ``path`` names.

    ``ValueError`` for an absolute path outside ``workspace``.
    """
    parts = _parts(path)
    if path.startswith("/"):
        top = _parts(workspace)
        if parts[: len(top)] != top:
            hint = "/".join(parts) or "."
            raise ValueError(
                f"{path!r} is outside the workspace; file tools reach only the workspace, "
                f"which is {workspace} (the directory commands run in): give a path relative "
                f"to it, such as {hint!r}, or an absolute path under {workspace}"
            )
        parts = parts[len(top) :]
    return "/" + "/".join(parts)


def shown(path: str) -> str:
    """A ``/``-rooted workspace path as a model is shown it: relative to the workspace
    (``.`` for the workspace itself)."""
    return "/".join(_parts(path)) or "."
