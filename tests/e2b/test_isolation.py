"""Two sandboxes of the E2B front are isolated: one's access token reaches nothing of the
other, its files and processes are its own, and an envd call without a valid token fails.

Each attack is also made with the right token, to show that it is the token that stops it.
"""

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from e2b import AuthenticationException, ConnectionConfig, Sandbox

from tests.e2b.conftest import E2BDaemon, point_sdk_at


def envd_call(
    front: E2BDaemon, method: str, sandbox_id: str, token: str | None, body: Any
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", "E2b-Sandbox-Id": sandbox_id}
    if token is not None:
        headers["X-Access-Token"] = token
    request = urllib.request.Request(
        f"{front.url}/{method}", data=json.dumps(body).encode(), method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def pair(any_daemon: E2BDaemon) -> Any:
    first, second = Sandbox.create(timeout=120), Sandbox.create(timeout=120)
    try:
        yield first, second
    finally:
        first.kill()
        second.kill()


def token_of(sbx: Sandbox) -> str:
    token = sbx._envd_access_token  # the token the create answered
    assert token
    return token


@pytest.mark.parametrize("token_from", ["own", "other", "none", "forged"])
def test_a_token_reaches_its_own_sandbox_only(
    any_daemon: E2BDaemon, pair: tuple[Sandbox, Sandbox], token_from: str
) -> None:
    victim, attacker = pair
    victim.files.write("secret.txt", "victim's")
    token = {
        "own": token_of(victim),
        "other": token_of(attacker),
        "none": None,
        "forged": "x" * 32,
    }[token_from]
    status, answer = envd_call(
        any_daemon,
        "filesystem.Filesystem/Stat",
        victim.sandbox_id,
        token,
        {"path": "/home/user/secret.txt"},
    )
    if token_from == "own":
        assert status == 200 and answer["entry"]["size"] == len("victim's")
    else:
        assert status == 401 and answer["code"] == "unauthenticated"


def test_files_and_processes_are_separate(pair: tuple[Sandbox, Sandbox]) -> None:
    first, second = pair
    first.files.write("mine.txt", "1")
    first.files.write("/tmp/mine", "1")
    assert not second.files.exists("mine.txt")
    assert not second.files.exists("/tmp/mine")
    handle = first.commands.run("sleep 60", background=True)
    try:
        assert handle.pid not in [p.pid for p in second.commands.list()]
        assert second.commands.kill(handle.pid) is False
        assert handle.pid in [p.pid for p in first.commands.list()]
    finally:
        handle.kill()


def test_sdk_with_another_sandboxes_token_is_refused(pair: tuple[Sandbox, Sandbox]) -> None:
    victim, attacker = pair
    # The attacker knows the victim's id (not its token) and talks with its own token.
    stolen = Sandbox(
        sandbox_id=victim.sandbox_id,
        sandbox_domain=None,
        envd_version=victim._envd_version,
        envd_access_token=token_of(attacker),
        traffic_access_token=None,
        connection_config=ConnectionConfig(
            extra_sandbox_headers={
                "X-Access-Token": token_of(attacker),
                "E2b-Sandbox-Id": victim.sandbox_id,
            }
        ),
    )
    with pytest.raises(AuthenticationException):
        stolen.files.read("anything")
    with pytest.raises(AuthenticationException):
        stolen.commands.run("true")


def test_commands_run_as_the_sandboxes_own_uid(
    monkeypatch: pytest.MonkeyPatch, isolated_front: E2BDaemon
) -> None:
    point_sdk_at(monkeypatch, isolated_front)
    pair = Sandbox.create(timeout=60), Sandbox.create(timeout=60)
    first, second = pair
    uids = {int(s.commands.run("id -u").stdout) for s in pair}
    assert len(uids) == 2 and 0 not in uids
    first.files.write("private.txt", "p")
    where = first.commands.run("realpath private.txt").stdout.strip()
    denied = second.commands.run(f"cat {where} 2>&1; echo $?", timeout=30).stdout
    assert "Permission denied" in denied or "No such file" in denied
    for sbx in pair:
        sbx.kill()
