"""Fixtures of the whole suite.

As root, a daemon's sandboxes run as uids of its pool (under real isolation, and with
``--isolation=none`` too), and such a uid must pass through every directory above the state
root, tools or archive a test puts in its temporary directory. pytest makes those private to
root (0700): here, as root, each test's ``tmp_path`` and the directories above it up to the
system's temporary directory are made searchable by others (0711: entered by a known name,
never listed).
"""

import os
import tempfile
from pathlib import Path

import pytest


def searchable(path: Path) -> None:
    """Add search permission for others to ``path`` and each directory above it that lies
    inside the system's temporary directory."""
    top = Path(tempfile.gettempdir()).resolve()
    here = path.resolve()
    while here != top and top in here.parents:
        mode = here.stat().st_mode & 0o7777
        if not mode & 0o001:
            here.chmod(mode | 0o011)
        here = here.parent


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    """pytest's own ``tmp_path``, searchable by sandbox uids when the suite runs as root."""
    if os.geteuid() == 0:
        searchable(tmp_path)
    return tmp_path
