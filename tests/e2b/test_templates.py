"""``Sandbox.create(template=...)`` of the unmodified E2B SDK (docs/e2b.rst, "Templates"): a
template imported through the native API, a sandbox of the real isolation made from it by the
SDK, its commands and files in the template's root (as root; skipped as a user)."""

import json
import urllib.request
from collections.abc import Iterator

import pytest
from e2b import NotFoundException, Sandbox, SandboxException

from tests.e2b.conftest import TOKEN, E2BDaemon, point_sdk_at
from tests.e2b.test_errors import call
from tests.templates.rootfs import OS_RELEASE, rootfs


def native(front: E2BDaemon, method: str, path: str, data: bytes | None = None) -> int:
    """A call of the daemon's native API with the token: its status."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    request = urllib.request.Request(front.daemon.url + path, data, headers, method=method)
    with urllib.request.urlopen(request, timeout=60) as response:
        return int(response.status)


@pytest.fixture
def templated(monkeypatch: pytest.MonkeyPatch, isolated_front: E2BDaemon) -> Iterator[E2BDaemon]:
    front = point_sdk_at(monkeypatch, isolated_front)
    assert native(front, "PUT", "/templates/e2b-busybox", rootfs("/bin/bash")) == 201
    try:
        yield front
    finally:
        assert native(front, "DELETE", "/templates/e2b-busybox") == 204


def test_the_sdk_creates_a_sandbox_from_a_template(templated: E2BDaemon) -> None:
    # No network: egress is one per host, and other daemons may hold it.
    sbx = Sandbox.create(template="e2b-busybox", timeout=120, allow_internet_access=False)
    try:
        assert sbx.commands.run("whoami").stdout.strip() == "user"
        assert sbx.commands.run("cat /etc/os-release").stdout.encode() == OS_RELEASE
        sbx.files.write("/home/user/note.txt", "from the sdk")
        assert sbx.commands.run("cat note.txt", cwd="/home/user").stdout == "from the sdk"
        assert sbx.commands.run("test -e /usr/bin/python3 || echo absent").stdout == "absent\n"
        listed = [info.sandbox_id for info in Sandbox.list().next_items()]
        assert sbx.sandbox_id in listed
    finally:
        sbx.kill()


def test_an_unknown_template_is_named(templated: E2BDaemon) -> None:
    with pytest.raises((NotFoundException, SandboxException), match="no template named 'nope'"):
        Sandbox.create(template="nope", allow_internet_access=False)


def test_a_template_id_that_is_no_name_is_refused(templated: E2BDaemon) -> None:
    status, _, body = call(
        templated,
        "POST",
        "/sandboxes",
        json.dumps({"templateID": 7}).encode(),
        {"X-API-Key": TOKEN, "Content-Type": "application/json"},
    )
    assert status == 400 and "templateID: must be a template's name" in body["message"]
