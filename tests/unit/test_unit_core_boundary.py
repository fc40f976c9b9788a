"""The boundary between the core and the fronts (issue 28, "one seam per concern").

The fronts (``sandboxd.http``, ``sandboxd.e2b``, and ``sandboxd.web`` once it exists) take
core things from the facade, ``sandboxd.core``, and only the names it exports; the core
imports no front and nothing of a web server (``klein``, ``werkzeug``, ``twisted.web``'s
server side). Its tool resolver is an HTTP *client*: it may use ``twisted.web``'s client
side, by name.

Checked on the source's syntax trees (every import, including those inside functions and
``TYPE_CHECKING`` blocks): ``import-linter`` can forbid an external package only at its root
(``twisted``, never ``twisted.web``), nor tell the facade from the modules behind it.
"""

import ast
from collections.abc import Iterator
from pathlib import Path

import sandboxd.core

ROOT = Path(__file__).resolve().parents[2] / "sandboxd"
FRONTS = ("http", "e2b", "web")
FACADE = "sandboxd.core"

FORBIDDEN_IN_CORE = ("klein", "werkzeug", "sandboxd.http", "sandboxd.e2b", "sandboxd.web")
WEB_CLIENT_SIDE: dict[str, frozenset[str] | None] = {
    "twisted.web.client": None,  # any name: the client
    "twisted.web.http": frozenset({"PotentialDataLoss"}),
    "twisted.web.iweb": frozenset({"IResponse", "IBodyProducer", "UNKNOWN_LENGTH"}),
}
"""What of ``twisted.web`` the core may import (``None``: every name of that module)."""


def imports(source: str) -> Iterator[tuple[int, str, str | None]]:
    """Every import of ``source``: its line, the module, and the name taken from it
    (``None`` for ``import module``)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                yield node.lineno, node.module, alias.name


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def front_violations(source: str, exported: set[str]) -> list[str]:
    """The imports of a front's ``source`` that go around the facade, or take from it a name
    it does not export."""
    found = []
    for line, module, name in imports(source):
        if within(module, FACADE) and (module != FACADE or name is None):
            found.append(f"{line}: {module} (import core things from {FACADE})")
        elif module == FACADE and name not in exported:
            found.append(f"{line}: {name} is not in {FACADE}.__all__")
    return found


def core_violations(source: str) -> list[str]:
    """The imports of a core ``source`` of a front or of a web server."""
    found = []
    for line, module, name in imports(source):
        if any(within(module, banned) for banned in FORBIDDEN_IN_CORE):
            found.append(f"{line}: {module}")
        elif within(module, "twisted.web") or (module == "twisted" and name == "web"):
            allowed = WEB_CLIENT_SIDE.get(module, frozenset())
            if name is None or (allowed is not None and name not in allowed):
                found.append(f"{line}: {module}{'' if name is None else '.' + name}")
    return found


def sources(*parts: str) -> Iterator[tuple[str, str]]:
    top = ROOT.joinpath(*parts)
    for path in sorted(top.rglob("*.py")):
        yield str(path.relative_to(ROOT.parent)), path.read_text()


def test_the_fronts_use_the_core_through_its_facade_only() -> None:
    exported = set(sandboxd.core.__all__)
    seen = 0
    found = []
    for front in FRONTS:
        for name, source in sources(front):
            seen += 1
            found += [f"{name}:{v}" for v in front_violations(source, exported)]
    assert seen > 20  # both fronts were read
    assert found == []


def test_the_core_imports_no_front_and_no_web_server() -> None:
    found = []
    for name, source in sources("core"):
        found += [f"{name}:{v}" for v in core_violations(source)]
    assert found == []


def test_the_facade_exports_what_it_names() -> None:
    assert all(hasattr(sandboxd.core, name) for name in sandboxd.core.__all__)
    assert len(set(sandboxd.core.__all__)) == len(sandboxd.core.__all__)


def test_the_checks_catch_each_way_around() -> None:
    exported = {"SandboxManager"}
    front = (
        "from sandboxd.core import SandboxManager\n"
        "from sandboxd.core.manager import SandboxManager\n"
        "import sandboxd.core.files.workspace\n"
        "from sandboxd.core import Layout\n"
        "def late() -> None:\n"
        "    from sandboxd.core.sandbox import Sandbox\n"
    )
    assert [v.split(":")[0] for v in front_violations(front, exported)] == ["2", "3", "4", "6"]
    core = (
        "from twisted.web.client import Agent\n"
        "from twisted.web.iweb import IResponse\n"
        "from twisted.web.iweb import IRequest\n"
        "from twisted.web.server import Site\n"
        "import twisted.web.resource\n"
        "from twisted import web\n"
        "from klein import Klein\n"
        "from sandboxd.http import wire\n"
        "if True:\n"
        "    from sandboxd.e2b.wire import body\n"
        "from sandboxd.httpx import fine\n"
    )
    assert [v.split(":")[0] for v in core_violations(core)] == [
        "3",
        "4",
        "5",
        "6",
        "7",
        "8",
        "10",
    ]
