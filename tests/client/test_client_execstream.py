"""The exec stream decoder and the NDJSON splitter, in memory: any split gives the same answer."""

from __future__ import annotations

import base64
import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxd_client import ExecResult, ProtocolError, SandboxNotFound
from sandboxd_client._execstream import ExecStreamDecoder, fast_exit, fast_live_chunk
from sandboxd_client._ndjson import LineSplitter


def encode(chunks: list[bytes], result: ExecResult | None, crlf: bool = False) -> bytes:
    """An exec stream: one live frame per chunk (empty ones are keepalives), then the exit."""
    frames = [{"o": base64.b64encode(c).decode()} for c in chunks]
    if result is not None:
        final: dict[str, object] = {
            "exit": result.exit_code,
            "out": base64.b64encode(result.stdout).decode(),
            "err": base64.b64encode(result.stderr).decode(),
        }
        if result.truncated:
            final["truncated"] = True
        frames.append(final)
    eol = b"\r\n" if crlf else b"\n"
    return b"".join(json.dumps(f).encode() + eol for f in frames)


def decode(pieces: list[bytes]) -> tuple[list[bytes], ExecResult]:
    out: list[bytes] = []
    decoder = ExecStreamDecoder(out.append)
    for piece in pieces:
        decoder.feed(piece)
    return out, decoder.finish()


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


results = st.builds(
    ExecResult,
    exit_code=st.integers(0, 255),
    stdout=st.binary(max_size=300),
    stderr=st.binary(max_size=300),
    truncated=st.booleans(),
)


@settings(max_examples=100, deadline=None)
@given(
    chunks=st.lists(st.binary(max_size=200), max_size=12),
    result=results,
    crlf=st.booleans(),
    data=st.data(),
)
def test_any_split_of_a_stream_decodes_the_same(
    chunks: list[bytes], result: ExecResult, crlf: bool, data: st.DataObject
) -> None:
    stream = encode(chunks, result, crlf)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=40))
    out, got = decode(split_at(stream, cuts))
    assert out == [c for c in chunks if c]
    assert got == result


def test_every_byte_boundary_and_byte_by_byte() -> None:
    chunks = [b"hello ", b"", b"\x00\xff binary", b"", b"world\n"]
    result = ExecResult(1, b"hello world\n", b"oops", True)
    stream = encode(chunks, result)
    expected = [c for c in chunks if c]
    for i in range(len(stream) + 1):
        assert decode([stream[:i], stream[i:]]) == (expected, result)
    assert decode([stream[i : i + 1] for i in range(len(stream))]) == (expected, result)


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.binary(min_size=1, max_size=50), max_size=8), data=st.data())
def test_a_stream_cut_anywhere_is_not_found_with_the_chunks_so_far(
    chunks: list[bytes], data: st.DataObject
) -> None:
    stream = encode(chunks, ExecResult(0, b"x", b"", False))
    cut = data.draw(st.integers(0, len(stream) - 2))  # never the whole final frame
    out: list[bytes] = []
    decoder = ExecStreamDecoder(out.append)
    decoder.feed(stream[:cut])
    with pytest.raises(SandboxNotFound):
        decoder.finish()
    complete = stream[:cut].count(b"\n")
    tail = stream[:cut].rsplit(b"\n", 1)[-1]
    if tail.endswith(b"}"):
        complete += 1  # a whole frame missing only its newline still counts
    assert out == chunks[:complete]


def test_very_long_final_frame() -> None:
    big = bytes(range(256)) * 16384  # 4 MiB, one 5.6 MiB line once base64'd
    stream = encode([b"a"], ExecResult(0, big, b"", False))
    pieces = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]
    out, result = decode(pieces)
    assert out == [b"a"] and result.stdout == big


def test_final_frame_without_newline_and_extra_frames() -> None:
    stream = encode([b"x"], None) + b'\n\n{"exit": 4, "out": "", "err": ""}'
    assert decode([stream]) == ([b"x"], ExecResult(4, b"", b"", False))
    after = encode([], ExecResult(0, b"", b"", False)) + b'{"o": "eQ=="}\n{"exit": 9}\n'
    out, result = decode([after])
    assert out == [] and result.exit_code == 0  # frames after the final one are ignored


def test_unknown_fields_and_missing_buffers_are_tolerated() -> None:
    out, result = decode([b'{"o": "eA==", "seq": 1}\n{"exit": 0, "future": true}\n'])
    assert out == [b"x"] and result == ExecResult(0, b"", b"", False)
    out, result = decode([b'{"o": null}\n{"exit": 1, "out": null, "err": "eQ=="}\n'])
    assert out == [] and result == ExecResult(1, b"", b"y", False)


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[1]",
        b'{"exit": "0"}',
        b'{"exit": true}',
        b'{"exit": 0, "truncated": "yes"}',
        b'{"o": 5}',
        b'{"o": "###"}',
        b'{"o": "\\u00e9"}',
        b'{"exit": 0, "out": "a"}',
        b"\xff\xfe",
    ],
)
def test_malformed_frames_are_protocol_errors(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        ExecStreamDecoder(None).feed(line + b"\n")


def test_splitter_bounds_lines() -> None:
    splitter = LineSplitter(max_line=10)
    assert splitter.feed(b"0123456789\nab") == [b"0123456789"]
    assert splitter.pending == 2
    with pytest.raises(ProtocolError):
        splitter.feed(b"c" * 9)
    with pytest.raises(ProtocolError):
        LineSplitter(max_line=4).feed(b"abcdef\n")


@settings(deadline=None)
@given(
    st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=10), st.data()
)
def test_splitter_is_split_invariant(lines: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    splitter = LineSplitter()
    got = [line for piece in split_at(stream, cuts) for line in splitter.feed(piece)]
    assert got == [line.rstrip(b"\r") for line in lines if line.rstrip(b"\r").strip()]
    assert splitter.flush() == b""


# The host writes compact frames; those take a fast path that must give json's very answer.


def compact(chunks: list[bytes], result: ExecResult) -> bytes:
    """The stream exactly as the host writes it (no spaces)."""
    return b"".join(
        json.dumps(json.loads(line), separators=(",", ":")).encode() + b"\n"
        for line in encode(chunks, result).splitlines()
    )


def general(line: bytes) -> tuple[list[bytes], ExecResult | None]:
    """What the JSON path gives for one line: the same frame, re-spaced (no fast path)."""
    out: list[bytes] = []
    decoder = ExecStreamDecoder(out.append)
    decoder.feed(json.dumps(json.loads(line)).encode() + b"\n")
    return out, decoder._result


@settings(max_examples=100, deadline=None)
@given(chunks=st.lists(st.binary(max_size=200), max_size=12), result=results, data=st.data())
def test_the_hosts_compact_stream_decodes_the_same_in_any_split(
    chunks: list[bytes], result: ExecResult, data: st.DataObject
) -> None:
    stream = compact(chunks, result)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=40))
    out, got = decode(split_at(stream, cuts))
    assert out == [c for c in chunks if c]
    assert got == result


def test_fast_paths_take_the_hosts_frames() -> None:
    assert fast_live_chunk(b'{"o":"aGk="}') == b"hi"
    assert fast_live_chunk(b'{"o":""}') == b""
    assert fast_exit(b'{"exit":-3,"out":"aGk=","err":""}') == ExecResult(-3, b"hi", b"", False)
    assert fast_exit(b'{"exit":0,"out":"","err":"aGk=","truncated":true}') == ExecResult(
        0, b"", b"hi", True
    )
    assert fast_exit(b'{"exit":0,"out":"","err":"","truncated":false}') == ExecResult(
        0, b"", b"", False
    )


@pytest.mark.parametrize(
    "line",
    [
        b'{"o": "aGk="}',
        b'{"o":"aGk=","seq":1}',
        b'{"o":"aGk"}',
        b'{"o":"a\\u0047k="}',
        b'{"o":"aG k="}',
        b'{"o":"aGk="} ',
        b'{"exit": 0,"out":"","err":""}',
        b'{"exit":01,"out":"","err":""}',
        b'{"exit":true,"out":"","err":""}',
        b'{"exit":0,"out":"","err":"","truncated":1}',
        b'{"exit":0,"out":"","err":"","future":1}',
        b'{"exit":0,"out":"a\\u0047k=","err":""}',
        b'{"exit":0,"out":"aGk","err":""}',
        b'{"exit":0,"out":"","err":"aGk"}',
        b'{"exit":0,"out":"aGk="}',
        b'{"exit":0,"out":"","err":"',
        b'{"exit":0,"out":"',
        b'{"exit":0}',
        b'{"exit":0,"err":"","out":""}',
        b'{"error":"SpawnFailed","detail":"no"}',
    ],
)
def test_any_other_line_goes_to_json(line: bytes) -> None:
    assert fast_live_chunk(line) is None
    assert fast_exit(line) is None


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b'{"o":"aGk"}', "not valid base64"),
        (b'{"exit":0,"out":"aGk","err":""}', "not valid base64"),
        (b'{"exit":01,"out":"","err":""}', "not JSON"),
    ],
)
def test_malformed_compact_frames_are_still_protocol_errors(line: bytes, error: str) -> None:
    with pytest.raises(ProtocolError, match=error):
        ExecStreamDecoder(None).feed(line + b"\n")


@settings(max_examples=300, deadline=None)
@given(
    frame=st.one_of(
        st.fixed_dictionaries({"o": st.binary(max_size=40).map(lambda b: b64(b))}),
        st.fixed_dictionaries(
            {
                "exit": st.integers(-(2**70), 2**70),
                "out": st.binary(max_size=40).map(lambda b: b64(b)),
                "err": st.binary(max_size=40).map(lambda b: b64(b)),
            },
            optional={"truncated": st.booleans()},
        ),
    ),
    cut=st.integers(0, 200),
    junk=st.sampled_from(["", "=", "A", " ", "\\", '"', "é", "}", ","]),
)
def test_fast_paths_agree_with_json(frame: dict[str, object], cut: int, junk: str) -> None:
    """A compact frame, perhaps with one character slipped in: fast or not, json's answer."""
    text = json.dumps(frame, separators=(",", ":"))
    text = text[:cut] + junk + text[cut:]
    line = text.encode()
    try:
        expected = general(line)
    except (ProtocolError, ValueError):
        expected = None
    chunk, result = fast_live_chunk(line), fast_exit(line)
    if chunk is not None:
        assert expected == ([chunk] if chunk else [], None)
    if result is not None:
        assert expected == ([], result)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_e_frames_go_to_on_stderr_and_are_dropped_without_it() -> None:
    def frame(key: str, data: bytes) -> bytes:
        return json.dumps({key: base64.b64encode(data).decode()}).encode() + b"\n"

    stream = frame("o", b"out") + frame("e", b"err") + frame("e", b"") + frame("o", b"!")
    stream += b'{"exit": 0, "out": "", "err": ""}\n'
    outs: list[bytes] = []
    errs: list[bytes] = []
    split = ExecStreamDecoder(outs.append, on_stderr=errs.append)
    split.feed(stream)
    assert (outs, errs, split.finish().exit_code) == ([b"out", b"!"], [b"err"], 0)
    old = ExecStreamDecoder(outs.append)  # a caller that did not ask for split
    old.feed(stream)
    assert outs[2:] == [b"out", b"!"] and old.finish().exit_code == 0
