"""``code-interpreter-v1`` (the ``e2b-code-interpreter`` SDK's default template) in a template
of the replica (docs/e2b.rst, "Code interpreter"): the unmodified SDK against a real daemon
under the real isolation (as root; skipped as a user), with small templates made in the test
in place of the recipe's (which downloads Debian: tests/templates/
test_templates_code_interpreter.py builds it and runs cells in it).

- A template named ``code-interpreter`` (the recipe's name) is where the SDK's sandbox runs;
  one named ``code-interpreter-v1`` comes before it; without either, the host's root and its
  python3 run the cells, as before templates.
- A template without python, or with a python without ipykernel: a cell is refused naming
  what the template lacks and the recipe that has it, never run with the host's python."""

import json
import os
import subprocess
from collections.abc import Callable, Iterator

import pytest
from e2b import SandboxException
from e2b_code_interpreter import Sandbox

from sandboxd.core.contexts.languages import PROBE
from tests.e2b.conftest import E2BDaemon, point_sdk_at
from tests.e2b.test_templates import native
from tests.templates.archives import Entry, directory, file, link
from tests.templates.rootfs import OS_RELEASE, host_binary, rootfs

CREATE = {"timeout": 120, "allow_internet_access": False}
"""No network: egress is one per host, and other daemons may hold it."""


Put = Callable[[str, bytes], None]


def host_python() -> list[Entry]:
    """The host's python3 with the part of its standard library the languages' probe loads
    (each module the probe has in ``sys.modules`` once it has answered), and no ipykernel."""
    listing = PROBE + (
        "print(json.dumps(sorted({getattr(m, '__file__', None) or '' for m in"
        " list(sys.modules.values())} - {''})))\n"
    )
    answer = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", listing, "ipykernel"],
        capture_output=True,
        check=True,
        timeout=60,
    )
    paths = [p for p in json.loads(answer.stdout.splitlines()[-1]) if "-packages/" not in p]
    real = os.path.realpath("/usr/bin/python3")
    entries = [link("usr/bin/python3", os.path.basename(real))]
    entries += host_binary(real, real.lstrip("/"), 0o755)
    made: set[str] = set()
    for path in paths:
        parents = path.lstrip("/").split("/")[:-1]
        for depth in range(1, len(parents) + 1):
            parent = "/".join(parents[:depth])
            if parent not in made:
                made.add(parent)
                entries.append(directory(parent))
        with open(path, "rb") as module:
            entries.append(file(path.lstrip("/"), module.read()))
    return entries


@pytest.fixture
def put(monkeypatch: pytest.MonkeyPatch, isolated_front: E2BDaemon) -> Iterator[Put]:
    """Imports a template into the real isolation's front (the SDK pointed at it); each is
    deleted after the test."""
    point_sdk_at(monkeypatch, isolated_front)
    imported: list[str] = []

    def put(name: str, archive: bytes) -> None:
        assert native(isolated_front, "PUT", f"/templates/{name}", archive) == 201
        imported.append(name)

    try:
        yield put
    finally:
        for name in imported:
            assert native(isolated_front, "DELETE", f"/templates/{name}") == 204


def test_the_sdks_sandbox_runs_in_the_code_interpreter_template(put: Put) -> None:
    put("code-interpreter", rootfs("/bin/bash"))
    with Sandbox.create(**CREATE) as sbx:
        assert sbx.commands.run("cat /etc/os-release").stdout.encode() == OS_RELEASE
        assert sbx.commands.run("whoami").stdout.strip() == "user"
        message = (
            "contexts are not available in this sandbox: /usr/bin/python3 in template"
            " 'code-interpreter' cannot run"
        )
        with pytest.raises(SandboxException, match=message) as refused:
            sbx.run_code("1")
        assert "the recipe 'code-interpreter'" in str(refused.value)
        listed = Sandbox.list().next_items()
        assert [s.template_id for s in listed if s.sandbox_id == sbx.sandbox_id] == [
            "code-interpreter-v1"
        ]


def test_a_template_whose_python_has_no_ipykernel_is_named(put: Put) -> None:
    put("code-interpreter", rootfs("/bin/bash", extra=host_python()))
    with Sandbox.create(**CREATE) as sbx:
        assert sbx.commands.run("python3 -c 'print(6 * 7)'").stdout == "42\n"
        message = (
            "contexts are not available in this sandbox: /usr/bin/python3 in template"
            " 'code-interpreter' has no ipykernel: build the template from the recipe"
            " 'code-interpreter'"
        )
        with pytest.raises(SandboxException, match=message):
            sbx.run_code("1", language="bash")  # its kernel needs ipykernel too


def test_a_template_under_e2bs_own_name_comes_first(put: Put) -> None:
    put("code-interpreter", rootfs("/bin/bash"))
    put("code-interpreter-v1", rootfs("/bin/bash", extra=[file("etc/which", b"v1\n")]))
    with Sandbox.create(**CREATE) as sbx:
        assert sbx.commands.run("cat /etc/which").stdout == "v1\n"


def test_without_the_template_the_hosts_python_runs_the_cells(put: Put) -> None:
    with Sandbox.create(**CREATE) as sbx:
        assert sbx.commands.run("cat /etc/os-release").stdout.encode() != OS_RELEASE
        sbx.run_code("x = 1")
        assert sbx.run_code("x + 1").text == "2"
