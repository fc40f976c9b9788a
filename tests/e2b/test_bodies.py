"""``POST /files`` bodies cost the daemon a bounded memory and never hold its reactor (issue
29: "the E2B front inflates gzip bodies and buffers multipart uploads in memory").

Against a real daemon of its own (so that its peak RSS is this module's), with the sandboxes
made by the unmodified ``e2b`` SDK: a gzip bomb (a 1 MiB body of zeros that inflates to a
gigabyte) is refused with E2B's error once it inflates past its bound; a 384 MiB multipart
upload by the SDK arrives whole while another sandbox's commands keep answering.
"""

import hashlib
import http.client
import io
import json
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox

from tests.e2b.conftest import E2BDaemon, _start, _stop, point_sdk_at
from tests.support.daemon import Daemon

MIB = 1 << 20
RSS_BOUND = 64 * MIB
"""What the daemon's peak RSS may grow by while one of these bodies is handled."""
EXEC_BOUND = 5.0
"""Seconds another sandbox's command may take while an upload is handled."""
UPLOAD_MIB = 384


@pytest.fixture(scope="module")
def own_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BDaemon]:
    front = _start(tmp_path_factory.mktemp("e2b-bodies"), "--isolation=none")
    try:
        yield front
    finally:
        _stop(front)


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch, own_front: E2BDaemon) -> E2BDaemon:
    return point_sdk_at(monkeypatch, own_front)


def reset_peak(daemon: Daemon) -> int:
    """Reset the daemon's peak RSS to its RSS now (``clear_refs`` 5); the bytes it is."""
    Path(f"/proc/{daemon.process.pid}/clear_refs").write_text("5")
    return daemon.rss_kib("VmHWM") * 1024


def peak_growth(daemon: Daemon, baseline: int) -> int:
    return daemon.rss_kib("VmHWM") * 1024 - baseline


def post_files(front: E2BDaemon, sbx: Sandbox, path: str, body: bytes, **headers: str) -> Any:
    port = int(front.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    given = {
        "E2b-Sandbox-Id": sbx.sandbox_id,
        "X-Access-Token": sbx._envd_access_token or "",
        "Content-Type": "application/octet-stream",
        **headers,
    }
    connection.request("POST", f"/files?path={path}", body, given)
    response = connection.getresponse()
    answer = response.status, json.loads(response.read())
    connection.close()
    return answer


def gzip_of_zeros(size: int) -> bytes:
    """A gzip stream of ``size`` zero bytes, made without holding them."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MIB)
    out = [compressor.compress(zeros) for _ in range(size // MIB)]
    return b"".join(out) + compressor.flush()


def test_a_gzip_bomb_is_refused_with_e2bs_error_and_bounded_memory(front: E2BDaemon) -> None:
    bomb = gzip_of_zeros(1100 * MIB)
    assert len(bomb) < 1100 * 1024 + 4096  # about 1 MiB, inflating to 1.1 GiB
    sbx = Sandbox.create(timeout=120)
    try:
        baseline = reset_peak(front.daemon)
        status, body = post_files(front, sbx, "bomb", bomb, **{"Content-Encoding": "gzip"})
        grown = peak_growth(front.daemon, baseline)
        print(f"\ngzip bomb: {status} {body}; daemon peak RSS grew {grown >> 20} MiB")
        assert status == 413 and body["code"] == 413, body
        assert "inflates past" in body["message"] and "times its size" in body["message"]
        assert grown < RSS_BOUND, grown
        # A gzip body within its bound still inflates whole.
        data = b"sandboxd " * 100_000
        status, body = post_files(
            front,
            sbx,
            "fine",
            zlib.compress(data, wbits=16 + zlib.MAX_WBITS),
            **{"Content-Encoding": "gzip"},
        )
        assert status == 200 and sbx.files.read("fine", format="bytes") == data
    finally:
        sbx.kill()


class Source(io.FileIO):
    """The upload's file: when its last byte was read by the SDK (``sent``)."""

    sent: float | None = None

    def read(self, size: int = -1, /) -> bytes:  # type: ignore[override]
        data = super().read(size)
        if not data and size != 0 and self.sent is None:
            self.sent = time.monotonic()
        return data


def big_file(path: Path) -> str:
    """Write ``UPLOAD_MIB`` MiB of blocks each unlike the others; their SHA-256."""
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for i in range(UPLOAD_MIB):
            block = hashlib.sha256(i.to_bytes(4, "big")).digest() * (MIB // 32)
            out.write(block)
            digest.update(block)
    return digest.hexdigest()


def test_a_large_multipart_upload_arrives_whole_while_a_neighbour_keeps_answering(
    front: E2BDaemon, tmp_path: Path
) -> None:
    expected = big_file(tmp_path / "big")
    uploader, neighbour = Sandbox.create(timeout=300), Sandbox.create(timeout=300)
    try:
        neighbour.commands.run("true")
        done = threading.Event()
        answers: list[tuple[float, float]] = []

        def keep_running() -> None:
            while not done.is_set():
                started = time.monotonic()
                assert neighbour.commands.run("true", timeout=60).exit_code == 0
                answers.append((started, time.monotonic()))

        runner = threading.Thread(target=keep_running)
        baseline = reset_peak(front.daemon)
        runner.start()
        began = time.monotonic()
        with Source(tmp_path / "big") as source:
            uploader.files.write("/home/user/big", source, use_octet_stream=False)
        answered = time.monotonic()
        done.set()
        runner.join(120)
        grown = peak_growth(front.daemon, baseline)
        sent = source.sent
        assert sent is not None
        slowest = max(end - start for start, end in answers)
        handled = [end for _, end in answers if sent <= end <= answered]
        print(
            f"\n{UPLOAD_MIB} MiB multipart upload: sent in {sent - began:.1f} s, answered "
            f"{answered - sent:.1f} s later; daemon peak RSS grew {grown >> 20} MiB; "
            f"{len(answers)} neighbour commands, the slowest {slowest:.2f} s, "
            f"{len(handled)} answered between the body's end and its answer"
        )
        assert grown < RSS_BOUND, grown
        assert slowest < EXEC_BOUND, slowest
        assert handled, "no command of the neighbour was answered while the upload was handled"
        found = uploader.commands.run("sha256sum big", timeout=120).stdout.split()[0]
        assert found == expected
    finally:
        uploader.kill()
        neighbour.kill()
