"""``twistd sandboxd`` start-up (``tap.makeService``): the descriptor limit, the connection cap
(boot step ``connections``) and the E2B front without a token, each said in the log or
refused by name. Built with ``isolation=none``; nothing is started."""

from __future__ import annotations

import resource
from typing import Any, cast

import pytest
from twisted.logger import ILogObserver, formatEvent, globalLogPublisher

from sandboxd import tap


def build(environ: dict[str, str]) -> Any:
    from twisted.internet import reactor

    options = tap.Options()
    options.parseOptions([])
    return tap.makeService(options, reactor, environ)


def lines_of(environ: dict[str, str]) -> list[str]:
    events: list[dict[str, Any]] = []
    observer = cast(ILogObserver, events.append)
    globalLogPublisher.addObserver(observer)
    try:
        build(environ)
    finally:
        globalLogPublisher.removeObserver(observer)
    return [str(formatEvent(e)) for e in events]


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one(environ: dict[str, str]) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 64:
        pytest.skip(f"needs a finite hard RLIMIT_NOFILE of at least 64 (it is {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard // 2, hard))
    try:
        lines = lines_of(environ)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    (connections,) = [line for line in lines if line.startswith("connections: at most")]
    assert connections.endswith(f" {hard} descriptors"), connections


def test_a_cap_beyond_the_descriptor_limit_stops_start_up(environ: dict[str, str]) -> None:
    environ["SANDBOXD_MAX_CONNECTIONS"] = str(1 << 40)
    with pytest.raises(SystemExit) as refused:
        build(environ)
    message = str(refused.value)
    assert message.startswith(
        "sandboxd: start-up failed at connections: SANDBOXD_MAX_CONNECTIONS: "
        f"{1 << 40} connections would leave fewer than"
    ), message


def test_no_cap_is_said(environ: dict[str, str]) -> None:
    environ["SANDBOXD_MAX_CONNECTIONS"] = "off"
    lines = lines_of(environ)
    assert any(
        line.startswith("connections: SANDBOXD_MAX_CONNECTIONS=off: no cap (") for line in lines
    ), lines


def test_bodies_paced_by_default_say_nothing(environ: dict[str, str]) -> None:
    said = "connections: SANDBOXD_BODY_PACE"
    assert not any(line.startswith(said) for line in lines_of(environ))


def test_bodies_never_paced_is_said(environ: dict[str, str]) -> None:
    environ["SANDBOXD_BODY_PACE"] = "off"
    lines = lines_of(environ)
    warning = (
        "connections: SANDBOXD_BODY_PACE=off: one upload may take the CPUs every other "
        "sandbox's requests need"
    )
    assert warning in lines, lines


def test_an_e2b_front_without_a_token_says_any_key_is_accepted(environ: dict[str, str]) -> None:
    environ["SANDBOXD_E2B_LISTEN"] = "tcp:0:interface=127.0.0.1"
    lines = lines_of(environ)
    warning = "e2b: no SANDBOXD_TOKEN_FILE: any X-API-Key is accepted on the E2B front"
    assert warning in lines, lines
