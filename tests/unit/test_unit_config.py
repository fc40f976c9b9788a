"""The configuration table (``sandboxd.config``): every variable, options, errors, redaction."""

from __future__ import annotations

from typing import Any

import pytest
from attrs import fields

from sandboxd.config import Config, ConfigError, env_name, option_name
from sandboxd.options import flag_table, given_options, option_table

SAMPLES: dict[str, tuple[str, Any]] = {
    "SANDBOXD_LISTEN": ("unix:/run/sandboxd.sock", "unix:/run/sandboxd.sock"),
    "SANDBOXD_DUAL_STACK": ("OFF", "off"),
    "SANDBOXD_INSECURE": ("Yes", True),
    "SANDBOXD_POD_URL": ("http://10.0.0.5:8080", "http://10.0.0.5:8080"),
    "SANDBOXD_ROOT": ("/srv/sandboxes", "/srv/sandboxes"),
    "SANDBOXD_UID_MIN": ("300000", 300000),
    "SANDBOXD_UID_MAX": ("300999", 300999),
    "SANDBOXD_MEMORY_MAX": ("1G", 1 << 30),
    "SANDBOXD_CPU_CORES": ("2.5", 2.5),
    "SANDBOXD_PIDS_MAX": ("64", 64),
    "SANDBOXD_CGROUP_ROOT": ("/sys/fs/cgroup/sandboxd", "/sys/fs/cgroup/sandboxd"),
    "SANDBOXD_EXEC_TIMEOUT": ("90s", 90.0),
    "SANDBOXD_LOG_TIMEOUT": ("2m", 120.0),
    "SANDBOXD_IDLE_TTL": ("1h", 3600.0),
    "SANDBOXD_DRAIN_DEADLINE": ("500ms", 0.5),
    "SANDBOXD_ARCHIVE_ROOT": ("/srv/archive", "/srv/archive"),
    "SANDBOXD_TOOLS_DIR": ("/srv/tools", "/srv/tools"),
    "SANDBOXD_TOKEN_FILE": ("/etc/sandboxd/token", "/etc/sandboxd/token"),
    "SANDBOXD_ISOLATION": (" CGROUP2 ", "cgroup2"),
    "SANDBOXD_MAX_OUTPUT": ("64K", 64 << 10),
    "SANDBOXD_MAX_BODY": ("1GiB", 1 << 30),
    "SANDBOXD_KEEPALIVE": ("250ms", 0.25),
    "SANDBOXD_LOG_FORMAT": ("JSON", "json"),
    "SANDBOXD_SECCOMP": ("Off", "off"),
    "SANDBOXD_UMASK": (" 027 ", 0o027),
    "SANDBOXD_SOCKET_BUFFERS": ("off", "off"),
    "SANDBOXD_CPU_PLACEMENT": (" Shared ", "shared"),
    "SANDBOXD_SPAWNER": (" Server ", "server"),
    "SANDBOXD_ZYGOTE_QUIET": ("5s", 5.0),
    "SANDBOXD_ZYGOTES_MAX": ("32", 32),
    "SANDBOXD_NETNS_POOL": (" 8 ", 8),
    "SANDBOXD_MAX_CONNECTIONS": ("5000", 5000),
    "SANDBOXD_HEADER_TIMEOUT": ("3s", 3.0),
    "SANDBOXD_CONNECTION_IDLE": ("Off", None),
    "SANDBOXD_AUTH_GATE": ("OFF", "off"),
    "SANDBOXD_BODY_PACE": ("64M", 64 << 20),
}

BAD: dict[str, str] = {
    "SANDBOXD_LISTEN": "   ",
    "SANDBOXD_DUAL_STACK": "both",
    "SANDBOXD_INSECURE": "maybe",
    "SANDBOXD_ROOT": "",
    "SANDBOXD_UID_MIN": "lots",
    "SANDBOXD_UID_MAX": "-5",
    "SANDBOXD_MEMORY_MAX": "512 elephants",
    "SANDBOXD_CPU_CORES": "0",
    "SANDBOXD_PIDS_MAX": "1.5",
    "SANDBOXD_EXEC_TIMEOUT": "ten minutes",
    "SANDBOXD_LOG_TIMEOUT": "5w",
    "SANDBOXD_IDLE_TTL": "-1s",
    "SANDBOXD_DRAIN_DEADLINE": "soon",
    "SANDBOXD_TOOLS_DIR": " ",
    "SANDBOXD_ISOLATION": "docker",
    "SANDBOXD_MAX_OUTPUT": "16Q",
    "SANDBOXD_MAX_BODY": "big",
    "SANDBOXD_KEEPALIVE": "often",
    "SANDBOXD_LOG_FORMAT": "xml",
    "SANDBOXD_SECCOMP": "strict",
    "SANDBOXD_UMASK": "0o77",
    "SANDBOXD_SOCKET_BUFFERS": "maybe",
    "SANDBOXD_CPU_PLACEMENT": "pinned",
    "SANDBOXD_SPAWNER": "fork",
    "SANDBOXD_ZYGOTE_QUIET": "a while",
    "SANDBOXD_ZYGOTES_MAX": "-1",
    "SANDBOXD_NETNS_POOL": "some",
    "SANDBOXD_MAX_CONNECTIONS": "1",
    "SANDBOXD_HEADER_TIMEOUT": "0s",
    "SANDBOXD_CONNECTION_IDLE": "later",
    "SANDBOXD_AUTH_GATE": "body",
    "SANDBOXD_BODY_PACE": "0",
}


@pytest.mark.parametrize("text", ["", "8", "1000", "-1", "abc"])
def test_a_umask_is_octal_and_at_most_777(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^SANDBOXD_UMASK: .*not an octal umask"):
        Config.load({"SANDBOXD_UMASK": text})


def attribute_of(env: str) -> str:
    (name,) = [f.name for f in fields(Config) if f.metadata["env"] == env]
    return name


def test_defaults_load() -> None:
    config = Config.load({})
    assert config.listen == "tcp:8080:interface=127.0.0.1"  # no token: loopback only
    assert (config.dual_stack, config.insecure) == ("on", False)
    assert config.pod_url is None
    assert config.uid_min == 200000
    assert config.memory_max == 512 << 20
    assert config.exec_timeout == 600.0
    assert config.isolation == "auto"
    assert config.token_file is None
    assert config.max_output == 16 << 20
    assert (config.seccomp, config.umask, config.socket_buffers) == ("default", 0o077, "charged")


@pytest.mark.parametrize("env", sorted(SAMPLES))
def test_every_variable_parses(env: str) -> None:
    text, expected = SAMPLES[env]
    environ = {env: text}
    if env in ("SANDBOXD_UID_MIN", "SANDBOXD_UID_MAX"):
        environ.setdefault("SANDBOXD_UID_MIN", "300000")
        environ.setdefault("SANDBOXD_UID_MAX", "300999")
    config = Config.load(environ)
    assert getattr(config, attribute_of(env)) == expected


def test_every_default_parses() -> None:
    """Also for settings added after this file: their defaults are valid values."""
    for setting in fields(Config):
        default = setting.metadata["default"]
        if default is not None:
            setting.metadata["parse"](default)


@pytest.mark.parametrize("env", sorted(BAD))
def test_a_bad_value_raises_naming_the_variable(env: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.load({env: BAD[env]})
    assert str(caught.value).startswith(env + ":")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("env", ["SANDBOXD_POD_URL", "SANDBOXD_CGROUP_ROOT", "SANDBOXD_TOKEN_FILE"])
def test_optional_text_may_be_empty(env: str) -> None:
    assert getattr(Config.load({env: "  "}), attribute_of(env)) is None


@pytest.mark.parametrize(
    ("environ", "options"),
    [({"SANDBOXD_TOKEN_FILE": "/etc/sandboxd/token"}, {}), ({}, {"token-file": "/t"})],
)
def test_with_a_token_the_default_listens_on_every_address(
    environ: dict[str, str], options: dict[str, str]
) -> None:
    assert Config.load(environ, options).listen == "tcp:8080"


@pytest.mark.parametrize("text", ["", "0", "no", "false", "off"])
def test_insecure_is_off_unless_said(text: str) -> None:
    assert Config.load({"SANDBOXD_INSECURE": text}).insecure is False


def test_option_beats_environment() -> None:
    environ = {"SANDBOXD_MAX_OUTPUT": "2K", "SANDBOXD_LISTEN": "tcp:1"}
    config = Config.load(environ, {"max-output": "1K", "listen": None})
    assert config.max_output == 1024
    assert config.listen == "tcp:1"


def test_a_bad_option_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"^SANDBOXD_KEEPALIVE:"):
        Config.load({"SANDBOXD_KEEPALIVE": "5s"}, {"keepalive": "never"})


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"SANDBOXD_UID_MIN": "0"}, "SANDBOXD_UID_MIN"),
        ({"SANDBOXD_UID_MIN": "10", "SANDBOXD_UID_MAX": "9"}, "SANDBOXD_UID_MAX"),
        ({"SANDBOXD_PIDS_MAX": "0"}, "SANDBOXD_PIDS_MAX"),
        ({"SANDBOXD_EXEC_TIMEOUT": "0"}, "SANDBOXD_EXEC_TIMEOUT"),
        ({"SANDBOXD_LOG_TIMEOUT": "0s"}, "SANDBOXD_LOG_TIMEOUT"),
        ({"SANDBOXD_IDLE_TTL": "0m"}, "SANDBOXD_IDLE_TTL"),
        ({"SANDBOXD_KEEPALIVE": "0ms"}, "SANDBOXD_KEEPALIVE"),
        ({"SANDBOXD_PROCESS_LOG_MAX": "0"}, "SANDBOXD_PROCESS_LOG_MAX"),
        ({"SANDBOXD_TERMINAL_SCROLLBACK": "0"}, "SANDBOXD_TERMINAL_SCROLLBACK"),
        ({"SANDBOXD_PROCESSES_MAX": "0"}, "SANDBOXD_PROCESSES_MAX"),
        ({"SANDBOXD_WATCH_MAX": "0"}, "SANDBOXD_WATCH_MAX"),
        ({"SANDBOXD_WALK_MAX": "0"}, "SANDBOXD_WALK_MAX"),
        ({"SANDBOXD_WALK_BYTES_MAX": "0"}, "SANDBOXD_WALK_BYTES_MAX"),
        ({"SANDBOXD_BUILD_MEMORY_MAX": "0"}, "SANDBOXD_BUILD_MEMORY_MAX"),
        ({"SANDBOXD_BUILD_PIDS_MAX": "0"}, "SANDBOXD_BUILD_PIDS_MAX"),
        ({"SANDBOXD_BUILD_TIMEOUT": "0s"}, "SANDBOXD_BUILD_TIMEOUT"),
    ],
)
def test_impossible_combinations_name_the_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError, match=f"^{variable}:"):
        Config.load(environ)


def test_a_pool_of_one_is_allowed() -> None:
    config = Config.load({"SANDBOXD_UID_MIN": "7", "SANDBOXD_UID_MAX": "7"})
    assert (config.uid_min, config.uid_max) == (7, 7)


def test_redacted_hides_the_token_file() -> None:
    config = Config.load({"SANDBOXD_TOKEN_FILE": "/etc/secret/token-path"})
    shown = config.redacted()
    assert shown["SANDBOXD_TOKEN_FILE"] == "<set>"
    assert "/etc/secret/token-path" not in repr(shown)
    assert set(shown) == {f.metadata["env"] for f in fields(Config)}
    assert shown["SANDBOXD_MAX_OUTPUT"] == 16 << 20


def test_redacted_shows_the_umask_in_octal() -> None:
    assert Config.load({"SANDBOXD_UMASK": "27"}).redacted()["SANDBOXD_UMASK"] == "027"


def test_redacted_shows_an_unset_secret_as_unset() -> None:
    assert Config.load({}).redacted()["SANDBOXD_TOKEN_FILE"] is None


def test_names() -> None:
    assert option_name("max_output") == "max-output"
    assert env_name("max_output") == "SANDBOXD_MAX_OUTPUT"
    with pytest.raises(KeyError):
        env_name("no_such_setting")


def test_option_table_documents_every_setting() -> None:
    rows = option_table()
    settings: tuple[Any, ...] = tuple(f for f in fields(Config) if not f.metadata["flag"])
    assert [row[0] for row in rows] == [option_name(f.name) for f in settings]
    for row, setting in zip(rows, settings, strict=True):
        _, short, default, help_text = row
        assert (short, default) == (None, None)
        assert setting.metadata["env"] in help_text
        assert f"default {setting.metadata['default'] or 'unset'}" in help_text


def test_the_connection_cap_is_auto_off_or_a_count() -> None:
    assert Config.load({}).max_connections is None
    assert Config.load({"SANDBOXD_MAX_CONNECTIONS": " off "}).max_connections == 0
    assert Config.load({"SANDBOXD_MAX_CONNECTIONS": "AUTO"}).max_connections is None
    shown = [Config.load({"SANDBOXD_MAX_CONNECTIONS": v}).redacted() for v in ("auto", "off", "9")]
    assert [s["SANDBOXD_MAX_CONNECTIONS"] for s in shown] == ["auto", "off", 9]


def test_flags_take_no_value() -> None:
    assert flag_table() == [
        [
            "insecure",
            None,
            "Allow listening beyond loopback with no token (anyone reaching the port runs code)"
            " [env SANDBOXD_INSECURE=yes]",
        ]
    ]
    given = given_options({**{row[0]: None for row in option_table()}, "insecure": 1})
    assert given["insecure"] == "yes"
    assert Config.load({}, given).insecure is True
    assert given_options({**given, "insecure": 0})["insecure"] is None
