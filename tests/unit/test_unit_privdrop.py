"""The privilege-drop steps are specified once (``sandboxd.isolation.exec.privdrop``) and every
chain uses them: the oom_score_adj rule, tried for real as an unprivileged process."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.core.archive.rsync import RSH_SCRIPT
from sandboxd.isolation.exec import privdrop
from sandboxd.isolation.exec.wrapper import Programs, _root_script


def test_the_shell_chain_resets_oom_score_adj_by_the_one_rule_and_rsync_adds_no_step() -> None:
    programs = Programs(sh="/bin/sh", setsid="setsid", setpriv="setpriv", env="env")
    assert privdrop.oom_reset_sh("sandboxd-exec") in _root_script(programs)
    assert " ".join(privdrop.setpriv_args('"$u"', '"$g"')) in _root_script(programs)
    for step in ("oom_score_adj", "setpriv", "nsenter", "procs", "cd "):
        assert step not in RSH_SCRIPT, "the rsync end goes through the one chain"


def run_as_nobody(script: str) -> subprocess.CompletedProcess[str]:
    def drop() -> None:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    return subprocess.run(
        ["/bin/sh", "-c", script],
        preexec_fn=drop,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture
def adj_file() -> Iterator[str]:
    """A stand-in for ``oom_score_adj`` holding 100 that nobody may not write (as the real
    file refuses a lower value without ``CAP_SYS_RESOURCE``)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        os.chmod(top, 0o755)
        path = os.path.join(top, "oom_score_adj")
        Path(path).write_text("100\n")
        os.chmod(path, 0o644)
        yield path


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another uid")
@pytest.mark.parametrize("rule", ["shared", "old rsync rule"])
def test_a_value_above_zero_that_cannot_be_lowered_is_kept(rule: str, adj_file: str) -> None:
    if rule == "shared":
        step = privdrop.oom_reset_sh("test", adj_file)
    else:
        step = f"echo 0 > {adj_file} || exit {privdrop.SETUP_FAILED}"
    done = run_as_nobody(f"{step}; cat {adj_file}")
    if rule == "shared":
        assert (done.returncode, done.stdout.strip()) == (0, "100"), done.stderr
    else:  # the difference that was a bug: the copy failed where the command ran
        assert done.returncode == privdrop.SETUP_FAILED


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another uid")
def test_a_value_below_zero_that_cannot_be_reset_stops_the_chain(adj_file: str) -> None:
    Path(adj_file).write_text("-500\n")
    done = run_as_nobody(f"{privdrop.oom_reset_sh('test', adj_file)}; echo started")
    assert done.returncode == privdrop.SETUP_FAILED
    assert "test: cannot reset oom_score_adj" in done.stderr and "started" not in done.stdout
