"""The fuzz run's exec-stream check itself: what it accepts and what it refuses."""

import json
from typing import Any

import pytest
from attrs import define

from tests.contract import fuzz_hooks

# Registered with schemathesis, it is typed for its Response; these stand-ins have its fields.
exec_stream: Any = fuzz_hooks.exec_stream


@define
class Request:
    url: str
    body: bytes | None


@define
class Response:
    content: bytes
    request: Request


def stream(body: dict[str, Any] | None, *frames: dict[str, Any]) -> Response:
    raw = None if body is None else json.dumps(body).encode()
    lines = b"".join(json.dumps(f).encode() + b"\n" for f in frames)
    return Response(lines, Request("http://127.0.0.1:1/sandboxes/0123456789abcdef/exec", raw))


END = {"exit": 2, "out": "", "err": "ZQ=="}


def test_stderr_frames_pass_when_the_request_split_them() -> None:
    asked = stream({"cmd": ["x"], "split": True}, {"o": "bw=="}, {"e": "ZQ=="}, END)
    assert exec_stream(None, asked) == END


@pytest.mark.parametrize("body", [{"cmd": ["x"]}, {"cmd": ["x"], "split": "yes"}, None])
def test_stderr_frames_are_refused_when_the_request_did_not_split_them(
    body: dict[str, Any] | None,
) -> None:
    with pytest.raises(ValueError, match="not an output frame"):
        exec_stream(None, stream(body, {"e": "ZQ=="}, END))


def test_an_end_frame_must_come_last() -> None:
    with pytest.raises(ValueError, match="does not end"):
        exec_stream(None, stream({"cmd": ["x"]}, {"o": "bw=="}))
