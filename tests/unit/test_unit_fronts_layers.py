"""The fronts stand side by side on the shared web plumbing (docs/architecture.rst): the E2B
front (``sandboxd/e2b``) imports nothing of the native front (``sandboxd/http``) nor the native
front anything of the E2B front, and the plumbing (``sandboxd/web``) neither. The sources are
parsed (``ast``) for every ``import`` and ``from … import``, at any depth (a function's or a
``TYPE_CHECKING`` block's too)."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FORBIDDEN = {
    "sandboxd/e2b": ("sandboxd.http",),
    "sandboxd/http": ("sandboxd.e2b",),
    "sandboxd/web": ("sandboxd.http", "sandboxd.e2b"),
}
"""Each package → the packages none of its modules may import."""


def imported(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (``from a import b``: ``a`` and ``a.b``), with its line."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and not node.level:
            names.append((node.lineno, node.module))
            names += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return names


def is_within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def crossings(package: str) -> list[str]:
    """Each import in ``package`` of a package it may not import, as ``path:line: name``."""
    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        for line, name in imported(path):
            if any(is_within(name, banned) for banned in FORBIDDEN[package]):
                found.append(f"{path.relative_to(REPO)}:{line}: {name}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_front_imports_nothing_of_the_other(package: str) -> None:
    assert (REPO / package / "__init__.py").is_file()
    assert crossings(package) == []


def test_the_scan_sees_every_form_of_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import sandboxd.http.wire\n"
        "from sandboxd import http\n"
        "from . import sibling\n"
        "def f() -> None:\n"
        "    from sandboxd.http.parse import query\n"
    )
    names = [name for _, name in imported(source)]
    assert names == [
        "sandboxd.http.wire",
        "sandboxd",
        "sandboxd.http",
        "sandboxd.http.parse",
        "sandboxd.http.parse.query",
    ]
    assert is_within("sandboxd.http", "sandboxd.http")
    assert not is_within("sandboxd.httpx", "sandboxd.http")
