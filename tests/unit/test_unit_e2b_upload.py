"""``sandboxd.e2b.upload``'s parsing of ``/files`` bodies: multipart parts and their file
names, and gzip bodies with their bound."""

import gzip

import pytest

from sandboxd.e2b.upload import inflate, multipart_files
from sandboxd.e2b.wire import RestError


def multipart(*parts: bytes, boundary: bytes = b"b0und") -> bytes:
    body = b"".join(b"--" + boundary + b"\r\n" + part + b"\r\n" for part in parts)
    return body + b"--" + boundary + b"--\r\n"


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
        multipart_files(b"", "multipart/form-data; charset=utf-8; boundary=")
    assert raised.value.status == 400 and "boundary" in raised.value.message


def test_a_gzip_body_inflates_up_to_its_bound_and_no_further() -> None:
    assert inflate(gzip.compress(b"x" * 10), limit=10) == b"x" * 10
    with pytest.raises(RestError) as raised:
        inflate(gzip.compress(b"x" * 11), limit=10)
    assert raised.value.status == 413 and "10 bytes" in raised.value.message


def test_a_corrupt_or_truncated_gzip_body_is_400() -> None:
    for body in (b"not gzip", gzip.compress(b"x" * 100)[:-8]):
        with pytest.raises(RestError) as raised:
            inflate(body)
        assert raised.value.status == 400, body


def test_a_gzip_body_of_several_members_inflates_to_all_of_them_in_turn() -> None:
    body = gzip.compress(b"first ") + gzip.compress(b"second") + b"\0" * 4
    assert inflate(body) == b"first second"
    with pytest.raises(RestError) as raised:
        inflate(gzip.compress(b"x" * 6) + gzip.compress(b"y" * 5), limit=10)
    assert raised.value.status == 413


def test_a_gzip_body_followed_by_other_bytes_is_400() -> None:
    for body in (gzip.compress(b"x") + b"garbage", gzip.compress(b"x") + gzip.compress(b"y")[:-3]):
        with pytest.raises(RestError) as raised:
            inflate(body)
        assert raised.value.status == 400, body
