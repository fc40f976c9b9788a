"""Workspace paths: the one place where a client's path text becomes path components.

Paths are relative to the workspace root; a leading ``/`` means that root (``a/b`` ≡ ``/a/b``).
``.`` and ``..`` are resolved lexically; a path that climbs above the root, or that holds a NUL
byte, is refused with ``400 BadRequest`` before anything touches the disk. Symlinks are dealt
with by the file operations, which never follow one.
"""

from sandboxd.errors import BadRequest

PATH_MAX = 4096
NAME_MAX = 255

Parts = tuple[str, ...]


def normalise(text: object, field: str = "path") -> Parts:
    """Split a workspace path into its components; ``()`` is the workspace root itself."""
    if not isinstance(text, str):
        raise BadRequest(f"{field}: must be a string")
    if "\0" in text:
        raise BadRequest(f"{field}: contains a NUL byte")
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise BadRequest(f"{field}: not valid Unicode (a lone surrogate)") from None
    if len(text.encode("utf-8", "surrogateescape")) >= PATH_MAX:
        raise BadRequest(f"{field}: longer than {PATH_MAX} bytes")
    parts: list[str] = []
    for part in text.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise BadRequest(f"{field}: {text!r} escapes the workspace")
            parts.pop()
            continue
        if len(part.encode("utf-8", "surrogateescape")) > NAME_MAX:
            raise BadRequest(f"{field}: a component is longer than {NAME_MAX} bytes")
        parts.append(part)
    return tuple(parts)


def display(parts: Parts) -> str:
    """The wire form of a path: ``/``-rooted."""
    return "/" + "/".join(parts)
