"""Friendly units of the configuration (``sandboxd.units``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxd.units import (
    format_duration,
    format_size,
    parse_cores,
    parse_count,
    parse_duration,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1024", 1024),
        ("64K", 64 << 10),
        ("64k", 64 << 10),
        ("512M", 512 << 20),
        ("512MiB", 512 << 20),
        ("512mb", 512 << 20),
        ("2G", 2 << 30),
        ("1.5G", 3 << 29),
        ("1T", 1 << 40),
        ("1P", 1 << 50),
        (" 8 M ", 8 << 20),
        ("10B", 10),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "-1", "1X", "1 2", "one", "1e3", "0x10", "1.2.3K"])
def test_bad_sizes_say_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size like 512M"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("500ms", 0.5),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1.5s", 1.5),
        (" 5 S ", 5.0),
        ("0", 0.0),
    ],
)
def test_durations(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "s", "-5s", "5 minutes", "5w", "1e3", "soon"])
def test_bad_durations_say_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration like 30s"):
        parse_duration(text)


@pytest.mark.parametrize(("text", "expected"), [("1", 1.0), ("0.5", 0.5), (" 2.5 ", 2.5)])
def test_cores(text: str, expected: float) -> None:
    assert parse_cores(text) == expected


@pytest.mark.parametrize("text", ["one", "", "1 core"])
def test_cores_must_be_a_number(text: str) -> None:
    with pytest.raises(ValueError, match="is not a number of cores"):
        parse_cores(text)


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "1e400", "-inf"])
def test_cores_must_be_positive_and_finite(text: str) -> None:
    with pytest.raises(ValueError, match="is not a positive number of cores"):
        parse_cores(text)


@pytest.mark.parametrize(("text", "expected"), [("0", 0), ("256", 256), (" 7 ", 7)])
def test_counts(text: str, expected: int) -> None:
    assert parse_count(text) == expected


@pytest.mark.parametrize("text", ["", "1.5", "many", "1K"])
def test_counts_must_be_whole_numbers(text: str) -> None:
    with pytest.raises(ValueError, match="is not a whole number"):
        parse_count(text)


def test_counts_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="is negative"):
        parse_count("-3")


@settings(derandomize=True, database=None, deadline=None)
@given(st.integers(min_value=0, max_value=1 << 40), st.sampled_from(["", "K", "M", "G"]))
def test_size_round_trip(number: int, unit: str) -> None:
    factor = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit]
    assert parse_size(f"{number}{unit}") == number * factor


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "0"), (1000, "1000"), (1024, "1K"), (512 << 20, "512M"), (3 << 30, "3G"), (1536, "1536")],
)
def test_sizes_are_shown_in_the_largest_whole_unit(size: int, text: str) -> None:
    assert format_size(size) == text
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0ms"),
        (10.0, "10s"),
        (600.0, "10m"),
        (90.0, "90s"),
        (7200.0, "2h"),
        (86400.0, "1d"),
        (0.5, "500ms"),
        (0.0001, "0.0001s"),
    ],
)
def test_durations_are_shown_in_the_largest_whole_unit(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds
