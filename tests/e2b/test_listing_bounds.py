"""``files.list`` of a deep tree of long names through the unmodified SDK (issue 29: "an E2B
directory listing of a deep tree of long names answers a body thousands of times the tree's
size"). The sandbox makes the tree itself; a listing whose answer would pass the cap, or
whose ``depth`` passes 100, raises the SDK's ``InvalidArgumentException`` naming the cap,
the daemon's peak RSS grows by a few MiB only, and a listing within the caps still answers
(docs/e2b.rst, "Coverage").
"""

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import InvalidArgumentException, Sandbox

from tests.e2b.conftest import E2BDaemon, point_sdk_at, running_front
from tests.process.test_walk_long_names import DEEP_TREE, RSS_BOUND, WIDE_LEVEL


@pytest.fixture(params=["isolation-none", "isolation-real"])
def front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[E2BDaemon]:
    """A daemon of its own (its peak RSS is this test's alone), with and without the real
    isolation (the sandbox's uid makes the tree; the listing runs as it)."""
    args = ["--isolation=none"] if request.param == "isolation-none" else []
    with running_front(tmp_path, *args) as running:
        yield point_sdk_at(monkeypatch, running)


def test_a_listing_of_a_deep_tree_of_long_names_is_refused_past_its_caps(
    front: E2BDaemon,
) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        assert sbx.commands.run(f'python3 -c "{DEEP_TREE}"', timeout=120).exit_code == 0
        before = front.daemon.rss_kib("VmHWM")
        with pytest.raises(InvalidArgumentException, match="passes 16777216 bytes"):
            sbx.files.list("/home/user", depth=WIDE_LEVEL + 2)
        with pytest.raises(InvalidArgumentException, match="depth: at most 100"):
            sbx.files.list("/home/user", depth=1000)
        grown = front.daemon.rss_kib("VmHWM") - before
        print(f"\ndeep listing: daemon peak RSS grew {grown} KiB")
        assert grown < RSS_BOUND, grown
        within = sbx.files.list("/home/user", depth=WIDE_LEVEL)
        deepest = "/home/user" + ("/" + "n" * 250) * WIDE_LEVEL  # a file and a dir each level
        assert len(within) == 2 * WIDE_LEVEL and within[-1].path == deepest
    finally:
        sbx.kill()
