"""Uploads and downloads of 1 GiB through a real daemon: streamed, memory flat, bytes exact."""

import hashlib
import http.client
from collections.abc import Iterator

from tests.support.daemon import Daemon

GIB = 1 << 30
CHUNK = 1 << 20


def pattern(total: int) -> Iterator[bytes]:
    """Deterministic, non-repeating-per-chunk data (so a misplaced chunk changes the digest)."""
    for index in range(total // CHUNK):
        yield index.to_bytes(8, "big") * (CHUNK // 8)


def test_one_gib_round_trip_keeps_daemon_memory_flat(daemon: Daemon) -> None:
    rid = daemon.create()
    baseline = daemon.rss_kib("VmHWM")

    sent = hashlib.sha256()

    def body() -> Iterator[bytes]:
        for chunk in pattern(GIB):
            sent.update(chunk)
            yield chunk

    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=120)
    connection.request(
        "PUT",
        f"/sandboxes/{rid}/file?path=big/blob.bin",
        body=body(),
        headers={"Content-Length": str(GIB), "Content-Type": "application/octet-stream"},
    )
    response = connection.getresponse()
    assert response.status == 204, response.read()
    response.read()

    connection.request("GET", f"/sandboxes/{rid}/file?path=/big/blob.bin")
    response = connection.getresponse()
    assert response.status == 200
    assert int(response.getheader("content-length") or 0) == GIB
    received = hashlib.sha256()
    total = 0
    while chunk := response.read(CHUNK):
        received.update(chunk)
        total += len(chunk)
    connection.close()
    assert total == GIB
    assert received.hexdigest() == sent.hexdigest()

    growth_mib = (daemon.rss_kib("VmHWM") - baseline) / 1024
    assert growth_mib < 16, f"daemon peak RSS grew by {growth_mib:.0f} MiB for 1 GiB each way"
    assert daemon.json("GET", f"/sandboxes/{rid}/size?path=big/blob.bin") == {"size": GIB}
