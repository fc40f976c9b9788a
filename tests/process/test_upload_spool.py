"""A large upload of unknown length (chunked) through a real daemon, whose spool is written in
its ``sandboxd-spool`` threads: the bytes arrive exact, and no spool is left open."""

import hashlib
import http.client
import os
import stat
from collections.abc import Iterator

from tests.support.daemon import Daemon

TOTAL = 96 << 20
PIECE = 300_007
"""Bytes per chunk of the body: odd, so that no write lines up with a page or a read."""


def pieces() -> Iterator[bytes]:
    """Deterministic data whose every piece differs (a misplaced one changes the digest)."""
    sent = 0
    index = 0
    while sent < TOTAL:
        size = min(PIECE, TOTAL - sent)
        yield (index.to_bytes(4, "big") * (size // 4 + 1))[:size]
        sent += size
        index += 1


def open_files(daemon: Daemon) -> list[str]:
    """What the daemon's descriptors in its state root are open on, bar directories (a spool
    shows as ``#inode (deleted)`` until linked, then as the uploaded file)."""
    fds = f"/proc/{daemon.process.pid}/fd"
    root = os.path.realpath(daemon.root)
    found = []
    for fd in os.listdir(fds):
        try:
            target = os.readlink(os.path.join(fds, fd))
            directory = stat.S_ISDIR(os.stat(os.path.join(fds, fd)).st_mode)
        except OSError:
            continue  # closed meanwhile
        if target.startswith(root) and not directory:
            found.append(target)
    return found


def test_a_chunked_upload_arrives_exact_and_leaves_no_spool(daemon: Daemon) -> None:
    rid = daemon.create()
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=120)
    connection.request(
        "PUT",
        f"/sandboxes/{rid}/file?path=chunked.bin",
        body=pieces(),
        headers={"Content-Type": "application/octet-stream"},
        encode_chunked=True,
    )
    response = connection.getresponse()
    assert response.status == 204, response.read()
    response.read()
    connection.request("GET", f"/sandboxes/{rid}/file?path=chunked.bin")
    response = connection.getresponse()
    assert response.status == 200
    received = hashlib.sha256()
    while chunk := response.read(1 << 20):
        received.update(chunk)
    connection.close()
    sent = hashlib.sha256()
    for piece in pieces():
        sent.update(piece)
    assert received.hexdigest() == sent.hexdigest()
    lock = os.path.join(os.path.realpath(daemon.root), ".lock")
    assert [f for f in open_files(daemon) if f != lock] == []  # neither spool nor upload
