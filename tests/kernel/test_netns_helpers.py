"""The egress tests' own networks end with the test process, even one killed mid-test.

A run cut short by SIGKILL (a CI job's limit, a session's end) once left a namespace pinned by a
bind mount, and with it a veth and a route on the host for 203.0.113.0/24: every later
connection of the host to those addresses (the package registries' among them, on one machine)
went into the dead test's namespace. A :class:`Scene`'s namespaces are now held by keeper
processes that the kernel kills with the process that made them.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.kernel.netns_helpers import EGRESS_MARKS

pytestmark = EGRESS_MARKS

# A test process that builds a scene (a namespace wired to the host by a veth, a route into it)
# then waits to be killed. With ``plain`` its keeper is started without the parent-death signal.
CHILD = """
import sys, time
from tests.kernel.netns_helpers import Scene
if sys.argv[1] == "plain":
    Scene.keeper_argv = Scene.keeper_argv[3:]
scene = Scene()
inner = scene.netns("inner")
link = scene.wire("k", inner, ["198.18.99.254/24"], ["198.18.99.1/24"])
print(link, next(iter(scene.keepers.values())).pid, flush=True)
time.sleep(120)
"""

ROOT = Path(__file__).resolve().parents[2]


def links() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def gone(link: str, within: float = 10.0) -> bool:
    """Whether ``link`` disappears within ``within`` seconds (the keeper's signal and the
    namespace's teardown are asynchronous)."""
    for _ in range(int(within * 10)):
        if link not in links():
            return True
        time.sleep(0.1)
    return False


def killed_mid_scene(how: str) -> tuple[str, int]:
    """Start the child, let it build its scene, SIGKILL it (it alone, as a job's limit kills
    the test runner); its veth's name and its keeper's pid."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, how], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    link, keeper = child.stdout.readline().split()
    assert link in links()
    child.kill()
    child.wait()
    child.stdout.close()
    return link, int(keeper)


def test_a_killed_test_process_leaves_no_namespace_veth_or_route() -> None:
    link, _ = killed_mid_scene("keeper")
    assert gone(link), f"{link} outlived the test process that made it"
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True)
    assert "198.18.99." not in routes.stdout


def test_without_the_parent_death_signal_the_namespace_outlives_it() -> None:
    """The protection off: a keeper that does not follow its parent keeps all of it."""
    link, keeper = killed_mid_scene("plain")
    try:
        assert not gone(link, within=2.0)
        routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True)
        assert "198.18.99.0/24" in routes.stdout
    finally:
        os.kill(keeper, signal.SIGKILL)
    assert gone(link)
