"""The privilege-drop steps are specified once (``sandboxd.isolation.privdrop``) and every chain
uses them: the oom_score_adj rule, tried for real as an unprivileged process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sandboxd.core.archive.rsync import RSH_SCRIPT
from sandboxd.isolation import privdrop
from sandboxd.isolation.wrapper import Programs, _root_script

OLD_RSYNC_RULE = f"echo 0 > {privdrop.OOM_SCORE_ADJ} || exit {privdrop.SETUP_FAILED}"
"""What the rsync side did before the rule was shared: fail on any value it cannot reset."""


def test_every_shell_chain_resets_oom_score_adj_by_the_one_rule() -> None:
    programs = Programs(sh="/bin/sh", setsid="setsid", setpriv="setpriv", env="env")
    assert privdrop.oom_reset_sh("sandboxd-exec") in _root_script(programs)
    assert privdrop.oom_reset_sh("sandboxd-rsh") in RSH_SCRIPT
    assert OLD_RSYNC_RULE not in RSH_SCRIPT
    drop = " ".join(privdrop.setpriv_args('"$SANDBOXD_RSH_UID"', '"$SANDBOXD_RSH_GID"'))
    assert drop in RSH_SCRIPT
    assert "'" not in privdrop.oom_reset_sh("x")  # it travels inside rsync's single quotes


def run_unprivileged(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in ``sh`` as nobody, its oom_score_adj raised to 100 first (which nobody may
    not lower again)."""

    def raise_then_drop() -> None:
        Path(privdrop.OOM_SCORE_ADJ).write_text("100")
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    return subprocess.run(
        ["/bin/sh", "-c", script],
        preexec_fn=raise_then_drop,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another uid")
@pytest.mark.parametrize("rule", ["shared", "old rsync rule"])
def test_a_value_above_zero_that_cannot_be_lowered_is_kept(rule: str) -> None:
    step = privdrop.oom_reset_sh("test") if rule == "shared" else OLD_RSYNC_RULE
    done = run_unprivileged(f"{step}; cat {privdrop.OOM_SCORE_ADJ}")
    if rule == "shared":
        assert (done.returncode, done.stdout.strip()) == (0, "100")
    else:  # the difference that was a bug: the copy failed where the command ran
        assert done.returncode == privdrop.SETUP_FAILED
