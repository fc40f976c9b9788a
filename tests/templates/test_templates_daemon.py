"""Templates through a real daemon's port: import, list, show, delete, the answers to bad
names, bad archives and archives past ``SANDBOXD_TEMPLATE_MAX``, the bearer token, and a
daemon killed in the middle of an import."""

import contextlib
import json
import os
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, start_daemon, stop_daemon
from tests.templates.archives import directory, file, link, oci_archive, tar

ROOTFS = tar([directory("etc"), file("etc/os-release", b"ID=made-here\n"), link("bin", "usr/bin")])


def error_of(
    daemon: Daemon, method: str, path: str, raw: bytes | None = None
) -> tuple[int, str, str]:
    status, body = daemon.call(method, path, raw=raw)
    answer = json.loads(body)
    return status, answer["error"], answer["detail"]


def test_healthz_lists_the_templates_capability(daemon: Daemon) -> None:
    assert "templates" in daemon.json("GET", "/healthz")["capabilities"]
    assert not (daemon.root / ".templates").exists()  # made by the first import


def test_a_template_is_imported_listed_shown_and_deleted(daemon: Daemon) -> None:
    status, body = daemon.call("PUT", "/templates/base:1.0", raw=ROOTFS)
    assert status == 201
    template = json.loads(body)
    assert template["name"] == "base:1.0"
    assert template["digest"].startswith("sha256:") and len(template["digest"]) == 71
    assert (template["size"], template["env"], template["workdir"]) == (
        len(b"ID=made-here\n"),
        {},
        "/",
    )
    assert time.time() - 60 < template["created"] <= time.time()
    files = daemon.root / ".templates" / "base:1.0" / "rootfs"
    assert (files / "etc/os-release").read_bytes() == b"ID=made-here\n"
    assert daemon.json("GET", "/templates") == {"templates": [template]}
    assert daemon.json("GET", "/templates/base:1.0") == template

    assert error_of(daemon, "PUT", "/templates/base:1.0", ROOTFS)[:2] == (409, "Conflict")
    assert daemon.call("DELETE", "/templates/base:1.0") == (204, b"")
    assert not (daemon.root / ".templates" / "base:1.0").exists()
    assert daemon.json("GET", "/templates") == {"templates": []}


def test_a_create_in_a_template_is_refused_where_templates_cannot_run(daemon: Daemon) -> None:
    assert error_of(daemon, "POST", "/sandboxes", b'{"template": "nope"}') == (
        404,
        "TemplateNotFound",
        "no template named 'nope'",
    )
    assert error_of(daemon, "POST", "/sandboxes", b'{"template": 7}')[:2] == (400, "BadRequest")
    assert daemon.call("PUT", "/templates/base", raw=ROOTFS)[0] == 201
    status, kind, detail = error_of(daemon, "POST", "/sandboxes", b'{"template": "base"}')
    assert (status, kind) == (501, "NotImplemented")
    assert "this replica cannot run sandboxes in templates" in detail
    assert "templates.run" not in daemon.json("GET", "/healthz")["capabilities"]
    assert daemon.json("GET", "/sandboxes") == {"sandboxes": []}
    assert daemon.call("POST", "/sandboxes", raw=b'{"template": null}')[0] == 200


def test_an_oci_image_keeps_its_env_and_workdir(daemon: Daemon) -> None:
    layer = tar([file("app/main.py", b"print('hi')\n")], "gz")
    config = {"config": {"Env": ["PATH=/usr/bin", "MODE=test"], "WorkingDir": "/app"}}
    status, body = daemon.call("PUT", "/templates/app", raw=oci_archive([layer], config))
    assert status == 201, body
    assert json.loads(body)["env"] == {"PATH": "/usr/bin", "MODE": "test"}
    assert json.loads(body)["workdir"] == "/app"


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_an_unknown_template_is_a_404_naming_it(daemon: Daemon, method: str) -> None:
    assert error_of(daemon, method, "/templates/nope") == (
        404,
        "TemplateNotFound",
        "no template named 'nope'",
    )


@pytest.mark.parametrize("name", ["Upper", ".hidden", "a:b:c", "-lead"])
def test_a_bad_name_is_refused(daemon: Daemon, name: str) -> None:
    status, kind, detail = error_of(daemon, "PUT", f"/templates/{name}", ROOTFS)
    assert (status, kind) == (400, "BadRequest")
    assert name in detail


def test_a_bad_archive_is_a_400_naming_the_member_and_leaves_nothing(daemon: Daemon) -> None:
    hostile = tar([file("fine", b"x"), file("../../escaped", b"evil")])
    assert error_of(daemon, "PUT", "/templates/hostile", hostile) == (
        400,
        "BadRequest",
        "member '../../escaped': its path holds '..'",
    )
    assert os.listdir(daemon.root / ".templates") == []
    assert error_of(daemon, "GET", "/templates/hostile")[0] == 404


def test_an_archive_past_the_limit_is_a_413(daemon: Daemon) -> None:
    big = tar([file("big", b"b" * (65 << 10))])
    status, kind, detail = error_of(daemon, "PUT", "/templates/big", big)
    assert (status, kind) == (413, "TooLarge")
    assert "member 'big'" in detail and "SANDBOXD_TEMPLATE_MAX" in detail
    assert os.listdir(daemon.root / ".templates") == []


def test_the_template_routes_need_the_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    running = start_daemon(tmp_path, "--isolation=none", f"--token-file={token}")
    try:
        for method, path in [
            ("GET", "/templates"),
            ("PUT", "/templates/x"),
            ("DELETE", "/templates/x"),
        ]:
            assert error_of(running, method, path, b"" if method == "PUT" else None)[0] == 401
        request = urllib.request.Request(
            running.url + "/templates", headers={"Authorization": "Bearer s3cret"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.loads(answer.read()) == {"templates": []}
    finally:
        stop_daemon(running)


def test_an_import_goes_on_after_its_client_left(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--isolation=none")
    try:
        import_and_leave(daemon)
    finally:
        stop_daemon(daemon)


def import_and_leave(daemon: Daemon) -> None:
    many = tar([file(f"d{n // 1000}/f{n}", b"x" * 10) for n in range(20000)])
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as client:
        head = f"PUT /templates/left HTTP/1.1\r\nHost: x\r\nContent-Length: {len(many)}\r\n\r\n"
        client.sendall(head.encode() + many)
        deadline = time.monotonic() + 30
        store = daemon.root / ".templates"
        while not store.is_dir() or not any(n.startswith(".import-") for n in os.listdir(store)):
            assert time.monotonic() < deadline, "the import never started"
            time.sleep(0.005)
    # the client is gone (its request's content closed); the import still completes
    deadline = time.monotonic() + 60
    while daemon.call("GET", "/templates/left")[0] != 200:
        assert time.monotonic() < deadline, daemon.log.read_text()[-2000:]
        time.sleep(0.05)
    assert daemon.json("GET", "/templates/left")["size"] == 200000
    assert "Unhandled" not in daemon.log.read_text()


def send_until_killed(daemon: Daemon, archive: bytes) -> None:
    with contextlib.suppress(OSError):  # the daemon is killed before it answers
        daemon.call("PUT", "/templates/many", raw=archive)


def test_a_daemon_killed_mid_import_leaves_nothing_after_its_restart(tmp_path: Path) -> None:
    many = tar([file(f"d{n // 1000}/f{n}", b"x" * 100) for n in range(30000)])
    running = start_daemon(tmp_path, "--isolation=none")
    store = running.root / ".templates"
    sender = threading.Thread(target=send_until_killed, args=(running, many), daemon=True)
    try:
        sender.start()
        deadline = time.monotonic() + 60
        while not store.is_dir() or not any(n.startswith(".import-") for n in os.listdir(store)):
            assert time.monotonic() < deadline, "the import never started"
            time.sleep(0.005)
        running.process.send_signal(signal.SIGKILL)
        running.process.wait(30)
        left = [name for name in os.listdir(store) if name.startswith(".import-")]
        assert left, "the import finished before the daemon was killed"
    finally:
        if running.process.poll() is None:
            running.process.kill()  # not stop_daemon: it would remove the state root
        running.process.wait(30)
    sender.join(30)
    restarted = start_daemon(tmp_path, "--isolation=none")
    try:
        assert os.listdir(store) == []
        assert restarted.json("GET", "/templates") == {"templates": []}
        assert "removing" in restarted.log.read_text()
    finally:
        stop_daemon(restarted)
