"""Kill racing the calls already in flight: nothing may survive a kill.

Found by driving kills against concurrent uploads (see :func:`test_kill_racing_uploads`): a
file call already in a worker thread could create entries (an upload's parent directories and
temporary file) while the kill's ``rmtree`` ran, which then failed silently and left the
sandbox's directory behind. Kill now waits for the file calls in flight before removing
anything; :func:`test_kill_waits_for_file_calls_in_flight` pins that down deterministically.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from sandboxd.isolation.base import Identity
from tests.lifecycle.lifecycle_harness import (
    BASE,
    InProcessDaemon,
    build_daemon,
    pause,
    spin,
    spin_until,
    synchronously,
)
from tests.lifecycle.lifecycle_variants import NONE_SETTINGS

RACES = int(os.environ.get("SANDBOXD_LIFECYCLE_RACES", "40"))


class HeldFiles:
    """``FsCredentials`` that holds every call until :meth:`release` runs it (inline)."""

    def __init__(self) -> None:
        self.held: list[tuple[Callable[[], Any], Deferred[Any]]] = []

    def run(self, identity: Identity, work: Callable[[], Any]) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.held.append((work, d))
        return d

    def release(self) -> None:
        while self.held:
            work, d = self.held.pop(0)
            try:
                result = work()
            except BaseException:
                d.errback(Failure())
            else:
                d.callback(result)


def test_kill_waits_for_file_calls_in_flight() -> Deferred[None]:
    def body() -> None:
        daemon = build_daemon(NONE_SETTINGS)
        try:
            held = HeldFiles()
            daemon.manager.isolation = attrs.evolve(daemon.isolation, fs=held)
            rid = daemon.request("POST", "/sandboxes", body={}).json()["remote_id"]
            upload = daemon.stub.request(
                "PUT", f"{BASE}/sandboxes/{rid}/file", params={"path": "a/b/c/f"}, data=b"data"
            )
            spin_until(lambda: bool(held.held), daemon.stub)
            kill = daemon.stub.request("DELETE", f"{BASE}/sandboxes/{rid}")
            answered: list[object] = []
            kill.addBoth(lambda r: (answered.append(r), r)[1])  # type: ignore[func-returns-value]
            for _ in range(20):
                daemon.stub.flush()
                pause()
            assert not answered, "kill answered while a file call was still in flight"
            assert daemon.request("GET", "/sandboxes").json() == {"sandboxes": []}
            reply = daemon.request("GET", f"/sandboxes/{rid}/ready")
            assert reply.error() == (404, "SandboxNotFound")
            assert os.path.isdir(daemon.layout.workspace(rid))

            held.release()
            assert spin(upload, daemon.stub).code == 204
            assert spin(kill, daemon.stub).code == 204
            assert not os.path.exists(daemon.layout.directory(rid))
            assert daemon.isolation.uids.free == daemon.isolation.uids.total
        finally:
            daemon.close()

    return synchronously(body)


@pytest.mark.parametrize(
    "variant", ["none_daemon", pytest.param("kernel_daemon", marks=pytest.mark.kernel)]
)
def test_kill_racing_uploads(variant: str, request: pytest.FixtureRequest) -> Deferred[None]:
    """Uploads that create deep directories, then a kill at once: never a leftover."""
    make_daemon: Callable[[], InProcessDaemon] = request.getfixturevalue(variant)

    def body() -> None:
        daemon = make_daemon()
        answers: dict[int, int] = {}
        try:
            for _ in range(RACES):
                rid = daemon.request("POST", "/sandboxes", body={}).json()["remote_id"]
                uploads = [
                    daemon.stub.request(
                        "PUT",
                        f"{BASE}/sandboxes/{rid}/file",
                        params={"path": "/".join(f"d{k}{j}" for j in range(8)) + "/f"},
                        data=b"x" * 200_000,
                    )
                    for k in range(3)
                ]
                daemon.stub.flush()
                kill = daemon.stub.request("DELETE", f"{BASE}/sandboxes/{rid}")
                for d in uploads:
                    code = spin(d, daemon.stub).code
                    answers[code] = answers.get(code, 0) + 1
                assert spin(kill, daemon.stub).code == 204
                left = [p for p, _, _ in os.walk(daemon.layout.directory(rid))]
                assert left == [], f"left behind by the kill: {left[:5]}"
            assert daemon.isolation.uids.free == daemon.isolation.uids.total
            assert set(answers) <= {204, 404}, answers
        finally:
            daemon.close()

    return synchronously(body)
