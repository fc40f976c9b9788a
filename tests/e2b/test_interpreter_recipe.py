"""The built-in recipe ``code-interpreter`` built for real from Debian, then the unmodified
``e2b-code-interpreter`` SDK's default sandbox running its cells in it (docs/extensions.rst,
"Built-in recipes"; docs/e2b.rst, "Code interpreter"): a real daemon as root under the real
isolation, the build's ``RUN`` with the host's network (the Debian mirror only).

It downloads Debian's packages (about 150 MB; the suite's tarball is cached in
``/var/cache/sandboxd-test``): it runs only with ``SANDBOXD_SLOW_TESTS=1``, as
tests/templates/test_templates_build.py's Debian build does."""

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from e2b_code_interpreter import Sandbox

from tests.e2b.conftest import TOKEN, E2BDaemon, point_sdk_at, running_front

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(
        os.environ.get("SANDBOXD_SLOW_TESTS") != "1",
        reason="downloads Debian: SANDBOXD_SLOW_TESTS=1",
    ),
]

DEBIAN_CACHE = "/var/cache/sandboxd-test"


def build_recipe(front: E2BDaemon, name: str) -> list[dict[str, Any]]:
    """``POST /templates/{name}/build {"recipe": "code-interpreter"}``: its NDJSON frames,
    each step's start printed as it comes."""
    request = urllib.request.Request(
        f"{front.daemon.url}/templates/{name}/build",
        json.dumps({"recipe": "code-interpreter"}).encode(),
        {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    frames = []
    with urllib.request.urlopen(request, timeout=1800) as answer:
        assert answer.status == 200
        for line in answer:
            frame = json.loads(line)
            if "instruction" in frame:
                print(f"step {frame['step']}/{frame['steps']}: {frame['instruction'][:60]}")
            frames.append(frame)
    return frames


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BDaemon]:
    """A daemon under the real isolation whose template ``code-interpreter`` is the recipe's,
    built here (its sandboxes without network: the kernel needs none)."""
    tmp = tmp_path_factory.mktemp("interpreter-recipe")
    env = {"SANDBOXD_DEBIAN_CACHE": DEBIAN_CACHE}
    with running_front(tmp, "--template-max=2G", "--network-allow=none", env=env) as front:
        started = time.monotonic()
        frames = build_recipe(front, "code-interpreter")
        took = time.monotonic() - started
        assert frames[-1].get("end") == "built", frames[-20:]
        size = frames[-1]["template"]["size"]
        print(f"code-interpreter recipe: built in {took:.0f} s, {size / 1e6:.0f} MB of files")
        yield front


@pytest.fixture
def box(monkeypatch: pytest.MonkeyPatch, front: E2BDaemon) -> Iterator[Sandbox]:
    point_sdk_at(monkeypatch, front)
    with Sandbox.create(timeout=300, allow_internet_access=False) as created:
        yield created


def test_the_sdks_default_sandbox_runs_its_cells_in_the_template(box: Sandbox) -> None:
    # The template's root, not the host's: the host's mmdebstrap is not there.
    assert box.commands.run("test -e /usr/bin/mmdebstrap || echo absent").stdout == "absent\n"
    # munkres settled fonttools' alternative: no SciPy, no compiler (docs/extensions.rst)
    for path in ("/usr/lib/python3/dist-packages/scipy", "/usr/bin/g++"):
        assert box.commands.run(f"test -e {path} || echo absent").stdout == "absent\n", path
    started = time.monotonic()
    first = box.run_code("import numpy, pandas; x = 1")
    took = time.monotonic() - started
    print(f"first cell (a kernel started, numpy and pandas imported): {took:.1f} s")
    assert first.error is None, first.error
    assert box.run_code("x + 1").text == "2"
    assert box.run_code("import os; os.path.exists('/usr/bin/mmdebstrap')").text == "False"
    plotted = box.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    [chart] = [r for r in plotted.results if r.png]
    assert chart.png.startswith("iVBORw0KGgo")  # PNG's signature, base64
    table = box.run_code("pandas.DataFrame({'a': [1, 2]})")
    assert "<table" in (table.results[0].html or "")
    shell = box.run_code("echo $((6 * 7)); cd /tmp; pwd", language="bash")
    assert "".join(shell.logs.stdout) == "42\n/tmp\n"


def test_the_recipe_is_refused_under_a_name_taken(front: E2BDaemon) -> None:
    request = urllib.request.Request(
        f"{front.daemon.url}/templates/code-interpreter/build",
        json.dumps({"recipe": "code-interpreter"}).encode(),
        {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as taken:
        urllib.request.urlopen(request, timeout=60)
    assert taken.value.code == 409
