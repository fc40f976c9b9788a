"""Workspace path normalisation (``sandboxd.core.files.paths``): the one place path text
becomes parts."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sandboxd.core.files.paths import NAME_MAX, PATH_MAX, display, normalise
from sandboxd.errors import BadRequest, SandboxdError
from sandboxd.http import wire

# Path-like text: components drawn mostly from the interesting ones.
component = st.one_of(
    st.sampled_from(["", ".", "..", "a", "b", "...", ".hidden", " ", "é", "a b"]),
    st.text(alphabet=st.characters(blacklist_characters="/\0"), max_size=8),
)
path_text = st.lists(component, max_size=12).map("/".join) | st.text(max_size=40)

# Deterministic: the same examples on every run, no example database, no deadline.
deterministic = settings(derandomize=True, database=None, deadline=None, max_examples=100)


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("", ()),
        ("/", ()),
        (".", ()),
        ("//", ()),
        ("a/b", ("a", "b")),
        ("/a/b", ("a", "b")),
        ("a//b/", ("a", "b")),
        ("./a/./b/.", ("a", "b")),
        ("a/../b", ("b",)),
        ("a/b/../..", ()),
        ("...", ("...",)),
        ("a/..b", ("a", "..b")),
    ],
)
def test_normalise(text: str, parts: tuple[str, ...]) -> None:
    assert normalise(text) == parts


@pytest.mark.parametrize("text", ["..", "/..", "../a", "a/../..", "a/../../b", "./.."])
def test_climbing_above_the_root_is_refused(text: str) -> None:
    with pytest.raises(BadRequest, match="escapes the workspace"):
        normalise(text)


def test_lone_surrogates_are_refused() -> None:
    with pytest.raises(BadRequest, match="not valid Unicode"):
        normalise("a/\ud800/b", "src")


def test_errors_name_the_field() -> None:
    with pytest.raises(BadRequest, match=r"^dst: "):
        normalise("..", "dst")
    with pytest.raises(BadRequest, match=r"^cwd: must be a string"):
        normalise(3, "cwd")
    with pytest.raises(BadRequest, match=r"^path: contains a NUL byte"):
        normalise("a\0b")


@pytest.mark.parametrize("value", [None, 1, 1.5, True, ["a"], {"a": 1}, b"a"])
def test_only_strings_are_paths(value: object) -> None:
    with pytest.raises(BadRequest, match="must be a string"):
        normalise(value)


def test_length_limits() -> None:
    assert normalise("x" * NAME_MAX) == ("x" * NAME_MAX,)
    with pytest.raises(BadRequest, match="longer than"):
        normalise("x" * (NAME_MAX + 1))
    with pytest.raises(BadRequest, match="longer than"):
        normalise("é" * (NAME_MAX // 2 + 1))  # two bytes each in UTF-8
    with pytest.raises(BadRequest, match=f"longer than {PATH_MAX}"):
        normalise("a/" * (PATH_MAX // 2))


def test_display() -> None:
    assert display(()) == "/"
    assert display(("a", "b")) == "/a/b"


def test_bad_request_carries_its_status() -> None:
    error = BadRequest("x: bad")
    assert (*wire.status_and_type(error), wire.detail_of(error)) == (400, "BadRequest", "x: bad")
    assert wire.detail_of(SandboxdError()) == "InternalError"


@deterministic
@given(path_text)
@example("a/../../b")
@example("/../")
@example("\ud800")
@example("a/\udcff")
def test_never_escapes(text: str) -> None:
    try:
        parts = normalise(text)
    except BadRequest:
        return
    for part in parts:
        assert part not in ("", ".", "..")
        assert "/" not in part and "\0" not in part
    root = "/workspace"
    joined = posixpath.normpath(posixpath.join(root, *parts))
    assert joined == root or joined.startswith(root + "/")


@deterministic
@given(path_text)
def test_display_and_normalise_round_trip(text: str) -> None:
    try:
        parts = normalise(text)
    except BadRequest:
        return
    shown = display(parts)
    assert shown.startswith("/")
    assert normalise(shown) == parts
    assert display(normalise(shown)) == shown
    # A leading "/" changes nothing.
    assert normalise("/" + text) == parts


@deterministic
@given(path_text)
def test_lexical_like_posix(text: str) -> None:
    """Where it accepts a path, normalise agrees with posixpath's lexical normalisation."""
    try:
        parts = normalise(text)
    except BadRequest:
        return
    assert display(parts) == posixpath.normpath("/" + text).replace("//", "/")
