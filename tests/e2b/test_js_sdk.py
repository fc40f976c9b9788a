"""The unmodified E2B JavaScript SDK (``e2b`` from npm, pinned in ``tests/e2b/js``) against a
real daemon: each scenario of ``tests/e2b/js/scenarios.mjs`` runs under Node.

The SDK is installed by ``tests/run`` (``npm ci`` in ``tests/e2b/js``); without Node 20 or
later, or without that install, these tests are skipped and say why.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2b.conftest import TOKEN, E2BDaemon

JS = Path(__file__).parent / "js"
NODE_MIN = 20


def node_problem() -> str | None:
    """Why the JavaScript SDK cannot run here, or ``None``."""
    node = shutil.which("node")
    if node is None:
        return "no `node` on PATH (the JavaScript SDK's tests need Node >= 20)"
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout
    found = re.match(r"v(\d+)\.", version)
    if found is None or int(found.group(1)) < NODE_MIN:
        return f"node {version.strip() or '?'} is older than {NODE_MIN}"
    if not (JS / "node_modules" / "e2b" / "package.json").exists():
        return "tests/e2b/js/node_modules is missing: run `npm ci` in tests/e2b/js"
    return None


SCENARIOS = ["commands", "files", "rateLimit", "invalidArgument", "timeout", "killed"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_js_sdk(unisolated_front: E2BDaemon, scenario: str) -> None:
    problem = node_problem()
    if problem is not None:
        pytest.skip(problem)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(
        E2B_API_URL=unisolated_front.url,
        E2B_SANDBOX_URL=unisolated_front.url,
        E2B_API_KEY=TOKEN,
        NO_PROXY="127.0.0.1,localhost",
    )
    done = subprocess.run(
        ["node", "scenarios.mjs", scenario],
        cwd=JS,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stdout.splitlines()[-1] == f"ok {scenario}"
