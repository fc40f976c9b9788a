"""``POST /files`` bodies cost the daemon a bounded memory and never hold its reactor (issue
29: "the E2B front inflates gzip bodies and buffers multipart uploads in memory").

Against a real daemon of its own (so that its peak RSS is this module's), with the sandboxes
made by the unmodified ``e2b`` SDK: a gzip bomb (a 1 MiB body of zeros that inflates to a
gigabyte) is refused with E2B's error once it inflates past its bound; a 384 MiB multipart
upload by the SDK arrives whole while another sandbox's commands keep answering; a body
over ``SANDBOXD_MAX_BODY``, or that the state root has no room to store, is refused rather than
written empty; and a multipart upload of more files than one may hold is refused past them.
"""

import contextlib
import hashlib
import http.client
import io
import json
import os
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import NotEnoughSpaceException, Sandbox, SandboxException

from tests.e2b.conftest import E2BDaemon, point_sdk_at, running_front
from tests.support.daemon import SHARED_ROOTS, Daemon

MIB = 1 << 20
RSS_BOUND = 64 * MIB
"""What the daemon's peak RSS may grow by while one of these bodies is handled."""
EXEC_BOUND = 5.0
"""Seconds another sandbox's command may take while an upload is handled."""
UPLOAD_MIB = 384


@pytest.fixture(scope="module")
def own_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BDaemon]:
    with running_front(tmp_path_factory.mktemp("e2b-bodies"), "--isolation=none") as front:
        yield front


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch, own_front: E2BDaemon) -> E2BDaemon:
    return point_sdk_at(monkeypatch, own_front)


def reset_peak(daemon: Daemon) -> int:
    """Reset the daemon's peak RSS to its RSS now (``clear_refs`` 5); the bytes it is."""
    Path(f"/proc/{daemon.process.pid}/clear_refs").write_text("5")
    return daemon.rss_kib("VmHWM") * 1024


def peak_growth(daemon: Daemon, baseline: int) -> int:
    return daemon.rss_kib("VmHWM") * 1024 - baseline


def post(front: E2BDaemon, sbx: Sandbox, target: str, body: bytes, **headers: str) -> Any:
    """A ``POST`` of ``body`` to ``target`` with the sandbox's access token: its status and
    JSON answer."""
    port = int(front.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    given = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token or ""}
    connection.request("POST", target, body, {**given, **headers})
    response = connection.getresponse()
    answer = response.status, json.loads(response.read())
    connection.close()
    return answer


def post_files(front: E2BDaemon, sbx: Sandbox, path: str, body: bytes, **headers: str) -> Any:
    """An upload of ``body`` as the raw bytes of the file at ``path``."""
    headers = {"Content-Type": "application/octet-stream", **headers}
    return post(front, sbx, f"/files?path={path}", body, **headers)


def stat_rpc(front: E2BDaemon, sbx: Sandbox, body: bytes, **headers: str) -> Any:
    """A unary ``filesystem.Filesystem/Stat`` call of ``body``: its status and answer."""
    headers = {"Content-Type": "application/json", **headers}
    return post(front, sbx, "/filesystem.Filesystem/Stat", body, **headers)


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
        # A gzip body within its bound still inflates whole: the SDK's own (envd 0.5.7's
        # octet-stream upload with Content-Encoding: gzip).
        data = b"sandboxd " * 100_000
        assert sbx.files.write("fine", data, gzip=True).name == "fine"
        assert sbx.files.read("fine", format="bytes") == data
        # An RPC's body is never inflated: a compressed one is Connect's "unimplemented".
        status, body = stat_rpc(front, sbx, bomb, **{"Content-Encoding": "gzip"})
        assert status == 501 and body["code"] == "unimplemented", body
        assert "'gzip' is not accepted" in body["message"]
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


@pytest.fixture(scope="module")
def small_body_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BDaemon]:
    tmp = tmp_path_factory.mktemp("e2b-max-body")
    with running_front(tmp, "--isolation=none", "--max-body=1M") as front:
        yield front


@pytest.mark.parametrize("octet_stream", [True, False], ids=["octet-stream", "multipart"])
def test_a_body_over_the_limit_is_refused_not_written_empty(
    monkeypatch: pytest.MonkeyPatch, small_body_front: E2BDaemon, octet_stream: bool
) -> None:
    point_sdk_at(monkeypatch, small_body_front)
    sbx = Sandbox.create(timeout=120)
    try:
        with pytest.raises(SandboxException) as raised:
            sbx.files.write("big", b"x" * (2 * MIB), use_octet_stream=octet_stream)
        assert "SANDBOXD_MAX_BODY" in str(raised.value), raised.value
        assert not sbx.files.exists("big")
        assert (
            sbx.files.write("small", b"y" * (MIB // 2), use_octet_stream=octet_stream).name
            == "small"
        )
        assert sbx.files.read("small", format="bytes") == b"y" * (MIB // 2)
        # An RPC's body over the limit is refused too, not taken for an empty message.
        message = json.dumps({"path": "/home/user/" + "z" * (2 * MIB)}).encode()
        status, body = stat_rpc(small_body_front, sbx, message)
        assert status == 429 and body["code"] == "resource_exhausted", body
        assert "SANDBOXD_MAX_BODY" in body["message"]
    finally:
        sbx.kill()


@contextlib.contextmanager
def small_state_root(tmp_path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` as the state root of a daemon started in ``tmp_path`` (beneath
    the shared roots, which sandbox uids can pass through)."""
    SHARED_ROOTS.mkdir(mode=0o711, exist_ok=True)
    real = Path(tempfile.mkdtemp(prefix="small-", dir=SHARED_ROOTS))
    options = f"size={size},mode=0711"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(real)], check=True)
    try:
        (tmp_path / "root").symlink_to(real)
        yield real
    finally:
        subprocess.run(["umount", "-l", str(real)], check=True)
        real.rmdir()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs as the state root")
def test_a_body_the_state_root_cannot_store_is_refused_not_written_empty(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with small_state_root(tmp_path, "24m"), running_front(tmp_path, "--isolation=none") as front:
        point_sdk_at(monkeypatch, front)
        sbx = Sandbox.create(timeout=120)
        with pytest.raises(NotEnoughSpaceException) as raised:
            sbx.files.write("big", b"x" * (32 * MIB), use_octet_stream=True)
        assert "could not be stored" in str(raised.value), raised.value
        assert not sbx.files.exists("big")
        sbx.kill()


def test_a_multipart_upload_of_too_many_files_is_refused_past_them(front: E2BDaemon) -> None:
    """The SDK's ``write_files`` of one file more than an upload may hold: the first
    ``FILES_MAX`` are written, the next refused (what the daemon keeps of each is bounded)."""
    from e2b import InvalidArgumentException
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    from sandboxd.e2b.upload import FILES_MAX

    sbx = Sandbox.create(timeout=300)
    try:
        many = [WriteEntry(path=f"many/f{i}", data=b"") for i in range(FILES_MAX + 1)]
        with pytest.raises(InvalidArgumentException, match=f"at most {FILES_MAX} files"):
            sbx.files.write_files(many, request_timeout=240)
        count = sbx.commands.run("ls many | wc -l", timeout=60).stdout
        assert int(count) == FILES_MAX
    finally:
        sbx.kill()
