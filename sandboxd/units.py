"""Friendly units of the configuration: sizes (``512M``), durations (``30m``) and cores (``1.5``).

Each parser takes the text an operator wrote and returns the internal value, or raises
``ValueError`` with a message that says what was expected.
"""

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_FACTORS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|)\s*$", re.IGNORECASE)
_DURATION_FACTORS = {"ms": 0.001, "": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_size(text: str) -> int:
    """Bytes from ``1024``, ``64K``, ``512M``, ``512MiB``, ``1.5G`` (binary multiples)."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size like 512M, 2G or 1048576")
    number, unit, _ = match.groups()
    return int(float(number) * _SIZE_FACTORS[unit.lower()])


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``500ms``, ``30m``, ``2h``, ``1d``."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 30s, 10m or 1h")
    number, unit = match.groups()
    return float(number) * _DURATION_FACTORS[unit.lower()]


def parse_cores(text: str) -> float:
    """A positive number of CPU cores, such as ``1``, ``0.5`` or ``2.5``."""
    try:
        cores = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of cores like 1.0 or 0.5") from None
    if not cores > 0 or cores == float("inf"):
        raise ValueError(f"{text!r} is not a positive number of cores")
    return cores


def parse_count(text: str) -> int:
    """A non-negative whole number."""
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise ValueError(f"{text!r} is negative")
    return value


def format_size(size: int) -> str:
    """``536870912`` → ``512M``: the largest binary unit that gives a whole number, so that
    :func:`parse_size` reads the text back to the same bytes."""
    for unit in ("P", "T", "G", "M", "K"):
        factor = _SIZE_FACTORS[unit.lower()]
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def format_duration(seconds: float) -> str:
    """``600`` → ``10m``, ``0.5`` → ``500ms``: the largest unit giving a whole number, so that
    :func:`parse_duration` reads the text back to the same seconds."""
    for unit in ("d", "h", "m", "s"):
        factor = _DURATION_FACTORS[unit]
        if seconds and seconds % factor == 0:
            return f"{int(seconds // factor)}{unit}"
    milliseconds = seconds * 1000
    if milliseconds == int(milliseconds):
        return f"{int(milliseconds)}ms"
    return f"{seconds}s"
