"""Signed ``/files`` URLs (``download_url``/``upload_url`` of the unmodified SDK), fetched
with no header at all, as a browser or ``curl`` would: the signature alone finds the sandbox
and authorises the one operation on the one path, until it expires."""

import json
import urllib.error
import urllib.request

import httpx
import pytest
from e2b import Sandbox

from tests.e2b.conftest import E2BDaemon


def fetch(url: str, data: bytes | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_signed_urls_work_for_their_sandbox_path_and_operation(e2b_daemon: E2BDaemon) -> None:
    sandbox, other = Sandbox.create(timeout=60), Sandbox.create(timeout=60)
    try:
        sandbox.files.write("signed.txt", "for the link")
        other.files.write("signed.txt", "another sandbox's")
        assert fetch(sandbox.download_url("signed.txt", "user")) == (200, b"for the link")
        assert fetch(sandbox.download_url("signed.txt")) == (200, b"for the link")
        assert fetch(other.download_url("signed.txt", "user", 120)) == (200, b"another sandbox's")

        upload = sandbox.upload_url("up/loaded.txt", use_signature_expiration=60)
        files = {"file": ("up/loaded.txt", b"uploaded by URL")}
        assert httpx.post(upload, files=files, timeout=30).status_code == 200
        assert sandbox.files.read("up/loaded.txt") == "uploaded by URL"

        expired = sandbox.download_url("signed.txt", "user", use_signature_expiration=-120)
        status, body = fetch(expired)
        assert (status, json.loads(body)) == (
            401,
            {"code": 401, "message": "signature is already expired"},
        )
        read_url = sandbox.download_url("signed.txt", "user")
        refused = [
            read_url.replace("signed.txt", "other.txt"),  # another path
            read_url.replace("username=user", "username=root"),  # another user
            read_url[:-2],  # a signature cut short
        ]
        for url in refused:
            status, body = fetch(url)
            assert (status, json.loads(body)["message"]) == (401, "invalid signature"), url
        status, body = fetch(read_url, data=b"")  # a read's signature, for a write
        assert (status, json.loads(body)["message"]) == (401, "invalid signature")
        named = {sandbox.sandbox_id: 200, other.sandbox_id: 401, "gone": 502}
        for sandbox_id, wanted in named.items():  # with the header, only that one is tried
            got = httpx.get(read_url, headers={"E2b-Sandbox-Id": sandbox_id}, timeout=30)
            assert got.status_code == wanted, sandbox_id
    finally:
        sandbox.kill()
        other.kill()
    status, body = fetch(read_url)  # its sandbox is gone
    assert (status, json.loads(body)["message"]) == (401, "invalid signature")


@pytest.mark.parametrize("query", ["signature_expiration=soon", ""])
def test_a_signed_url_with_a_token_header_or_a_bad_expiration(
    e2b_daemon: E2BDaemon, query: str
) -> None:
    """A malformed expiration is ``400``; with the ``X-Access-Token`` header the token is
    what counts (the signature is not looked at), as envd does."""
    sandbox = Sandbox.create(timeout=60)
    try:
        sandbox.files.write("f", "x")
        url = f"{e2b_daemon.url}/files?path=f&signature=v1_bogus&{query}"
        if query:
            status, body = fetch(url)
            assert (status, json.loads(body)["message"]) == (
                400,
                "signature_expiration: must be an integer",
            )
            return
        headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": "wrong"}
        status = httpx.get(url, headers=headers, timeout=30).status_code
        assert status == 401
        headers["X-Access-Token"] = sandbox._envd_access_token or ""
        assert httpx.get(url, headers=headers, timeout=30).content == b"x"
    finally:
        sandbox.kill()
