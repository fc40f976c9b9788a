"""A spooled upload body gives its space back as it is read (``sandboxd.e2b.consumed``): the
whole megabytes behind the reads are punched out of its file, on a real filesystem."""

import io
import os
from pathlib import Path
from typing import Any

import pytest
from twisted.web.test.requesthelper import DummyRequest

from sandboxd.e2b.consumed import GIVE_BACK, Consumed, punch_hole
from sandboxd.e2b.upload import Upload
from sandboxd.web.spool import Spool

MiB = 1 << 20


def allocated(file: io.BufferedRandom) -> int:
    """Bytes the filesystem holds for ``file`` now."""
    return os.fstat(file.fileno()).st_blocks * 512


def test_the_bytes_read_are_given_back_a_whole_megabyte_at_a_time(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    spool.write(os.urandom(4 * MiB + 100))
    spool.flush()
    before = allocated(spool)
    if before < 4 * MiB:
        pytest.skip("this filesystem does not allocate what is written (compressed, sparse)")
    body = Consumed(spool)
    assert body.seek(0, os.SEEK_END) == 4 * MiB + 100  # what a gzip body is measured by
    body.seek(0)
    assert len(body.read(GIVE_BACK // 2)) == GIVE_BACK // 2
    assert body.freed == 0 and allocated(spool) == before  # not a whole megabyte yet
    read = len(body.read(3 * MiB))
    assert body.freed == 3 * MiB
    assert allocated(spool) <= before - 3 * MiB + 64 * 1024
    read += len(body.read())
    assert read == 4 * MiB + 100 - GIVE_BACK // 2
    assert body.freed == 4 * MiB
    spool.close()


def test_a_body_that_cannot_be_punched_is_read_all_the_same() -> None:
    body = Consumed(io.BytesIO(b"x" * (GIVE_BACK + 1)))  # no descriptor: nothing to punch
    assert len(body.read(GIVE_BACK + 1)) == GIVE_BACK + 1
    assert body.freed == 0


def test_punching_where_the_filesystem_cannot_is_an_error() -> None:
    read, write = os.pipe()
    try:
        with pytest.raises(OSError):
            punch_hole(read, 0, GIVE_BACK)
    finally:
        os.close(read)
        os.close(write)


def test_an_upload_of_a_spooled_body_gives_its_space_back(tmp_path: Path) -> None:
    request: Any = DummyRequest([b"files"])
    request.args = {b"path": [b"/tmp/f"]}
    request.content = Spool(str(tmp_path))
    request.content.write(b"data")
    upload = Upload.of(request, 1 << 20)
    assert isinstance(upload.body, Consumed) and upload.body.file is request.content
    place, source = upload.next_file() or (None, None)
    assert place is not None and source is not None and source.read() == b"data"
    request.content.close()
    request.content = io.BytesIO(b"data")  # in memory: read as it is
    assert Upload.of(request, 1 << 20).body is request.content
