"""The effective configuration: every group of settings in one class, read from
``SANDBOXD_*`` and options, checked, and shown.

Every setting has an environment variable and a ``twistd sandboxd --option`` of the same name;
the option wins. A value that does not parse raises :class:`ConfigError` naming the variable, so
start-up stops with one clear line.
"""

from collections.abc import Mapping
from typing import Any

from attrs import fields, frozen

from sandboxd.config.api_settings import ApiSettings
from sandboxd.config.front_settings import FrontSettings
from sandboxd.config.isolation_settings import IsolationSettings
from sandboxd.config.resource_settings import ResourceSettings
from sandboxd.settings import setting_text

DEFAULT_LISTEN = "tcp:8080"


class ConfigError(Exception):
    """A setting has a value that cannot be used; the message names the variable."""


# attrs takes the fields of the last base first: the groups are listed last to first so that
# the settings keep their order (in the options' help and the log line).
@frozen
class Config(ApiSettings, IsolationSettings, ResourceSettings, FrontSettings):
    """The effective configuration. Sizes are bytes, durations seconds, cores a float."""

    @classmethod
    def load(
        cls, environ: Mapping[str, str], options: Mapping[str, str | None] | None = None
    ) -> "Config":
        """Build the configuration: option, else environment variable, else default."""
        options = options or {}
        values: dict[str, Any] = {}
        for setting in fields(cls):
            meta = setting.metadata
            text = options.get(option_name(setting.name))
            if text is None:
                text = environ.get(meta["env"])
            if text is None:
                text = meta["default"]
            if text is None and setting.name == "listen":
                # Without a token, only this host may drive the sandboxes by default.
                has_token = _given("token_file", options, environ)
                text = DEFAULT_LISTEN if has_token else DEFAULT_LISTEN + ":interface=127.0.0.1"
            if text is None:
                values[setting.name] = None
                continue
            try:
                values[setting.name] = meta["parse"](text)
            except ValueError as e:
                raise ConfigError(f"{meta['env']}: {e}") from None
        config = cls(**values)
        config.check()
        return config

    def check(self) -> None:
        """Refuse combinations that cannot work, naming the variables."""
        if self.uid_min <= 0:
            raise ConfigError("SANDBOXD_UID_MIN: must be above 0 (uid 0 is root)")
        if self.uid_max < self.uid_min:
            raise ConfigError("SANDBOXD_UID_MAX: must not be below SANDBOXD_UID_MIN")
        if self.pids_max < 1:
            raise ConfigError("SANDBOXD_PIDS_MAX: must be at least 1")
        for name in ("disk_max", "files_max"):
            if getattr(self, name) == 0:
                raise ConfigError(f"{env_name(name)}: must be above zero (unset: no limit)")
        for name in (
            "process_log_max",
            "terminal_scrollback",
            "processes_max",
            "watch_max",
            "port_connections_max",
            "walk_max",
            "walk_bytes_max",
            "template_max",
            "build_memory_max",
            "build_pids_max",
            "contexts_max",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{env_name(name)}: must be at least 1")
        for name in ("exec_timeout", "log_timeout", "idle_ttl", "keepalive", "build_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{env_name(name)}: must be above zero")
        if (self.egress_socks5_user is None) != (self.egress_socks5_password_file is None):
            raise ConfigError(
                "SANDBOXD_EGRESS_SOCKS5_USER and SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE:"
                " set both or neither"
            )
        if self.egress_socks5_user is not None and self.egress_socks5 is None:
            raise ConfigError("SANDBOXD_EGRESS_SOCKS5_USER: needs SANDBOXD_EGRESS_SOCKS5")

    def redacted(self) -> dict[str, Any]:
        """The effective settings by variable name, secrets replaced by ``<set>``."""
        shown: dict[str, Any] = {}
        for setting in fields(type(self)):
            value = getattr(self, setting.name)
            if setting.metadata["secret"] and value is not None:
                value = "<set>"
            elif setting.name == "umask":
                value = f"{value:03o}"  # as an operator writes it
            elif setting.name == "max_connections" and not value:
                value = "auto" if value is None else "off"
            shown[setting.metadata["env"]] = value
        return shown

    def friendly(self) -> str:
        """The effective settings as an operator writes them (``SANDBOXD_MEMORY_MAX=512M``,
        ``SANDBOXD_EXEC_TIMEOUT=10m``, ``SANDBOXD_INSECURE=no``, ``SANDBOXD_DISK_MAX=`` when
        unset): each value reads back to itself when given to its variable. Secrets are
        replaced by ``<set>``. One line for the log."""
        shown: list[str] = []
        for setting in fields(type(self)):
            meta = setting.metadata
            value = getattr(self, setting.name)
            text = setting_text(meta, value)
            if meta["secret"] and value is not None:
                text = "<set>"
            shown.append(f"{meta['env']}={text}")
        return " ".join(shown)


def _given(attribute: str, options: Mapping[str, Any], environ: Mapping[str, str]) -> bool:
    """Whether the setting is given a non-empty value by an option or the environment."""
    text = options.get(option_name(attribute))
    if text is None:
        text = environ.get(env_name(attribute))
    return bool(text and text.strip())


def option_name(attribute: str) -> str:
    """``max_output`` → ``max-output``: the ``twistd sandboxd`` option of a setting."""
    return attribute.replace("_", "-")


def env_name(attribute: str) -> str:
    """The environment variable of a setting attribute."""
    for setting in fields(Config):
        if setting.name == attribute:
            return str(setting.metadata["env"])
    raise KeyError(attribute)
