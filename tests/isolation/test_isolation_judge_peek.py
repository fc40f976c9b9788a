"""The egress judge (``sandboxd-judge``, in C) reads the same name from a connection's first
bytes as the proxy's :func:`~sandboxd.isolation.network.egress_names.peek_name` does: both are
given the same generated HTTP requests, TLS ClientHellos (whole, cut short, with fields
corrupted) and arbitrary bytes, and must answer alike (a name, more bytes needed, or none)."""

import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxd.isolation.exec.helper_build import JUDGE, build, find_compiler
from sandboxd.isolation.network.egress_names import NO_NAME, PEEK_MAX, peek_name
from tests.isolation.test_isolation_egress_names import client_hello

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no C compiler here")

EXAMPLES = 300


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("judge") / "sandboxd-judge"
    assert build(target, program=JUDGE)
    return target


def c_peek(judge: Path, data: bytes) -> str | None:
    """The C judge's answer, as ``peek_name`` gives it."""
    done = subprocess.run([str(judge), "peek"], input=data, capture_output=True, check=True)
    answer = done.stdout.decode()
    if answer == "more\n":
        return None
    if answer == "none\n":
        return NO_NAME
    assert answer.startswith("name ") and answer.endswith("\n"), answer
    return answer[5:-1]


def same(judge: Path, data: bytes) -> None:
    assert c_peek(judge, data) == peek_name(data[: PEEK_MAX + 5]), data


ODD_BYTES = [b"-", b".", b"..", b":", b"[", b"]", b" ", b"\t", b"\x0b", b"\x0c", b"\x1c"]
ODD_BYTES += [b"\x1f", b"\n", b"\r", b"\x00", b"\x80", b"\xff", b"\xc3\xa9", b"8080", b"x" * 64]
LABELS = [b"example", b"com", b"a", b"Z", b"0", b"9", b"xn--bcher-kva", b"a-b", b"-a", b"x" * 63]
VALID_NAMES = st.lists(st.sampled_from(LABELS), min_size=2, max_size=4).map(b".".join)
RARELY = st.sampled_from([False, False, False, True])
"""True one time in four (hypothesis leans to the first of a list)."""


@st.composite
def name_bytes(draw: st.DrawFn) -> bytes:
    """Mostly names, or nearly (an odd byte put in, whitespace around, a port or a dot after)."""
    parts = [draw(VALID_NAMES)]
    for _ in range(draw(st.integers(0, 2))):
        parts.insert(draw(st.integers(0, len(parts))), draw(st.sampled_from(ODD_BYTES)))
    return b"".join(parts)


NAME_BYTES = name_bytes()


@st.composite
def http_requests(draw: st.DrawFn) -> bytes:
    line = draw(
        st.sampled_from(
            [
                *(b"GET / HTTP/1.1", b"POST /x HTTP/1.0", b"PUT /a HTTP/1.1"),
                *(b"GET  / HTTP/1.1", b"GET / HTTP/2", b"GET /HTTP/1.1", b"get / http/1.1", b""),
            ]
        )
    )
    header = st.tuples(
        st.sampled_from([b"Host", b"host", b"HOST", b"Hos", b"X-Host", b"Accept"]),
        st.sampled_from([b": ", b":", b":\t", b" :"]),
        NAME_BYTES,
    )
    headers = draw(st.lists(header, max_size=3))
    if not draw(RARELY):  # one Host header mostly, where a name can be read
        headers.insert(draw(st.integers(0, len(headers))), (b"Host", b": ", draw(NAME_BYTES)))
    head = b"\r\n".join([line] + [name + sep + value for name, sep, value in headers])
    end = draw(st.sampled_from([b"\r\n\r\n", b"\r\n\r\nbody", b"\r\n", b""]))
    return head + end


def tls_record(body: bytes, kind: int = 0x16) -> bytes:
    return bytes([kind, 3, 1]) + struct.pack("!H", len(body)) + body


@st.composite
def client_hellos(draw: st.DrawFn) -> bytes:
    name = draw(NAME_BYTES)
    name_type = draw(st.sampled_from([0, 0, 0, 1]))
    entry = bytes([name_type]) + struct.pack("!H", len(name)) + name
    server_name = struct.pack("!H", len(entry)) + entry
    before = draw(st.lists(st.binary(max_size=8), max_size=3))
    extensions = b"".join(struct.pack("!HH", 10 + i, len(x)) + x for i, x in enumerate(before))
    if not draw(RARELY):
        extensions += struct.pack("!HH", 0, len(server_name)) + server_name
    hello = (
        b"\x03\x03"
        + draw(st.binary(min_size=32, max_size=32))
        + bytes([len(sid := draw(st.binary(max_size=32)))])
        + sid
        + struct.pack("!H", len(ciphers := draw(st.binary(max_size=6))))
        + ciphers
        + b"\x01\x00"
        + struct.pack("!H", len(extensions))
        + extensions
    )
    handshake = bytes([draw(st.sampled_from([1, 1, 1, 2]))]) + struct.pack("!I", len(hello))[1:]
    data = bytearray(tls_record(handshake + hello))
    if draw(RARELY):  # a corrupted byte (often a length)
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    if draw(RARELY):
        return bytes(data[: draw(st.integers(0, len(data)))])
    return bytes(data)


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=http_requests())
def test_http_hosts_read_alike(judge: Path, data: bytes) -> None:
    same(judge, data)


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=client_hellos())
def test_client_hellos_read_alike(judge: Path, data: bytes) -> None:
    same(judge, data)


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.binary(max_size=64) | st.binary(max_size=64).map(lambda b: b"\x16" + b))
def test_arbitrary_bytes_read_alike(judge: Path, data: bytes) -> None:
    same(judge, data)


@pytest.mark.parametrize(
    "data",
    [
        client_hello("API.example.com"),
        client_hello(None),
        client_hello("a." + "b" * 60 + ".example"),
        b"GET / HTTP/1.1\r\nHost: Example.com:8080\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\n.example.com\r\n\r\n",  # no name, not "a\n.example.com"
        b"GET / HTTP/1.1\r\nHost: example.com:\xff\r\n\r\n",  # (the port goes first)
        b"A" * PEEK_MAX,
        b"A" * (PEEK_MAX - 1),
        b"\x16\x03\x01\xff\xff",
        b"\x16\x03\x01\x3f\xfb",
        tls_record(b"\x01") + b"",
    ],
)
def test_known_cases_read_alike(judge: Path, data: bytes) -> None:
    same(judge, data)
    assert c_peek(judge, data) is not None or len(data) < PEEK_MAX
