"""The walk body of the HTTP front (``GET walk``, docs/extensions.rst), whole or written a
part at a time: the very bytes ``json.dumps`` gives, made without an object per entry."""

import os
from collections.abc import Iterable, Iterator
from json.encoder import encode_basestring_ascii

from sandboxd.errors import TooManyEntries

# The walk body

_WALK_ENTRY = '{"path": %s, "size": %d, "version": "%x.%x.%x.%x"}'
"""One entry of the walk body, as ``json.dumps`` writes it (the version of
:func:`sandboxd.core.files.walking.version_of` inlined)."""


def walk_entries(where: str, found: Iterable[tuple[str, os.stat_result]]) -> list[str]:
    """The walk body's entries for the regular files ``found`` in directory ``where``
    (``/``-rooted, ``""`` for the workspace root)."""
    quote = encode_basestring_ascii
    entry = _WALK_ENTRY
    prefix = where + "/"
    return [
        entry
        % (quote(prefix + name), st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        for name, st in found
    ]


WALK_HEAD, WALK_TAIL = b'{"entries": [', b"]}"
"""The walk body around its entries, for a walk written a part at a time."""


_SEPARATOR = ", "
"""Between two entries of the walk body."""


def walk_body(entries: list[str]) -> bytes:
    """The JSON body of ``GET walk``, ``{"entries": [{path, size, version}...]}``: the very
    bytes ``json.dumps`` gives, made without an object or a dict per entry."""
    return b"".join((WALK_HEAD, walk_part(entries, True), WALK_TAIL))


def walk_part(entries: list[str], first: bool) -> bytes:
    """Entries of a walk body written a part at a time: the parts joined are the very bytes of
    :func:`walk_body` (``WALK_HEAD``, the parts, ``WALK_TAIL``)."""
    joined = _SEPARATOR.join(entries)
    return (joined if first or not entries else _SEPARATOR + joined).encode("ascii")


def walk_too_large(most: int) -> TooManyEntries:
    """The error of a walk whose body passes ``most`` bytes (``SANDBOXD_WALK_BYTES_MAX``)."""
    return TooManyEntries(
        f"the walk's body passes {most} bytes (SANDBOXD_WALK_BYTES_MAX): walk a narrower root"
    )


def walk_size(batches: Iterator[list[str]], most: int) -> int:
    """The size in bytes of the walk body of ``batches`` (its entries are ASCII), counted
    as the walk goes, one batch in memory at a time: :func:`walk_too_large` as soon as it
    passes ``most``."""
    size = len(WALK_HEAD) + len(WALK_TAIL) - len(_SEPARATOR)  # no separator before the first
    for batch in batches:
        size += sum(map(len, batch)) + len(_SEPARATOR) * len(batch)
        if size > most:
            raise walk_too_large(most)
    return max(size, len(WALK_HEAD) + len(WALK_TAIL))


def next_walk_part(batches: Iterator[list[str]], budget: int) -> tuple[list[str], bool]:
    """Entries from ``batches`` (a walk's, one directory each) until they pass ``budget``
    characters; and whether the walk is done."""
    part: list[str] = []
    size = 0
    for batch in batches:
        part += batch
        size += sum(map(len, batch))
        if size >= budget:
            return part, False
    return part, True
