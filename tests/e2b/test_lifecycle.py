"""The control plane through the unmodified SDK: create, connect, get, list, timeout, kill,
and the API key."""

import json
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from e2b import AuthenticationException, Sandbox, SandboxException, SandboxNotFoundException

from tests.e2b.conftest import E2BDaemon


def test_create_get_list_timeout_kill(e2b_daemon: E2BDaemon) -> None:
    sbx = Sandbox.create(timeout=60, metadata={"job": "a b&c"}, envs={"GREETING": "hi"})
    other = Sandbox.create(timeout=60)
    try:
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id and info.template_id == "base"
        assert info.metadata == {"job": "a b&c"}
        assert sbx.commands.run("echo $GREETING").stdout == "hi\n"
        listed = Sandbox.list(query=None).next_items()
        assert {s.sandbox_id for s in listed} >= {sbx.sandbox_id, other.sandbox_id}
        from e2b import SandboxQuery

        found = Sandbox.list(query=SandboxQuery(metadata={"job": "a b&c"})).next_items()
        assert [s.sandbox_id for s in found] == [sbx.sandbox_id]
        pages = Sandbox.list(limit=1)
        first = pages.next_items()
        assert len(first) == 1 and pages.has_next
        second = pages.next_items()
        assert len(second) == 1 and second[0].sandbox_id != first[0].sandbox_id
        before = info.end_at
        sbx.set_timeout(600)
        assert sbx.get_info().end_at > before
        again = Sandbox.connect(sbx.sandbox_id, timeout=900)
        assert again.get_info().end_at > sbx.get_info().started_at + __import__(
            "datetime"
        ).timedelta(seconds=800)
        assert again.commands.run("echo back").stdout == "back\n"
        assert sbx.is_running()
    finally:
        other.kill()
    assert sbx.kill() is True
    assert not sbx.is_running()
    assert Sandbox.kill(sbx.sandbox_id) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id)
    with pytest.raises(SandboxNotFoundException):
        sbx.set_timeout(10)


def test_timeout_kills_the_sandbox(e2b_daemon: E2BDaemon) -> None:
    sbx = Sandbox.create(timeout=1)
    handle = sbx.commands.run("sleep 30", background=True, timeout=0)
    from e2b import SandboxNotRunningException

    with pytest.raises((SandboxNotRunningException, SandboxException)):
        handle.wait()
    assert not sbx.is_running()


def test_healthz_lists_the_front(e2b_daemon: E2BDaemon) -> None:
    status, body = e2b_daemon.daemon.call("GET", "/healthz")
    assert status == 200 and "e2b" in json.loads(body)["capabilities"]


def test_wrong_api_key_is_refused(e2b_daemon: E2BDaemon) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-the-token")
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="not-the-token").next_items()


def test_unsupported_features_say_so(e2b_daemon: E2BDaemon) -> None:
    with pytest.raises(SandboxException, match="only the default template"):
        Sandbox.create(template="python-3.12")
    sbx = Sandbox.create(timeout=60)
    try:
        with pytest.raises(Exception, match="not supported by sandboxd"):
            sbx.pause()
    finally:
        sbx.kill()


def test_native_sandboxes_are_not_reachable(e2b_daemon: E2BDaemon) -> None:
    native = e2b_daemon.daemon
    request = urllib.request.Request(
        native.url + "/sandboxes",
        data=b"{}",
        method="POST",
        headers={"Authorization": "Bearer e2b-test-token"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        rid = json.loads(response.read())["remote_id"]
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(rid)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(rid)


def test_no_internet_access_is_network_mode_none(any_daemon: E2BDaemon) -> None:
    """``allow_internet_access=False`` asks for the ``none`` network mode: the sandbox has
    its own loopback only; a replica without network namespaces refuses the create."""
    if not any_daemon.isolated:
        with pytest.raises(SandboxException, match="network mode none is not offered"):
            Sandbox.create(timeout=30, allow_internet_access=False)
        return
    sbx = Sandbox.create(timeout=30, allow_internet_access=False)
    try:
        lines = sbx.commands.run("cat /proc/net/dev").stdout.splitlines()[2:]
        assert [line.split(":")[0].strip() for line in lines] == ["lo"]
    finally:
        sbx.kill()


def test_a_sandbox_killed_by_other_means_is_gone(e2b_daemon: E2BDaemon) -> None:
    """Killed through the native API (as the idle reaper or a drain would): the E2B front
    forgets it, and its envd calls answer "not running"."""
    from e2b import SandboxNotRunningException

    sbx = Sandbox.create(timeout=60)
    request = urllib.request.Request(
        f"{e2b_daemon.daemon.url}/sandboxes/{sbx.sandbox_id}",
        method="DELETE",
        headers={"Authorization": "Bearer e2b-test-token"},
    )
    urllib.request.urlopen(request, timeout=30).close()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id)
    with pytest.raises(SandboxNotRunningException):
        sbx.files.read("x")
    assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]


def test_without_a_token_any_key_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``SANDBOXD_TOKEN_FILE``: the front takes any API key, and the daemon says so."""
    from tests.support.daemon import free_port, start_daemon, stop_daemon

    port = free_port()
    daemon = start_daemon(
        tmp_path, f"--e2b-listen=tcp:{port}:interface=127.0.0.1", "--isolation=none"
    )
    try:
        url = f"http://127.0.0.1:{port}"
        monkeypatch.setenv("E2B_API_URL", url)
        monkeypatch.setenv("E2B_SANDBOX_URL", url)
        sbx = Sandbox.create(api_key="anything", timeout=30)
        assert sbx.commands.run("echo open").stdout == "open\n"
        sbx.kill()
        assert "any X-API-Key is accepted" in daemon.log.read_text()
    finally:
        stop_daemon(daemon)


def test_the_older_routes_create_and_list(e2b_daemon: E2BDaemon) -> None:
    """``POST /sandboxes`` and ``GET /sandboxes``, as e2b 2.45 creates and lists, through the
    official package's own generated client for them."""
    from e2b import ConnectionConfig
    from e2b.api import ApiClient
    from e2b.api.client.api.sandboxes import get_sandboxes, post_sandboxes
    from e2b.api.client.models import NewSandbox
    from e2b.api.client.models import Sandbox as SandboxModel

    client = ApiClient(ConnectionConfig())
    body = NewSandbox(template_id="base", timeout=60, env_vars={"OLD": "route"})
    created = post_sandboxes.sync_detailed(client=client, body=body)
    assert created.status_code == 201
    assert isinstance(created.parsed, SandboxModel)
    sbx = Sandbox.connect(created.parsed.sandbox_id)
    try:
        assert sbx.commands.run("echo $OLD").stdout == "route\n"
        listed = get_sandboxes.sync(client=client)
        assert isinstance(listed, list)
        assert sbx.sandbox_id in [s.sandbox_id for s in listed]
    finally:
        sbx.kill()


def test_connect_never_shortens_a_running_sandboxs_life(e2b_daemon: E2BDaemon) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        before = Sandbox.get_info(sbx.sandbox_id).end_at
        Sandbox.connect(sbx.sandbox_id, timeout=10)
        assert Sandbox.get_info(sbx.sandbox_id).end_at == before
        Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert Sandbox.get_info(sbx.sandbox_id).end_at > before
    finally:
        sbx.kill()


def test_list_is_newest_first_and_filters_as_e2b(e2b_daemon: E2BDaemon) -> None:
    from e2b import SandboxQuery, SandboxState

    tag = {"listing": f"run-{time.monotonic_ns()}"}
    older = Sandbox.create(timeout=60, metadata=tag)
    newer = Sandbox.create(timeout=60, metadata=tag)
    try:
        ids = [older.sandbox_id, newer.sandbox_id]

        def listed(**query: object) -> list[str]:
            found = Sandbox.list(query=SandboxQuery(metadata=tag, **query)).next_items()  # type: ignore[arg-type]
            return [s.sandbox_id for s in found]

        assert listed() == ids[::-1]
        ascending = Sandbox.list(query=SandboxQuery(metadata=tag), order="asc")
        assert [s.sandbox_id for s in ascending.next_items()] == ids
        started = Sandbox.get_info(newer.sandbox_id).started_at
        assert listed(started_after=started) == [newer.sandbox_id]
        assert listed(started_after=started + timedelta(seconds=1)) == []
        assert listed(template="base") == ids[::-1] and listed(template="other") == []
        assert listed(state=[SandboxState.RUNNING]) == ids[::-1]
        assert listed(state=[SandboxState.PAUSED]) == []
        pages = Sandbox.list(query=SandboxQuery(metadata=tag), limit=1)
        assert [s.sandbox_id for s in pages.next_items()] == [newer.sandbox_id]
        assert pages.has_next
        between = Sandbox.create(timeout=60, metadata=tag)  # made between two pages
        assert [s.sandbox_id for s in pages.next_items()] == [older.sandbox_id]
        assert not pages.has_next
        between.kill()
    finally:
        older.kill()
        newer.kill()
