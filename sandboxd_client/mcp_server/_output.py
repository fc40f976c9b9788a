"""What a model is shown of a command's output and of a file: text, bounded, marked when cut."""

from __future__ import annotations

import base64
import codecs

OMITTED = "\n[... {count} bytes omitted ...]\n"


def clip(data: bytes, limit: int) -> tuple[str, bool]:
    """
    ``data`` as text (UTF-8, undecodable bytes replaced) and whether it was cut.

    Past ``limit`` bytes, the first and the last half of ``limit`` are kept (a command's
    beginning and its final error are what a model most often needs), with a line saying how
    many bytes were left out between them.
    """
    if len(data) <= limit:
        return data.decode("utf-8", "replace"), False
    half = limit // 2
    head, tail = data[:half], data[len(data) - half :]
    count = len(data) - len(head) - len(tail)
    text = head.decode("utf-8", "replace") + OMITTED.format(count=count)
    return text + tail.decode("utf-8", "replace"), True


def file_content(data: bytes) -> tuple[str, str]:
    """``(content, encoding)``: the text of a UTF-8 file, else base64 of its bytes."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def file_bytes(content: str, encoding: str) -> bytes:
    """The bytes a ``write_file`` call means; ``ValueError`` for bad base64 or encoding."""
    if encoding == "utf-8":
        return content.encode("utf-8")
    if encoding == "base64":
        return base64.b64decode(content.encode("ascii"), validate=True)
    raise ValueError(f"encoding must be 'utf-8' or 'base64', not {encoding!r}")


class LiveText:
    """Decodes a command's live output chunk by chunk (a character split between two chunks
    is decoded whole, with the second)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, chunk: bytes) -> str:
        return self._decoder.decode(chunk)
