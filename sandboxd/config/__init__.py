"""The daemon's configuration: one table of settings, read from ``SANDBOXD_*`` and options.

The table is :class:`Config` (:mod:`.effective`: reading, checking, showing), made of groups
of settings by what they govern: the fronts (:mod:`.front_settings`), what the daemon keeps
and each sandbox may use (:mod:`.resource_settings`), isolation and egress
(:mod:`.isolation_settings`), the API's limits and connections (:mod:`.api_settings`).
"""

from sandboxd.config.effective import Config, ConfigError, env_name, option_name

__all__ = ["Config", "ConfigError", "env_name", "option_name"]
