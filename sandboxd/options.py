"""The settings of :class:`sandboxd.config.Config` as ``twistd sandboxd`` options: the tables
``twisted.python.usage.Options`` is given, and the options given read back by setting."""

from collections.abc import Mapping
from typing import Any

from attrs import fields

from sandboxd.config import Config, option_name


def option_table() -> list[list[Any]]:
    """``optParameters`` rows for ``twisted.python.usage.Options``: one per setting that
    takes a value."""
    rows: list[list[Any]] = []
    for setting in fields(Config):
        meta = setting.metadata
        if meta["flag"]:
            continue
        default = meta["default"]
        help_text = f"{meta['help']} [env {meta['env']}; default {default or 'unset'}]"
        rows.append([option_name(setting.name), None, None, help_text])
    return rows


def flag_table() -> list[list[Any]]:
    """``optFlags`` rows for ``twisted.python.usage.Options``: one per flag setting."""
    return [
        [option_name(s.name), None, f"{s.metadata['help']} [env {s.metadata['env']}=yes]"]
        for s in fields(Config)
        if s.metadata["flag"]
    ]


def given_options(options: Mapping[str, Any]) -> dict[str, str | None]:
    """The settings given on the command line, by option name (a flag given is ``yes``)."""
    given: dict[str, str | None] = {row[0]: options[row[0]] for row in option_table()}
    for row in flag_table():
        given[row[0]] = "yes" if options[row[0]] else None
    return given
