"""The client's ``build_template`` against answers a daemon never gives (a broken proxy's):
an answer ended before the build's end, a frame that is not JSON or not an object. The real
answers are in ``test_templates_build``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.web.resource import Resource
from twisted.web.server import Site

from sandboxd_client import HttpSandbox
from sandboxd_client._templates import decode_frame
from sandboxd_client._types import ProtocolError


class Answers(Resource):
    """Answers every request ``200`` with ``body``, and keeps the query it was sent."""

    isLeaf = True

    def __init__(self, body: bytes) -> None:
        super().__init__()
        self.body = body
        self.args: Any = None

    def render(self, request: Any) -> bytes:
        self.args = request.args
        request.setHeader(b"content-type", b"application/x-ndjson")
        return self.body


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"step":1,"steps":1,"line":1,"instruction":"FROM x"}\n{}\n', "ended before the build"),
        (b"<html>\n", "a frame is not JSON"),
        (b"[1]\n", "a frame is not an object"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_an_answer_no_daemon_gives_is_a_protocol_error(
    tmp_path: Path, body: bytes, message: str
) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    answers = Answers(body)
    site: Any = Site(answers)
    port: Any = reactor.listenTCP(0, site, interface="127.0.0.1")
    client = HttpSandbox(f"http://127.0.0.1:{port.getHost().port}", reactor=reactor)
    try:
        with pytest.raises(ProtocolError, match=message):
            await client.build_template("x", str(tmp_path), network="host")
        assert answers.args == {b"network": [b"host"]}
    finally:
        await client.close()
        await port.stopListening()


def test_a_keepalive_frame_is_an_empty_object() -> None:
    assert decode_frame(b"{}") == {}
