"""The E2B front's codec: envelopes, messages, fields and error bodies."""

import json
import struct

import pytest

from sandboxd.e2b import wire
from sandboxd.e2b.paths import place_of
from sandboxd.e2b.wire import ConnectError
from sandboxd.errors import (
    ArchiveFailed,
    BadRequest,
    InsufficientStorage,
    PathNotFound,
    ProcessConflict,
    SandboxNotFound,
)


def frame(flags: int, payload: bytes) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def test_envelopes_round_trip() -> None:
    data = wire.envelope({"a": 1}) + wire.envelope({"b": 2}) + wire.end_of_stream()
    assert list(wire.read_envelopes(data)) == [{"a": 1}, {"b": 2}]
    assert wire.first_message(data) == {"a": 1}
    assert list(wire.read_envelopes(wire.envelope({"c": 3}))) == [{"c": 3}]  # no end: fine


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\x00",  # a truncated header
        frame(0, b"{}")[:-1],  # a truncated payload
        frame(1, b"{}"),  # compressed
        frame(0, b"not json"),
        frame(0, b"[1, 2]"),  # not an object
        frame(0, b"\xff\xfe"),  # not UTF-8
        struct.pack(">BI", 0, wire.MESSAGE_MAX + 1),
    ],
)
def test_malformed_envelopes_are_invalid_argument(data: bytes) -> None:
    with pytest.raises(ConnectError) as caught:
        list(wire.read_envelopes(data))
    assert caught.value.code == "invalid_argument"


def test_a_stream_without_a_message() -> None:
    with pytest.raises(ConnectError, match="no message"):
        wire.first_message(wire.end_of_stream())


def test_end_of_stream_carries_the_error() -> None:
    data = wire.end_of_stream(ConnectError("unavailable", "gone"))
    flags, length = struct.unpack_from(">BI", data)
    assert flags == wire.FLAG_END
    assert json.loads(data[5:]) == {"error": {"code": "unavailable", "message": "gone"}}
    assert length == len(data) - 5


def test_unary_bodies() -> None:
    assert wire.parse_message(b"") == {}
    for bad in (b"{", b"3", b'"x"'):
        with pytest.raises(ConnectError, match="JSON"):
            wire.parse_message(bad)
    status, body = wire.connect_error_body(ConnectError("not_found", "no"))
    assert status == 404 and json.loads(body) == {"code": "not_found", "message": "no"}
    assert json.loads(wire.rest_error_body(401, "key")) == {"code": 401, "message": "key"}


def test_core_errors_map_to_connect_codes() -> None:
    assert wire.connect_error_of(BadRequest("b")).code == "invalid_argument"
    assert wire.connect_error_of(PathNotFound("p")).code == "not_found"
    assert wire.connect_error_of(ProcessConflict("c")).code == "failed_precondition"
    assert wire.connect_error_of(ValueError("v")).code == "internal"
    same = ConnectError("aborted", "a")
    assert wire.connect_error_of(same) is same
    assert "was not found" in wire.not_running("abc").message


def test_fields() -> None:
    assert wire.unb64("aGk", "f") == b"hi"  # padding optional
    assert wire.unb64("-_8=", "f") == b"\xfb\xff"  # URL-safe
    for bad in ("!!", 3):
        with pytest.raises(ConnectError):
            wire.unb64(bad, "f")
    assert wire.int_field({"pid": "12"}, "pid") == 12
    for bad_int in (True, "x", 1.5):
        with pytest.raises(ConnectError):
            wire.int_field({"pid": bad_int}, "pid")
    with pytest.raises(ConnectError):
        wire.text_field({"a": 1}, "a")
    with pytest.raises(ConnectError):
        wire.object_field({"a": []}, "a")
    with pytest.raises(ConnectError):
        wire.bool_field({"a": "yes"}, "a")


def test_paths() -> None:
    assert place_of("a/b").display == "/home/user/a/b"
    assert place_of("/home/user").parts == ()
    assert place_of("/home/user/./x//y").parts == ("x", "y")
    assert place_of("/tmp/z").area == "tmp"
    for outside in ("/etc", "/home/username", "/tmpx", "../x", "/home/user/../../etc", 3):
        with pytest.raises(ConnectError) as caught:
            place_of(outside)
        assert caught.value.code == "invalid_argument"


def test_core_errors_answer_as_their_nearest_base() -> None:
    class Narrower(PathNotFound):
        """A core error of a kind the table does not name."""

    assert wire.answer_of(Narrower("n")) is wire.ERROR_ANSWERS[PathNotFound]
    assert wire.connect_error_of(Narrower("n")).code == "not_found"
    assert wire.answer_of(ArchiveFailed("a")) == wire.ErrorAnswer("internal", 500)
    assert wire.answer_of(InsufficientStorage("s")) == wire.ErrorAnswer("resource_exhausted", 507)
    assert wire.answer_of(SandboxNotFound("s")).gone
    assert not any(
        answer.gone for kind, answer in wire.ERROR_ANSWERS.items() if kind is not SandboxNotFound
    )
    for kind, answer in wire.ERROR_ANSWERS.items():
        assert answer.code in wire.STATUS_OF_CODE, kind
