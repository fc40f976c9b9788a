"""How one setting of :class:`sandboxd.config.Config` is declared (:func:`setting_field`), and the
parsers that read its text as an operator writes it (``ValueError`` when it does not parse)."""

from collections.abc import Callable, Mapping
from typing import Any

from attrs import field

from sandboxd.units import format_duration, format_size, parse_count, parse_duration, parse_size


def choice(allowed: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return value

    return parse


def nonempty_text(text: str) -> str:
    if not text.strip():
        raise ValueError("is empty")
    return text.strip()


def flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "yes", "true", "on"):
        return True
    if value in ("", "0", "no", "false", "off"):
        return False
    raise ValueError(f"{text!r} is not yes or no")


def octal_umask(text: str) -> int:
    value = text.strip()
    if not value or any(c not in "01234567" for c in value) or int(value, 8) > 0o777:
        raise ValueError(f"{text!r} is not an octal umask (e.g. 077)")
    return int(value, 8)


def optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse``, except that blank text is ``None`` (the setting left unset)."""

    def parse_optional(text: str) -> Any:
        return parse(text) if text.strip() else None

    return parse_optional


def optional_text(text: str) -> str | None:
    return text.strip() or None


def optional_size(text: str) -> int | None:
    return parse_size(text) if text.strip() else None


def optional_count(text: str) -> int | None:
    return parse_count(text) if text.strip() else None


def optional_duration(text: str) -> float | None:
    """A duration, or ``off`` (``None``)."""
    if text.strip().lower() == "off":
        return None
    value = parse_duration(text)
    if value <= 0:
        raise ValueError(f"{text!r} is not above zero (off: no timeout)")
    return value


def rate_or_off(text: str) -> int | None:
    """Bytes a second, written as a size (``256M``), or ``off`` (``None``)."""
    if text.strip().lower() == "off":
        return None
    value = parse_size(text)
    if value <= 0:
        raise ValueError(f"{text!r} is not above zero (off: no pace)")
    return value


def connections(text: str) -> int | None:
    """``auto`` (``None``: from the descriptor limit), ``off`` (``0``: no cap), or a count."""
    value = text.strip().lower()
    if value == "auto":
        return None
    if value == "off":
        return 0
    count = parse_count(value)
    if count < 2:
        raise ValueError(f"{text!r} is below 2 (auto: from the descriptor limit; off: no cap)")
    return count


def setting_field(
    env: str,
    default: str | None,
    parse: Callable[[str], Any],
    help: str,
    secret: bool = False,
    flag: bool = False,
    unset: str = "",
) -> Any:
    """Declare one setting: its variable, default (as text an operator would write) and parser.

    A ``flag`` is a ``twistd sandboxd --option`` that takes no value (given: ``yes``). ``unset``
    is the text ``parse`` reads as ``None`` (``off``, ``none``; empty by default), the form
    :func:`setting_text` writes that value in.
    """
    return field(
        metadata={
            "env": env,
            "default": default,
            "parse": parse,
            "help": help,
            "secret": secret,
            "flag": flag,
            "unset": unset,
        }
    )


def setting_text(metadata: Mapping[str, Any], value: Any) -> str:
    """``value`` as an operator writes it, in a form the setting's parser reads back to the
    same value: ``512M``, ``10m``, ``yes``, ``077``, ``off``, ``ipc,net``, empty for unset."""
    parse = metadata["parse"]
    if value is None:
        return str(metadata["unset"])
    if isinstance(value, bool):
        return "yes" if value else "no"
    if parse in (parse_size, optional_size, rate_or_off):
        return format_size(value)
    if parse in (parse_duration, optional_duration):
        return format_duration(value)
    if parse is octal_umask:
        return f"{value:03o}"
    if parse is connections and value == 0:
        return "off"
    written = getattr(value, "setting_text", None)  # a value that knows its own word
    if written is not None:
        return str(written)
    if isinstance(value, frozenset):
        return ",".join(sorted(value)) or "none"
    if isinstance(value, tuple):
        return ",".join(str(part) for part in value)
    return str(value)
