"""How one setting of :class:`sandboxd.config.Config` is declared (:func:`setting_field`), and the
parsers that read its text as an operator writes it (``ValueError`` when it does not parse)."""

from collections.abc import Callable
from typing import Any

from attrs import field

from sandboxd.units import parse_count, parse_duration, parse_size


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
) -> Any:
    """Declare one setting: its variable, default (as text an operator would write) and parser.

    A ``flag`` is a ``twistd sandboxd --option`` that takes no value (given: ``yes``).
    """
    return field(
        metadata={
            "env": env,
            "default": default,
            "parse": parse,
            "help": help,
            "secret": secret,
            "flag": flag,
        }
    )
