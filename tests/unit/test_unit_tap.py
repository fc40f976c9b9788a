"""``twistd sandboxd`` (``sandboxd.tap``): options, the service tree, start-up refusals.

The service tree is built with ``isolation=none`` listening on ``tcp:0`` on loopback, started
and stopped with the real reactor, and asked ``/healthz`` over real TCP.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
import treq
from twisted.application.internet import TimerService
from twisted.application.service import Application, IServiceCollection
from twisted.internet.defer import Deferred, fail
from twisted.logger import ILogObserver, globalLogPublisher

from sandboxd import assemble, boot, tap
from sandboxd.config import ConfigError
from sandboxd.core.manager import SandboxManager
from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.namespaces.pins import HOME_VIEW, Namespaces
from sandboxd.listen import Listeners
from sandboxd.options import option_table
from sandboxd.service import SWITCH_INTERVAL, ExitStatus, SandboxdService
from tests.support.fakes import fake_isolation


def options(*argv: str) -> tap.Options:
    parsed = tap.Options()
    parsed.parseOptions(list(argv))
    return parsed


def build(environ: dict[str, str], *argv: str) -> SandboxdService:
    from twisted.internet import reactor

    service = tap.makeService(options(*argv), reactor, environ)
    assert isinstance(service, SandboxdService)
    return service


def listener(service: SandboxdService) -> Listeners:
    (found,) = [s for s in service if isinstance(s, Listeners)]
    assert found is service.listeners
    return found


async def listening_url(service: SandboxdService) -> str:
    await service.started
    port = listener(service).ports[0]
    return f"http://127.0.0.1:{port.getHost().port}"


@pytest.fixture
def capture() -> Iterator[list[dict[str, Any]]]:
    """Every log event while the test runs."""
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        yield events
    finally:
        globalLogPublisher.removeObserver(events.append)


@pytest.fixture
def cpythons_switch_interval() -> Iterator[None]:
    """CPython's own switch interval (5 ms) for the test; the one before it afterwards."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_bytes(b"  t0ken-value \n")
    path.chmod(0o600)
    return path


# Options


def test_options_document_every_setting() -> None:
    usage = str(tap.Options())
    assert usage.startswith("Usage: twistd [twistd options] sandboxd [options]")
    for row in option_table():
        assert f"--{row[0]}" in usage


def test_options_parse() -> None:
    parsed = options("--max-output", "1K", "--isolation=none")
    assert parsed["max-output"] == "1K"
    assert parsed["isolation"] == "none"
    assert parsed["listen"] is None


def test_reap_interval() -> None:
    assert boot.reap_interval(1) == 1.0
    assert boot.reap_interval(20) == 5.0
    assert boot.reap_interval(3600) == 60.0


# The service tree


def test_make_service_builds_the_tree(environ: dict[str, str]) -> None:
    service = build(environ, "--max-output", "1K")
    assert service.manager.config.max_output == 1024
    assert service.manager.isolation.name == "none"
    assert service.manager.layout.root == os.path.realpath(environ["SANDBOXD_ROOT"])
    assert os.path.isdir(environ["SANDBOXD_ROOT"])
    kinds = {type(child) for child in service}
    assert kinds == {TimerService, Listeners}
    assert service.log_observer is None
    assert listener(service).factory.spool_dir == service.manager.layout.root


def test_a_root_without_unnamed_files_spools_bodies_elsewhere(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(assemble, "can_spool", lambda directory: False)
    service = build(environ)
    assert listener(service).factory.spool_dir is None


def test_option_beats_environment(environ: dict[str, str]) -> None:
    environ["SANDBOXD_MAX_OUTPUT"] = "2K"
    assert build(environ, "--max-output", "1K").manager.config.max_output == 1024
    other = {**environ, "SANDBOXD_ROOT": environ["SANDBOXD_ROOT"] + "-2"}
    assert build(other).manager.config.max_output == 2048


@pytest_twisted.ensureDeferred
async def test_the_daemon_starts_serves_and_stops(environ: dict[str, str]) -> None:
    service = build(environ)
    service.startService()
    try:
        url = await listening_url(service)
        response = await treq.get(url + "/healthz")
        body = json.loads(await response.content())
        assert body["status"] == "ok"
        assert "isolation.none" in body["capabilities"]
        created = await treq.post(url + "/sandboxes", data=b"{}")
        assert created.code == 200
        assert len(service.manager.sandboxes) == 1
    finally:
        await service.stopService()
    assert service.manager.draining
    assert service.manager.sandboxes == {}
    assert all(not pool.started for pool in service.pools)


@pytest_twisted.ensureDeferred
async def test_what_start_up_made_is_frozen_out_of_the_collectors_passes_once_listening(
    environ: dict[str, str],
) -> None:
    gc.unfreeze()
    service = build(environ)
    service.startService()
    try:
        await listening_url(service)
        assert gc.get_freeze_count() > 0
        made_now: object = type("Made", (), {})()
        assert any(o is made_now for o in gc.get_objects())  # still collected as usual
    finally:
        gc.unfreeze()
        await service.stopService()


@pytest_twisted.ensureDeferred
async def test_the_gil_is_handed_over_within_the_short_switch_interval_once_started(
    environ: dict[str, str], cpythons_switch_interval: None
) -> None:
    service = build(environ)
    service.startService()
    try:
        await listening_url(service)
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)
        assert SWITCH_INTERVAL < 0.005
        await service.stopService()
        assert sys.getswitchinterval() == pytest.approx(0.005)  # set back with the pools
    finally:
        if service.running:
            await service.stopService()


@pytest_twisted.ensureDeferred
async def test_a_configured_token_guards_the_api(environ: dict[str, str], token_file: Path) -> None:
    environ["SANDBOXD_TOKEN_FILE"] = str(token_file)
    service = build(environ)
    service.startService()
    try:
        url = await listening_url(service)
        refused = await treq.get(url + "/sandboxes")
        assert refused.code == 401
        await refused.content()
        allowed = await treq.get(
            url + "/sandboxes", headers={"Authorization": "Bearer t0ken-value"}
        )
        assert allowed.code == 200
        await allowed.content()
    finally:
        await service.stopService()


@pytest_twisted.ensureDeferred
async def test_a_failed_recovery_is_logged_and_the_daemon_listens(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = build(environ)
    monkeypatch.setattr(SandboxManager, "start", lambda self: fail(OSError("recovery broke")))
    service.startService()
    try:
        response = await treq.get(await listening_url(service) + "/healthz")
        assert response.code == 200
        await response.content()
    finally:
        await service.stopService()


@pytest_twisted.ensureDeferred
async def test_listening_waits_for_the_recovery(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = build(environ)
    recovery: Deferred[None] = Deferred()
    monkeypatch.setattr(SandboxManager, "start", lambda self: recovery)
    service.startService()
    try:
        assert listener(service).ports == []  # nothing listens while a squatter may live
        recovery.callback(None)
        await service.started
        assert len(listener(service).ports) == 2  # 127.0.0.1 and ::1
    finally:
        await service.stopService()


def test_a_port_taken_before_the_reactor_runs_stops_twistd(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch, cpythons_switch_interval: None
) -> None:
    with socket.socket(socket.AF_INET6) as squatter:
        squatter.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        squatter.bind(("::1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        environ["SANDBOXD_LISTEN"] = f"tcp:{port}:interface=127.0.0.1"
        service = build(environ)

        class NotRunning:
            running = False

        service.reactor = NotRunning()
        with pytest.raises(
            SystemExit, match=rf"start-up failed at listen: \[::1\]:{port}: Address"
        ):
            service.startService()
        assert sys.getswitchinterval() == pytest.approx(0.005)  # set back with the pools
        assert service.exit_status.code == 1
        service.exit_status.code = 0  # this test process exits as pytest says
        assert all(not pool.started for pool in service.pools)


@pytest_twisted.ensureDeferred
async def test_a_port_taken_after_the_recovery_stops_the_reactor_with_status_1(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        environ["SANDBOXD_LISTEN"] = f"tcp:{squatter.getsockname()[1]}:interface=127.0.0.1"
        service = build(environ)
        recovery: Deferred[None] = Deferred()
        monkeypatch.setattr(SandboxManager, "start", lambda self: recovery)

        class Running:
            running = True
            stopped = 0

            def stop(self) -> None:
                self.stopped += 1

        service.reactor = reactor = Running()
        service.startService()
        recovery.callback(None)
        await service.started
        assert (reactor.stopped, service.exit_status.code) == (1, 1)
        assert service.exit_status.message is not None
        assert "Address already in use" in service.exit_status.message
        service.exit_status.code = 0  # this test process exits as pytest says
        await service.stopService()


def test_exit_status_exits_only_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    status = ExitStatus()
    status.apply()
    assert exits == []
    status.code = 1
    status.apply()
    assert exits == [1]


def test_beyond_loopback_without_a_token_is_refused(environ: dict[str, str]) -> None:
    environ["SANDBOXD_LISTEN"] = "tcp:0"
    message = refused(environ)
    assert message.startswith("sandboxd: start-up failed at listen: SANDBOXD_LISTEN=tcp:0 reaches")
    assert "--insecure (SANDBOXD_INSECURE=yes)" in message


@pytest.mark.parametrize("how", ["option", "environment"])
def test_insecure_listens_beyond_loopback_and_says_so(
    environ: dict[str, str], how: str, capture: list[dict[str, Any]]
) -> None:
    environ["SANDBOXD_LISTEN"] = "tcp:0"
    if how == "environment":
        environ["SANDBOXD_INSECURE"] = "yes"
    service = build(environ, *(["--insecure"] if how == "option" else []))
    assert service.manager.config.insecure
    assert any("INSECURE" in str(event.get("log_format")) for event in capture)


def test_with_a_token_any_address_is_fine(environ: dict[str, str], token_file: Path) -> None:
    environ["SANDBOXD_LISTEN"] = "tcp:0"
    environ["SANDBOXD_TOKEN_FILE"] = str(token_file)
    assert build(environ).manager.config.listen == "tcp:0"


@pytest.mark.parametrize(
    ("listen", "extra", "said"),
    [
        ("unix:{tmp}/api.sock", [], "is not tcp:, listened on as given"),
        ("tcp:0:interface=127.0.0.1", ["--dual-stack=off"], "SANDBOXD_DUAL_STACK=off"),
    ],
)
def test_how_it_listens_is_said(
    environ: dict[str, str],
    tmp_path: Path,
    capture: list[dict[str, Any]],
    listen: str,
    extra: list[str],
    said: str,
) -> None:
    environ["SANDBOXD_LISTEN"] = listen.format(tmp=tmp_path)
    service = build(environ, *extra)
    assert "listen.dual-stack" not in service.manager.config.redacted()
    assert any(said in str(event.get("log_format")) for event in capture)


def test_drain_and_exit_stops_the_reactor_once_drained(environ: dict[str, str]) -> None:
    service = build(environ)

    class Reactor:
        stopped = 0

        def stop(self) -> None:
            self.stopped += 1

    service.reactor = Reactor()
    service.drain_and_exit()
    assert service.manager.draining
    assert service.reactor.stopped == 1


def test_json_logs_go_to_the_application(environ: dict[str, str]) -> None:
    environ["SANDBOXD_LOG_FORMAT"] = "json"
    service = build(environ)
    assert service.log_observer is not None
    application = Application("sandboxd")
    service.setServiceParent(application)
    assert application.getComponent(ILogObserver) is service.log_observer
    assert service in list(IServiceCollection(application))


def test_text_logs_leave_the_application_alone(environ: dict[str, str]) -> None:
    service = build(environ)
    application = Application("sandboxd")
    service.setServiceParent(application)
    assert application.getComponent(ILogObserver) is None


def test_with_an_archive(environ: dict[str, str], tmp_path: Path) -> None:
    environ["SANDBOXD_ARCHIVE_ROOT"] = str(tmp_path / "archive")
    service = build(environ)
    assert service.manager.archive is not None


def test_another_isolation_is_reported_by_name(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(assemble, "build_isolation", lambda config, reactor, pool: fake_isolation())
    assert build(environ).manager.isolation.name == "fake"


# Start-up refusals: one line naming the step and the cause


def refused(environ: dict[str, str], *argv: str) -> str:
    with pytest.raises(SystemExit) as caught:
        build(environ, *argv)
    message = str(caught.value)
    assert message.startswith("sandboxd: start-up failed at ")
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SANDBOXD_MAX_OUTPUT", "lots"),
        ("SANDBOXD_UID_MIN", "x"),
        ("SANDBOXD_EXEC_TIMEOUT", "forever"),
        ("SANDBOXD_ISOLATION", "docker"),
        ("SANDBOXD_LISTEN", " "),
    ],
)
def test_a_bad_value_stops_start_up_naming_the_variable(
    environ: dict[str, str], variable: str, value: str
) -> None:
    environ[variable] = value
    message = refused(environ)
    assert message.startswith("sandboxd: start-up failed at configuration: " + variable + ":")


def test_a_bad_option_stops_start_up_naming_the_variable(environ: dict[str, str]) -> None:
    message = refused(environ, "--keepalive", "often")
    assert "SANDBOXD_KEEPALIVE" in message


def test_unavailable_isolation_stops_start_up(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(config: Any, reactor: Any, pool: Any) -> Any:
        raise IsolationUnavailable("no cgroup controllers delegated")

    monkeypatch.setattr(assemble, "build_isolation", unavailable)
    assert refused(environ) == (
        "sandboxd: start-up failed at isolation: no cgroup controllers delegated"
    )


def test_namespaces_that_cannot_be_made_stop_start_up(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The namespaces step refuses before it makes anything (a kept directory where each
    sandbox's workspace goes)."""
    namespaces = Namespaces(kinds=frozenset({"mount"}), keep=[HOME_VIEW])
    isolation = attrs.evolve(fake_isolation(), namespaces=namespaces)
    monkeypatch.setattr(assemble, "build_isolation", lambda config, reactor, pool: isolation)
    message = refused(environ)
    assert message.startswith("sandboxd: start-up failed at namespaces: namespaces: the state")
    assert HOME_VIEW in message


def test_a_missing_token_file_stops_start_up(environ: dict[str, str], tmp_path: Path) -> None:
    environ["SANDBOXD_TOKEN_FILE"] = str(tmp_path / "missing-token")
    assert "at token:" in refused(environ)


def test_a_bad_token_file_stops_start_up(environ: dict[str, str], token_file: Path) -> None:
    token_file.chmod(0o644)
    environ["SANDBOXD_TOKEN_FILE"] = str(token_file)
    message = refused(environ)
    assert "at token: SANDBOXD_TOKEN_FILE:" in message


def test_an_unusable_state_root_stops_start_up(environ: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    environ["SANDBOXD_ROOT"] = str(tmp_path / "file" / "root")
    assert "at state root:" in refused(environ)


def test_two_daemons_never_share_a_root(environ: dict[str, str]) -> None:
    build(environ)
    assert "at state root: another sandboxd" in refused(environ)


def test_an_unusable_archive_stops_start_up(environ: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    environ["SANDBOXD_ARCHIVE_ROOT"] = str(tmp_path / "file" / "archive")
    assert "at archive:" in refused(environ)


# The token file


def test_read_token(token_file: Path) -> None:
    assert boot.read_token(None) is None
    assert boot.read_token(str(token_file)) == b"t0ken-value"


@pytest.mark.parametrize(
    ("prepare", "match"),
    [
        (lambda p: p.chmod(0o640), "mode 0640"),
        (lambda p: p.chmod(0o604), "mode 0604"),
        (lambda p: p.write_bytes(b" \n"), "is empty"),
    ],
)
def test_read_token_refusals(token_file: Path, prepare: Any, match: str) -> None:
    prepare(token_file)
    with pytest.raises(ConfigError, match=match):
        boot.read_token(str(token_file))


def test_read_token_must_be_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        boot.read_token(str(tmp_path))


@pytest.mark.parametrize("euid", [0, 4242])
def test_read_token_must_be_owned_by_the_daemon(token_file: Path, euid: int) -> None:
    if os.stat(token_file).st_uid == euid:
        euid += 1
    with pytest.raises(ConfigError, match="is owned by uid"):
        boot.read_token(str(token_file), euid=euid)


def test_read_token_never_blocks_on_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        boot.read_token(str(fifo))


def test_defaults_are_the_global_reactor_and_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOXD_PIDS_MAX", "many")
    with pytest.raises(SystemExit, match="SANDBOXD_PIDS_MAX"):
        tap.makeService(options())
