"""E2B's template build API of the unmodified JavaScript SDK (``e2b`` from npm, pinned in
``tests/e2b/js``) against a real daemon as root (docs/e2b.rst, "Building templates"):
``tests/e2b/js/templates.mjs`` builds FROM a template imported here, with a ``copy``, an env,
a ``RUN``, tags and a failed step, then a sandbox runs in what was built. Skipped, saying
why, without Node 20 or the SDK's install (tests/e2b/test_js_sdk.py)."""

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2b.conftest import TOKEN, E2BDaemon
from tests.e2b.test_e2b_template_build import names
from tests.e2b.test_js_sdk import JS, node_problem
from tests.e2b.test_templates import native
from tests.templates.rootfs import rootfs

BASE = "e2b-js-base"


@pytest.fixture
def front(isolated_front: E2BDaemon) -> Iterator[E2BDaemon]:
    problem = node_problem()
    if problem is not None:
        pytest.skip(problem)
    assert native(isolated_front, "PUT", f"/templates/{BASE}", rootfs("/bin/bash")) == 201
    try:
        yield isolated_front
    finally:
        for name in names(isolated_front):
            if name.startswith(("e2b-js-",)):
                native(isolated_front, "DELETE", f"/templates/{name}")


def test_the_js_sdk_builds_a_template(front: E2BDaemon, tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("hello from js\n")
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(
        E2B_API_URL=front.url,
        E2B_SANDBOX_URL=front.url,
        E2B_API_KEY=TOKEN,
        NO_PROXY="127.0.0.1,localhost",
        TEMPLATE_BASE=BASE,
        TEMPLATE_NAME=f"e2b-js-{uuid.uuid4().hex[:10]}",
        TEMPLATE_CONTEXT=str(tmp_path),
    )
    done = subprocess.run(
        ["node", "templates.mjs"], cwd=JS, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stdout.splitlines()[-1] == "ok templates"
