"""The rsync workspace end enters the sandbox's namespaces (``nsenter``) before it drops
privilege; what it is handed must be usable (the kernel runs are in test_archive_kernel)."""

from typing import Any

import pytest

from sandboxd.core.archive.rsync import RSH_SCRIPT, Rsync, RsyncFailed, WorkspaceEnd
from sandboxd.isolation.base import Identity


class Spawner:
    def __init__(self) -> None:
        self.env: dict[str, str] = {}

    def spawnProcess(self, protocol: Any, executable: str, argv: Any, env: Any, **kw: Any) -> None:
        self.env = env


def test_namespaces_travel_to_the_remote_shell() -> None:
    spawner = Spawner()
    rsync = Rsync(spawner, "/usr/bin/rsync", "/usr/bin/setpriv")  # type: ignore[arg-type]
    end = WorkspaceEnd(Identity(1, 1), (), "/w", ("--ipc=/p/ipc", "--mount=/p/mnt"), "/nsenter")
    rsync.with_workspace(end, ["x"])
    assert spawner.env["SANDBOXD_RSH_NS"] == "--ipc=/p/ipc --mount=/p/mnt"
    assert spawner.env["SANDBOXD_RSH_NSENTER"] == "/nsenter"
    assert (
        spawner.env["SANDBOXD_RSH_DIR"] == "/w"
        and "SANDBOXD_RSH_DIR" in spawner.env["SANDBOXD_RSH_CD"]
    )
    assert RSH_SCRIPT.index("SANDBOXD_RSH_SETPRIV") < RSH_SCRIPT.index("SANDBOXD_RSH_NSENTER")


@pytest.mark.parametrize(
    ("options", "nsenter"), [(("--ipc=/p/ipc",), None), (("--ipc=/a b",), "/nsenter")]
)
def test_unusable_namespaces_are_refused(options: tuple[str, ...], nsenter: str | None) -> None:
    rsync = Rsync(Spawner(), "/usr/bin/rsync", "/usr/bin/setpriv")  # type: ignore[arg-type]
    with pytest.raises(RsyncFailed, match="cannot enter the namespaces"):
        rsync.with_workspace(WorkspaceEnd(Identity(1, 1), (), "/w", options, nsenter), [])
