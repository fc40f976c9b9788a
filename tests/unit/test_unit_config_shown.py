"""The configuration line of the start-up log (``Config.friendly``) reads back to the same
configuration: every setting is shown in the form its variable takes (``10s``, ``yes``,
``off``, ``077``, empty for unset), never as Python writes the value (``10.0``, ``False``)."""

from __future__ import annotations

from typing import Any

import pytest
from attrs import evolve, fields

from sandboxd.config import Config
from sandboxd.settings import setting_text
from tests.unit.test_unit_config import SAMPLES

SECRET = "SANDBOXD_TOKEN_FILE"

MORE: dict[str, str] = {
    "SANDBOXD_E2B_LISTEN": "tcp:49999",
    "SANDBOXD_E2B_DOMAIN": "sandboxes.example",
    "SANDBOXD_PORT_CONNECTIONS_MAX": "5",
    "SANDBOXD_DISK_MAX": "1536M",
    "SANDBOXD_FILES_MAX": "100000",
    "SANDBOXD_DRAIN_IDLE": "1.5s",
    "SANDBOXD_NAMESPACES": "ipc,net",
    "SANDBOXD_NETWORK": "none",
    "SANDBOXD_NETWORK_ALLOW": "none,host",
    "SANDBOXD_EGRESS_POOL": "10.77.0.0/20",
    "SANDBOXD_EGRESS_POOL6": "fd00:1::/100",
    "SANDBOXD_EGRESS_DENY": "192.168.0.0/16 10.0.0.0/8,fc00::/7",
    "SANDBOXD_EGRESS_POLICY_MAX": "64",
    "SANDBOXD_NETNS_POOL": "4",
    "SANDBOXD_EGRESS_DNS": "192.0.2.53, [2001:db8::53]:5353",
    "SANDBOXD_EGRESS_SOCKS5": "[2001:db8::80]:1080",
    "SANDBOXD_EGRESS_SOCKS5_USER": "sandboxd",
    "SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE": "/etc/sandboxd/socks5-password",
    "SANDBOXD_EGRESS_UPSTREAM_CA": "/etc/sandboxd/upstream-ca.pem",
    "SANDBOXD_EGRESS_JUDGE": "off",
    "SANDBOXD_RESOLV_CONF": "/run/systemd/resolve/resolv.conf",
    "SANDBOXD_PROCESS_LOG_MAX": "1000",
    "SANDBOXD_TERMINAL_SCROLLBACK": "64K",
    "SANDBOXD_PROCESSES_MAX": "3",
    "SANDBOXD_WALK_MAX": "50",
    "SANDBOXD_WALK_BYTES_MAX": "2M",
    "SANDBOXD_TEMPLATE_MAX": "2G",
    "SANDBOXD_BUILD_MEMORY_MAX": "768M",
    "SANDBOXD_BUILD_CPU_CORES": "0.5",
    "SANDBOXD_BUILD_PIDS_MAX": "100",
    "SANDBOXD_BUILD_TIMEOUT": "90s",
    "SANDBOXD_BUILD_NETWORK": "host",
    "SANDBOXD_WATCH_MAX": "2",
    "SANDBOXD_CONTEXTS_MAX": "1",
    "SANDBOXD_KERNEL_PYTHON": "/opt/python/bin/python3",
}

OFF: dict[str, str] = {
    "SANDBOXD_MAX_CONNECTIONS": "off",
    "SANDBOXD_HEADER_TIMEOUT": "off",
    "SANDBOXD_BODY_PACE": "off",
    "SANDBOXD_CONNECTION_IDLE": "off",
    "SANDBOXD_EGRESS_POOL6": "none",
    "SANDBOXD_EGRESS_DENY": "",
    "SANDBOXD_NAMESPACES": "none",
    "SANDBOXD_INSECURE": "no",
    "SANDBOXD_UMASK": "0",
    "SANDBOXD_DRAIN_IDLE": "0s",
}

CONFIGS: dict[str, dict[str, str]] = {
    "defaults": {},
    "samples": {name: text for name, (text, _) in SAMPLES.items()} | MORE,
    "off": OFF,
    "odd units": {
        "SANDBOXD_MEMORY_MAX": "1000001",
        "SANDBOXD_EXEC_TIMEOUT": "0.0015",
        "SANDBOXD_IDLE_TTL": "36h",
        "SANDBOXD_CPU_CORES": "0.001",
    },
}


def shown(config: Config) -> dict[str, str]:
    """``{variable: text}`` from the configuration line."""
    pairs = [word.partition("=") for word in config.friendly().split(" ")]
    assert all(sep == "=" for _, sep, _ in pairs)
    return {name: text for name, _, text in pairs}


@pytest.mark.parametrize("environ", CONFIGS.values(), ids=list(CONFIGS))
def test_the_line_reads_back_to_the_same_configuration(environ: dict[str, str]) -> None:
    config = Config.load(environ)
    line = shown(config)
    assert list(line) == [f.metadata["env"] for f in fields(Config)]
    if config.token_file is not None:
        assert line.pop(SECRET) == "<set>"
        config = evolve(config, token_file=None)
    password = "SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE"
    if config.egress_socks5_password_file is not None:  # a secret too: never shown
        assert line[password] == "<set>"
        line[password] = environ[password]
    assert Config.load(line) == config


def test_every_setting_is_read_back_from_a_value_of_its_own() -> None:
    """The configurations above give every setting a value besides its default, and every
    setting that can be unset (``None``) is unset in one of them."""
    loaded = [Config.load(environ) for environ in CONFIGS.values()]
    for setting in fields(Config):
        values = [getattr(config, setting.name) for config in loaded]
        assert len(set(map(repr, values))) > 1, setting.name
        nullable = setting.metadata["default"] is None or setting.metadata["unset"]
        if nullable and setting.name != "listen":
            assert None in values, setting.name


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("SANDBOXD_HEADER_TIMEOUT", "10s"),
        ("SANDBOXD_INSECURE", "no"),
        ("SANDBOXD_CPU_CORES", "1.0"),
        ("SANDBOXD_DISK_MAX", ""),
        ("SANDBOXD_NETWORK", ""),
        ("SANDBOXD_MAX_CONNECTIONS", "auto"),
        ("SANDBOXD_EGRESS_DENY", "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,100.64.0.0/10,fc00::/7"),
        ("SANDBOXD_NAMESPACES", "all"),
        ("SANDBOXD_EGRESS_POOL6", "fd53:616e:6462:6f78::/64"),
    ],
)
def test_the_defaults_are_shown_as_written(name: str, text: str) -> None:
    assert shown(Config.load({}))[name] == text


def test_an_empty_network_setting_leaves_it_unset() -> None:
    config = Config.load({"SANDBOXD_NETWORK": " ", "SANDBOXD_NETWORK_ALLOW": ""})
    assert (config.network, config.network_allow) == (None, None)


def test_values_are_written_for_their_parser() -> None:
    header = next(f for f in fields(Config) if f.name == "header_timeout")
    values: list[tuple[Any, str]] = [(None, "off"), (10.0, "10s"), (0.25, "250ms")]
    assert [setting_text(header.metadata, value) for value, _ in values] == [t for _, t in values]
