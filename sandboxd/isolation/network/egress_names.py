"""Host names in egress policies: the patterns a list may hold and the name a connection's
first bytes carry, which the egress proxy matches (docs/isolation.rst, "Egress by name").

A pattern is an exact name (``example.com``) or a wildcard (``*.example.com``: any name
below ``example.com``, however deep, never ``example.com`` itself). Names compare in their
ASCII (IDNA) form, without case and without a trailing dot.

:func:`peek_name` reads the name a client's first bytes say it wants: the ``server_name`` of
a TLS ClientHello (no decryption: it travels in clear) or the ``Host`` header of an HTTP/1
request. It answers ``None`` while more bytes are needed, and :data:`NO_NAME` when the bytes
can carry no name (another protocol, a ClientHello without SNI, a malformed one): a policy
by name then refuses the connection.
"""

import re
import struct

MAX_NAME = 253
"""The longest DNS name, in its text form without the trailing dot."""

PEEK_MAX = 16384
"""The most bytes :func:`peek_name` waits for (a ClientHello record's largest size)."""

NO_NAME = ""
"""What :func:`peek_name` answers for bytes that carry no name."""

_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")


def normal_name(text: str) -> str:
    """``text`` as names compare: IDNA ASCII, lower case, no trailing dot; ``ValueError``
    when it is not a host name (an address is not one)."""
    name = text.strip().rstrip(".").lower()
    try:
        name = name.encode("idna").decode("ascii")
    except UnicodeError:
        raise ValueError(f"{text!r} is not a host name") from None
    labels = name.split(".")
    if (
        len(name) > MAX_NAME
        or len(labels) < 2
        or not all(_LABEL.fullmatch(label) for label in labels)
        or labels[-1].isdigit()
    ):
        raise ValueError(f"{text!r} is not a host name")
    return name


def parse_pattern(text: str) -> str:
    """A list's name entry: an exact name or ``*.`` and a name; ``ValueError`` otherwise."""
    stripped = text.strip()
    if stripped.startswith("*."):
        return "*." + normal_name(stripped[2:])
    return normal_name(stripped)


def matches(pattern: str, name: str) -> bool:
    """Whether ``name`` (as :func:`normal_name` gives it) is one ``pattern`` names."""
    if pattern.startswith("*."):
        return name.endswith(pattern[1:])
    return name == pattern


def peek_name(data: bytes) -> str | None:
    """The name the first bytes of a connection ask for (see the module docstring)."""
    if not data:
        return None
    if data[0] == 0x16:
        return _client_hello_name(data)
    return _http_host(data)


def _client_hello_name(data: bytes) -> str | None:
    if len(data) < 5:
        return None
    (length,) = struct.unpack("!H", data[3:5])
    if len(data) < 5 + length:
        return None if 5 + length <= PEEK_MAX + 5 else NO_NAME
    try:
        return _server_name(memoryview(data)[5 : 5 + length])
    except (IndexError, struct.error, ValueError):
        return NO_NAME


def _server_name(hello: memoryview) -> str:
    """The ``server_name`` of a handshake message holding a whole ClientHello."""
    if hello[0] != 0x01:  # ClientHello
        return NO_NAME
    at = 4 + 2 + 32  # handshake header, client version, random
    at += 1 + hello[at]  # session id
    at += 2 + struct.unpack("!H", hello[at : at + 2])[0]  # cipher suites
    at += 1 + hello[at]  # compression methods
    end = at + 2 + struct.unpack("!H", hello[at : at + 2])[0]
    at += 2
    while at + 4 <= end:
        kind, size = struct.unpack("!HH", hello[at : at + 4])
        at += 4
        if kind == 0:  # server_name: a list of (type, length, name)
            names = hello[at : at + size]
            if names[2] == 0:
                (name_length,) = struct.unpack("!H", names[3:5])
                return normal_name(bytes(names[5 : 5 + name_length]).decode("ascii"))
            return NO_NAME
        at += size
    return NO_NAME


def _http_host(data: bytes) -> str | None:
    head, found, _ = data.partition(b"\r\n\r\n")
    if not found:
        return None if len(data) < PEEK_MAX else NO_NAME
    lines = head.split(b"\r\n")
    if len(lines[0].split(b" ")) != 3 or not lines[0].endswith((b"HTTP/1.0", b"HTTP/1.1")):
        return NO_NAME
    hosts = [line[5:].strip() for line in lines[1:] if line[:5].lower() == b"host:"]
    if len(hosts) != 1:  # none, or two that may disagree: no name to trust
        return NO_NAME
    host = hosts[0].decode("ascii", "replace")
    if host.startswith("["):
        return NO_NAME  # an address literal is no name
    try:
        return normal_name(host.rsplit(":", 1)[0] if ":" in host else host)
    except ValueError:
        return NO_NAME
