"""tests/vm/guest.sh: the accelerator probe boots a real guest and tells booting from failing.

The probe that decides between KVM and software emulation for the test VMs is a qemu boot of the
cached guest kernel to a busybox init. Here the same probe runs under software emulation (which
always works) to show that a guest reaching its init is seen, and with a file that is no kernel
to show that a failed boot is seen as one, with qemu's reason. Needs root, qemu and the kernel
that .ci/vm-deps.sh caches; skipped otherwise.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

GUEST_SH = Path(__file__).resolve().parent / "guest.sh"


def _bash(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {GUEST_SH}; {script}"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def _cached_kernel() -> str | None:
    out = _bash('guest_kernel_image "$(guest_kernel_dir --offline)"')
    return out.stdout.strip() if out.returncode == 0 else None


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("qemu-system-x86_64") is None or not Path("/bin/busybox").exists():
        return "needs qemu-system-x86 and busybox-static (.ci/vm-deps.sh)"
    if _cached_kernel() is None:
        return "no cached guest kernel (.ci/vm-deps.sh)"
    return None


pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def kernel() -> str:
    why = _why_not()
    if why is not None:
        pytest.skip(why)
    image = _cached_kernel()
    assert image is not None
    return image


def test_probe_sees_a_guest_reach_its_init(kernel: str) -> None:
    out = _bash(f"guest_boots_to_init tcg max {kernel} 240")
    assert out.returncode == 0, out.stderr


def test_probe_sees_a_boot_fail_and_says_why(kernel: str, tmp_path: Path) -> None:
    not_a_kernel = tmp_path / "vmlinuz"
    not_a_kernel.write_bytes(b"\0" * 4096)
    out = _bash(
        f'guest_boots_to_init tcg max {not_a_kernel} 60 || echo "failed: $guest_probe_said"'
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("failed: qemu exited "), out.stdout


@pytest.mark.parametrize("accel", ["kvm", "tcg"])
def test_vm_accel_names_the_accelerator_without_probing(kernel: str, accel: str) -> None:
    out = _bash(f"guest_accel {kernel}", VM_ACCEL=accel)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{accel}\n"
    assert "no probe" in out.stderr


def test_vm_accel_refuses_an_unknown_accelerator(kernel: str) -> None:
    out = _bash(f"guest_accel {kernel}", VM_ACCEL="hvf")
    assert out.returncode != 0
    assert "expected kvm, tcg or auto" in out.stderr


def test_probe_prints_its_choice_and_reason(kernel: str) -> None:
    # The probe's own timeout, as tests/vm/run.sh probes (where KVM is refused, as on these
    # machines, the test waits for all of it).
    out = _bash(f"guest_accel {kernel}", VM_ACCEL="auto")
    assert out.returncode == 0, out.stderr
    choice = out.stdout.strip()
    assert choice in ("kvm", "tcg")
    assert f"accelerator {choice}" in out.stderr
    if choice == "kvm":
        assert "reached its init" in out.stderr
    else:
        assert "software emulation" in out.stderr
