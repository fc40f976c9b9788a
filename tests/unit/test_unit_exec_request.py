"""The exec body (``sandboxd.core.exec.spec``): every field, every refusal naming its field."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from sandboxd.core.exec import spec as exec_request
from sandboxd.core.exec.spec import (
    ARG_STRLEN_MAX,
    CARRIER_SIZE,
    ExecSpec,
    check_exec_size,
    exec_args_limit,
    parse_env,
)
from sandboxd.errors import BadRequest
from sandboxd.http import parse

SHA = "0f" * 32


def test_minimal_body() -> None:
    request = parse.exec_spec({"cmd": ["ls", "-l"]})
    assert request == ExecSpec(cmd=("ls", "-l"), env={}, cwd=(), timeout=None, stdin=None, tools=())


def test_every_field() -> None:
    body = {
        "cmd": ["sh", "-c", "true"],
        "env": {"A": "1", "B": ""},
        "cwd": "/src/./app/",
        "timeout": 2,
        "stdin": base64.b64encode(b"\x00\xffdata").decode(),
        "tools": [SHA],
    }
    request = parse.exec_spec(body)
    assert request.cmd == ("sh", "-c", "true")
    assert request.env == {"A": "1", "B": ""}
    assert request.cwd == ("src", "app")
    assert request.timeout == 2.0 and isinstance(request.timeout, float)
    assert request.stdin == b"\x00\xffdata"
    assert request.tools == (SHA,)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "cmd"),
        ({"cmd": None}, "cmd"),
        ({"cmd": []}, "cmd"),
        ({"cmd": "ls"}, "cmd"),
        ({"cmd": ["ls", 1]}, "cmd"),
        ({"cmd": ["a\0b"]}, "cmd"),
        ({"cmd": ["x"], "timeout": "5"}, "timeout"),
        ({"cmd": ["x"], "timeout": True}, "timeout"),
        ({"cmd": ["x"], "timeout": 0}, "timeout"),
        ({"cmd": ["x"], "timeout": -0.5}, "timeout"),
        ({"cmd": ["x"], "timeout": float("nan")}, "timeout"),
        ({"cmd": ["x"], "env": []}, "env"),
        ({"cmd": ["x"], "env": {"A": None}}, "env"),
        ({"cmd": ["x"], "cwd": 1}, "cwd"),
        ({"cmd": ["x"], "cwd": 0}, "cwd"),
        ({"cmd": ["x"], "cwd": False}, "cwd"),
        ({"cmd": ["x"], "cwd": []}, "cwd"),
        ({"cmd": ["x"], "cwd": ".."}, "cwd"),
        ({"cmd": ["x"], "stdin": b"bytes"}, "stdin"),
        ({"cmd": ["x"], "stdin": 7}, "stdin"),
        ({"cmd": ["x"], "stdin": "a"}, "stdin"),
        ({"cmd": ["x"], "stdin": "!!!!"}, "stdin"),
        ({"cmd": ["x"], "stdin": "é"}, "stdin"),
        ({"cmd": ["x"], "tools": SHA}, "tools"),
        ({"cmd": ["x"], "tools": [SHA, 3]}, "tools"),
        ({"cmd": ["x"], "tools": [SHA.upper()]}, "tools"),
        ({"cmd": ["x"], "tools": ["../" + SHA[3:]]}, "tools"),
    ],
)
def test_refusals_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse.exec_spec(body)
    assert caught.value.detail.startswith(field + ":")


def test_empty_cwd_and_stdin() -> None:
    request = parse.exec_spec({"cmd": ["x"], "cwd": "", "stdin": ""})
    assert (request.cwd, request.stdin) == ((), b"")


def test_huge_timeouts_are_accepted_and_capped_later() -> None:
    assert parse.exec_spec({"cmd": ["x"], "timeout": float("inf")}).timeout == float("inf")


@pytest.mark.parametrize(
    "env",
    [
        {"": "x"},
        {"A=B": "x"},
        {"A\0": "x"},
        {"A": "x\0"},
        {"A": 1},
    ],
)
def test_parse_env_refusals(env: dict[str, Any]) -> None:
    with pytest.raises(BadRequest, match=r"^create-env: "):
        parse_env(env, "create-env")


def test_parse_env_accepts_none_and_copies() -> None:
    assert parse_env(None, "env") == {}
    given = {"PATH": "/x", "WEIRD NAME": "=ok="}
    parsed = parse_env(given, "env")
    assert parsed == given and parsed is not given


def test_one_environment_entry_has_a_limit() -> None:
    room = ARG_STRLEN_MAX - 2 - CARRIER_SIZE - 1
    parse_env({"A": "x" * room}, "env")
    with pytest.raises(BadRequest, match="over the limit of one entry"):
        parse_env({"A": "x" * (room + 1)}, "env")


def test_exec_args_limit_is_below_the_kernels() -> None:
    limit = exec_args_limit()
    assert 0 < limit <= exec_request.ARGS_MAX_CAP - exec_request.ARGS_RESERVE


def test_check_exec_size() -> None:
    check_exec_size(["echo", "hi"], {"A": "1"})
    with pytest.raises(BadRequest, match=r"^cmd: an argument is over"):
        check_exec_size(["x" * ARG_STRLEN_MAX], {})
    with pytest.raises(BadRequest, match=r"^env: the entry 'A' is over"):
        check_exec_size(["x"], {"A": "x" * ARG_STRLEN_MAX})
    many = ["x" * (ARG_STRLEN_MAX - 1)] * (exec_args_limit() // ARG_STRLEN_MAX + 1)
    with pytest.raises(BadRequest, match=r"^cmd: argument list too long"):
        check_exec_size(many, {})
    env = {
        f"V{i}": "x" * (ARG_STRLEN_MAX // 2)
        for i in range(exec_args_limit() // (ARG_STRLEN_MAX // 2) + 1)
    }
    with pytest.raises(BadRequest, match=r"^cmd: argument list too long"):
        check_exec_size(["true"], env)
