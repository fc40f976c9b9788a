"""``sandboxd.e2b.upload``'s reading of ``/files`` bodies as streams: multipart parts and their
file names, gzip bodies inflated with their bound, and the files of an upload in turn.

Every parse runs over sources that give a few bytes at a time too, so that a delimiter, a
header block or a gzip member split across reads is found as it is in one read."""

import gzip
import io

import pytest

from sandboxd.e2b.upload import (
    FILES_MAX,
    HEADERS_MAX,
    INFLATE_FLOOR,
    INFLATE_RATIO_MAX,
    Inflating,
    MultipartReader,
    Upload,
    boundary_of,
    inflate_limit,
)
from sandboxd.e2b.wire import RestError

CHUNKS = [1, 3, 7, 1 << 20]
"""Bytes a source gives at most per read."""


class Trickle(io.BytesIO):
    """A stored body that gives at most ``most`` bytes a read."""

    def __init__(self, data: bytes, most: int) -> None:
        super().__init__(data)
        self.most = most

    def read(self, size: int | None = -1, /) -> bytes:
        return super().read(self.most if size is None or size < 0 else min(size, self.most))


def read_all(source: Inflating, size: int = 1 << 20) -> bytes:
    out = b""
    while data := source.read(size):
        out += data
    return out


def multipart_files(
    body: bytes, content_type: str, most: int = 1 << 20, size: int = -1
) -> list[tuple[str | None, bytes]]:
    reader = MultipartReader(Trickle(body, most), boundary_of(content_type))
    found = []
    while (part := reader.next_part()) is not None:
        data = b""
        while chunk := part.read(size):
            data += chunk
        found.append((part.filename, data))
    return found


def multipart(*parts: bytes, boundary: bytes = b"b0und") -> bytes:
    body = b"".join(b"--" + boundary + b"\r\n" + part + b"\r\n" for part in parts)
    return body + b"--" + boundary + b"--\r\n"


# Multipart


def test_the_boundary_is_found_among_other_parameters() -> None:
    body = multipart(b'Content-Disposition: form-data; name="file"; filename="a"\r\n\r\nA')
    content_type = 'multipart/form-data; charset=utf-8; boundary="b0und"'
    assert multipart_files(body, content_type) == [("a", b"A")]


def test_a_parts_name_is_its_content_dispositions_filename_whatever_the_other_headers() -> None:
    named = (
        b"Content-Type: text/plain\r\n"
        b'Content-Disposition: form-data; name="file"; filename="dir/b.txt"\r\n\r\nB'
    )
    unnamed = b'Content-Disposition: form-data; name="file"\r\nContent-Type: text/plain\r\n\r\nC'
    found = multipart_files(multipart(named, unnamed), "multipart/form-data; boundary=b0und")
    assert found == [("dir/b.txt", b"B"), (None, b"C")]  # unnamed: the path query names it


def test_a_multipart_type_without_a_boundary_is_400() -> None:
    with pytest.raises(RestError) as raised:
        boundary_of("multipart/form-data; charset=utf-8; boundary=")
    assert raised.value.status == 400 and "boundary" in raised.value.message


TWO_PARTS = (
    b"a preamble\r\n"
    b'--B\r\nContent-Disposition: form-data; name="file"; filename="/home/user/a"\r\n'
    b"Content-Type: text/plain\r\n\r\none\r\n-- --B\r\n\r"
    b'\r\n--B\r\nContent-Disposition: form-data; name="file"; filename="b"\r\n\r\n\r\n'
    b"--B--\r\nan epilogue, ignored\r\n--B\r\n"
)
"""Two parts whose bytes hold what a delimiter begins with; a preamble and an epilogue."""


@pytest.mark.parametrize("most", CHUNKS)
@pytest.mark.parametrize("size", [1, 5, -1])
def test_parts_are_read_whatever_the_sizes_of_the_reads(most: int, size: int) -> None:
    found = multipart_files(TWO_PARTS, "multipart/form-data; boundary=B", most, size)
    assert found == [("/home/user/a", b"one\r\n-- --B\r\n\r"), ("b", b"")]


@pytest.mark.parametrize("most", CHUNKS)
def test_a_part_left_unread_is_skipped_by_the_next(most: int) -> None:
    reader = MultipartReader(Trickle(TWO_PARTS, most), b"B")
    first = reader.next_part()
    assert first is not None and first.read(1) == b"o"
    second = reader.next_part()
    assert second is not None and second.filename == "b"
    assert first.read(10) == b""  # its reader is past it
    assert reader.next_part() is None and reader.next_part() is None


def test_a_part_without_headers_has_no_name() -> None:
    assert multipart_files(b"--B\r\n\r\ndata\r\n--B--", "multipart/form-data; boundary=B") == [
        (None, b"data")
    ]


@pytest.mark.parametrize("most", CHUNKS)
@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"--B\r\nno end", "without headers"),
        (b"--B\r\nx\r\n--B--", "without headers"),
        (b"--B\r\nx\r\n--B\r\nContent-Disposition: x\r\n\r\nA\r\n--B--", "without headers"),
        (b"--Bjunk\r\n--B--", "malformed multipart part"),
        (b"--B\r\nA: b\r\n\r\ncut short", "cut short"),
        (b"no delimiter at all", "cut short"),
        (b"", "cut short"),
        (b"--B--\r\n", "without a part"),
        (b"--B\r\n" + b"A: b\r\n" * (HEADERS_MAX // 6 + 1) + b"\r\nA\r\n--B--", "headers are over"),
    ],
)
def test_a_malformed_multipart_body_is_400(body: bytes, said: str, most: int) -> None:
    with pytest.raises(RestError) as raised:
        multipart_files(body, "multipart/form-data; boundary=B", most)
    assert raised.value.status == 400 and said in raised.value.message


# Gzip


def test_the_inflate_limit_is_a_ratio_of_the_body_within_the_size_bound() -> None:
    assert inflate_limit(1 << 20, 1 << 40) == INFLATE_RATIO_MAX << 20
    assert inflate_limit(10, 1 << 40) == INFLATE_FLOOR  # a small body of a very compressible file
    assert inflate_limit(1 << 20, 5 << 20) == 5 << 20  # SANDBOXD_MAX_BODY, the disk limit


@pytest.mark.parametrize("most", CHUNKS)
def test_a_gzip_body_inflates_up_to_its_bound_and_no_further(most: int) -> None:
    assert read_all(Inflating(Trickle(gzip.compress(b"x" * 10), most), 10)) == b"x" * 10
    with pytest.raises(RestError) as raised:
        read_all(Inflating(Trickle(gzip.compress(b"x" * 11), most), 10))
    assert raised.value.status == 413 and "10 bytes" in raised.value.message


@pytest.mark.parametrize("size", [1, 7, -1])
def test_a_gzip_body_is_read_whatever_the_sizes_of_the_reads(size: int) -> None:
    data = bytes(range(256)) * 20 + b"\0" * 30_000
    assert read_all(Inflating(io.BytesIO(gzip.compress(data)), 1 << 30), size) == data


def test_a_corrupt_or_truncated_gzip_body_is_400() -> None:
    for body in (b"not gzip", gzip.compress(b"x" * 100)[:-8], b""):
        with pytest.raises(RestError) as raised:
            read_all(Inflating(io.BytesIO(body), 1 << 20))
        assert raised.value.status == 400, body


@pytest.mark.parametrize("most", CHUNKS)
def test_a_gzip_body_of_several_members_inflates_to_all_of_them_in_turn(most: int) -> None:
    body = gzip.compress(b"first ") + gzip.compress(b"second") + b"\0" * 4
    assert read_all(Inflating(Trickle(body, most), 100)) == b"first second"
    with pytest.raises(RestError) as raised:
        read_all(Inflating(Trickle(gzip.compress(b"x" * 6) + gzip.compress(b"y" * 5), most), 10))
    assert raised.value.status == 413


def test_a_gzip_body_followed_by_other_bytes_is_400() -> None:
    for body in (gzip.compress(b"x") + b"garbage", gzip.compress(b"x") + gzip.compress(b"y")[:-3]):
        with pytest.raises(RestError) as raised:
            read_all(Inflating(io.BytesIO(body), 100))
        assert raised.value.status == 400, body


# The files of an upload


def files_of(upload: Upload) -> list[tuple[str, bytes]]:
    found = []
    while (next_file := upload.next_file()) is not None:
        place, source = next_file
        found.append((place.display, read_all(source)))  # type: ignore[arg-type]
    return found


def test_an_octet_stream_upload_is_one_file_at_its_path() -> None:
    upload = Upload("application/octet-stream", False, "a/b", io.BytesIO(b"data"), 1 << 20)
    assert files_of(upload) == [("/home/user/a/b", b"data")]
    assert upload.next_file() is None
    with pytest.raises(RestError) as raised:
        files_of(Upload("application/octet-stream", False, None, io.BytesIO(b"x"), 1 << 20))
    assert raised.value.status == 400 and "path" in raised.value.message


def test_a_gzip_uploads_bound_is_its_ratio_within_the_size_bound() -> None:
    body = io.BytesIO(gzip.compress(b"x" * 2000))
    assert files_of(Upload("", True, "/tmp/x", body, 2000)) == [("/tmp/x", b"x" * 2000)]
    body = io.BytesIO(gzip.compress(b"x" * 2000))
    with pytest.raises(RestError) as raised:
        files_of(Upload("", True, "/tmp/x", body, 1999))
    assert raised.value.status == 413


def test_a_multipart_uploads_parts_go_to_their_names_or_all_to_the_path() -> None:
    body = multipart(
        b'Content-Disposition: form-data; name="file"; filename="a"\r\n\r\nA',
        b'Content-Disposition: form-data; name="file"; filename="/tmp/b"\r\n\r\nB',
    )
    content_type = "multipart/form-data; boundary=b0und"
    upload = Upload(content_type, False, None, io.BytesIO(body), 1 << 20)
    assert files_of(upload) == [("/home/user/a", b"A"), ("/tmp/b", b"B")]
    upload = Upload(content_type, False, "c", io.BytesIO(body), 1 << 20)
    assert upload.next_file() is not None
    with pytest.raises(RestError) as raised:  # as envd: the first part is written, not the next
        upload.next_file()
    assert raised.value.status == 400
    assert raised.value.message.startswith(
        "you cannot upload multiple files to the same path '/home/user/c' in one upload request"
    )


def test_a_multipart_upload_past_its_files_is_400_after_writing_the_first() -> None:
    """A body of many tiny parts keeps what the front holds of them (each file's place and
    line of the answer) to :data:`FILES_MAX` of them, not ~6 bytes per byte of body."""
    parts = [
        b"Content-Disposition: form-data; filename=f%d\r\n\r\n" % i for i in range(FILES_MAX + 1)
    ]
    upload = Upload(
        "multipart/form-data; boundary=b0und", False, None, io.BytesIO(multipart(*parts)), 1
    )
    for _ in range(FILES_MAX):
        assert upload.next_file() is not None
    with pytest.raises(RestError) as raised:
        upload.next_file()
    assert raised.value.status == 400
    assert raised.value.message.startswith(f"an upload holds at most {FILES_MAX} files")
