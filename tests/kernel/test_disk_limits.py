"""Disk limits for real: a sandbox fills its quota on a loop-mounted btrfs the test makes.

As root, each test makes its own filesystem (256 MiB image, loop device, mount beneath
``/tmp/sandboxd-tests``) as the daemon's state root, and takes it down again whatever happens.
The attack: a sandbox writes until the kernel stops it, by one big file, by many small ones, and
through a subvolume it makes itself. With ``SANDBOXD_DISK_MAX`` the kernel stops it at its limit
(``EDQUOT``) and its neighbour, the daemon and new sandboxes carry on; with the limit off the
same attack fills the filesystem and the neighbour's writes and uploads fail (the proof that the
test can fail).
"""

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from twisted.logger import capturedLogs, formatEvent

from sandboxd import boot
from sandboxd.config import Config
from sandboxd.core.files.tree import remove_tree
from sandboxd.core.layout import Layout
from sandboxd.isolation.base import Identity
from sandboxd.isolation.disk import btrfs_ioctl
from sandboxd.isolation.disk.base import DiskLimits, DiskUnavailable, DiskUsage
from sandboxd.isolation.disk.btrfs import PROBE, BtrfsQuotas
from sandboxd.isolation.namespaces.pins import NS_DIR
from sandboxd.isolation.network.egress_ca import CA_DIR
from tests.kernel.disk_fs import loop_filesystem, root_on, sh, stats, upload
from tests.support.daemon import SHARED_ROOTS, start_daemon, stop_daemon

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="loop mounts and real isolation need root"),
    pytest.mark.skipif(shutil.which("mkfs.btrfs") is None, reason="needs btrfs-progs"),
]
ON_HOST = pytest.mark.skipif(os.environ.get("SANDBOXD_VM") == "1", reason="btrfs squota: host")

MiB = 1 << 20
LIMIT = 32 * MiB
FILL = "timeout -s KILL 60 dd if=/dev/zero of={path} bs=1M count={count} 2>&1"
"""Writes ``count`` MiB to ``path``. The kernel holds the write to the limit as it reserves the
space; the usage it reports counts the data from the next transaction commit (``sync``)."""
SMALL_FILES = (
    "mkdir many && cd many || exit 4; i=0; while [ $i -lt 20000 ]; do"
    " echo x > f$i 2>/dev/null || { echo stopped at $i; exit 3; }; i=$((i+1)); done; echo all"
)


def uid_args(tmp_path: Path, first: int) -> list[str]:
    base = first + (abs(hash(str(tmp_path))) % 2000) * 16
    return [f"--uid-min={base}", f"--uid-max={base + 15}", "--memory-max=256M"]


def qgroups(mount: Path) -> set[str]:
    """The level-1 qgroups of the filesystem mounted at ``mount``."""
    fd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sysfs = Path(f"/sys/fs/btrfs/{btrfs_ioctl.filesystem_uuid(fd)}/qgroups")
    finally:
        os.close(fd)
    return {p.name for p in sysfs.iterdir() if p.name.startswith("1_")}


@ON_HOST
@pytest.mark.parametrize("limited", [True, False], ids=["disk-max", "no-limit"])
def test_a_sandbox_filling_its_disk_harms_nobody_else(tmp_path: Path, limited: bool) -> None:
    with loop_filesystem("btrfs", 256) as mount:
        root_on(tmp_path, mount)
        args = uid_args(tmp_path, 300_000 if limited else 340_000)
        if limited:
            args.append(f"--disk-max={LIMIT}")
        daemon = start_daemon(tmp_path, *args)
        try:
            capabilities = daemon.json("GET", "/healthz")["capabilities"]
            assert ("isolation.disk" in capabilities) is limited
            attacker, neighbour = daemon.create(), daemon.create()

            # Most of the limit in one file, the rest in many small files (each costs its
            # metadata), then one big file as far as the kernel lets it go (the filesystem is
            # 256 MiB), then through a subvolume of its own (any uid may make one).
            code, out, _ = sh(daemon, attacker, FILL.format(path="most", count=30))
            assert code == 0, out
            code, out, _ = sh(daemon, attacker, SMALL_FILES)
            if limited:
                assert code == 3 and "stopped at" in out, out
            code, out, _ = sh(daemon, attacker, FILL.format(path="big", count=400))
            assert code != 0, out
            assert ("Disk quota exceeded" if limited else "No space left on device") in out
            code, out, _ = sh(
                daemon,
                attacker,
                "btrfs subvolume create sub >/dev/null && " + FILL.format(path="sub/x", count=400),
            )
            assert code != 0, out
            # Its upload (a spooled body, linked or copied into place) is refused.
            assert upload(daemon, attacker, "/up", 4 * MiB) == 507
            code, out, _ = sh(daemon, attacker, "ls -a; ls sub")
            assert ".sandboxd-upload" not in out and "up\n" not in out

            # The neighbour: writes, an upload and a new sandbox.
            fill = FILL.format(path="data", count=8) + "; s=$?; sync; exit $s"
            code, out, _ = sh(daemon, neighbour, fill)
            upload_status = upload(daemon, neighbour, "/up", 4 * MiB)
            if limited:
                assert code == 0, out
                assert upload_status == 204
                assert daemon.call("POST", "/sandboxes", {})[0] == 200
                usage = stats(daemon, attacker)
                assert usage["disk_limit_bytes"] == LIMIT
                assert usage["disk_bytes"] is not None
                assert LIMIT - 2 * MiB <= usage["disk_bytes"] <= LIMIT
                assert sh(daemon, neighbour, "sync")[0] == 0
                # The upload, copied from the spool into the subvolume, is charged to it too.
                assert stats(daemon, neighbour)["disk_bytes"] >= 12 * MiB  # type: ignore[operator]
            else:  # the proof: the same attack, without the layer, starves the neighbour
                assert code != 0 and "No space left on device" in out, out
                assert upload_status == 507
                assert stats(daemon, attacker)["disk_bytes"] is None
            assert daemon.call("GET", "/healthz")[0] == 200
        finally:
            stop_daemon(daemon)


@ON_HOST
def test_quota_goes_at_kill_and_a_new_sandbox_starts_empty(tmp_path: Path) -> None:
    with loop_filesystem("btrfs", 256) as mount:
        root_on(tmp_path, mount)
        daemon = start_daemon(tmp_path, *uid_args(tmp_path, 380_000), f"--disk-max={LIMIT}")
        try:
            rid = daemon.create()
            before = qgroups(mount)
            assert len(before) == 1
            code, out, _ = sh(daemon, rid, FILL.format(path="data", count=16) + "; sync")
            assert code == 0, out
            assert stats(daemon, rid)["disk_bytes"] >= 16 * MiB  # type: ignore[operator]
            # A subvolume of the sandbox's own, with data: kill must take it too.
            code, out, _ = sh(daemon, rid, "btrfs subvolume create ../tmp/n && echo x > ../tmp/n/f")
            assert code == 0, out
            assert daemon.call("DELETE", f"/sandboxes/{rid}")[0] == 204
            assert not (mount / rid).exists()
            assert qgroups(mount) == set()
            # The state root keeps its lock, the (now empty) directory of namespace pins and
            # the egress proxy's CA (the daemon's, made at its start).
            assert sorted(os.listdir(mount)) == sorted([".lock", NS_DIR, CA_DIR])
            assert os.listdir(mount / NS_DIR) == []

            fresh = daemon.create()
            usage = stats(daemon, fresh)
            assert usage["disk_bytes"] is not None and usage["disk_bytes"] < MiB
            code, out, _ = sh(daemon, fresh, FILL.format(path="data", count=24))
            assert code == 0, out  # the whole limit is its own again
            # An upload over what is left: 507, and the partial copy gone (its space with it).
            assert upload(daemon, fresh, "/over", LIMIT) == 507
            assert sh(daemon, fresh, "ls -A")[1].split() == ["data"]
            code, out, _ = sh(
                daemon, fresh, "rm data; sync; " + FILL.format(path="again", count=24)
            )
            assert code == 0, out
        finally:
            stop_daemon(daemon)


@ON_HOST
def test_recovery_removes_a_crashed_predecessors_subvolumes(tmp_path: Path) -> None:
    with loop_filesystem("btrfs", 256) as mount:
        root_on(tmp_path, mount)
        args = [*uid_args(tmp_path, 420_000), f"--disk-max={LIMIT}"]
        first = start_daemon(tmp_path, *args)
        try:
            rid = first.create()
            code, out, _ = sh(first, rid, "btrfs subvolume create n >/dev/null && echo x > n/f")
            assert code == 0, out
        finally:
            first.process.kill()  # SIGKILL: no drain, no cleanup
            first.process.wait(30)
        assert (mount / rid).exists() and qgroups(mount)
        # And a level-1 qgroup whose subvolume is gone (a crash between the two removals).
        subprocess.run(["btrfs", "qgroup", "create", "1/4242", str(mount)], check=True)
        second = start_daemon(tmp_path, *args)
        try:
            log = _wait_for_log(second.log, "recovery done")
            assert "recovery done: 1 leftover" in log
            assert "removed 1 stale quota groups" in log
            assert not (mount / rid).exists()
            assert not (mount / PROBE).exists()
            assert qgroups(mount) == set()
        finally:
            stop_daemon(second)


def _wait_for_log(log: Path, text: str) -> str:
    deadline = time.monotonic() + 30
    while text not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    return log.read_text()


@pytest.mark.parametrize("kind", ["tmpfs", "ext4", "btrfs-full-qgroups"])
def test_start_up_fails_loudly_when_the_limit_cannot_be_enforced(tmp_path: Path, kind: str) -> None:
    if kind == "tmpfs":
        mount = Path(tempfile.mkdtemp(prefix="disk-tmpfs-", dir=SHARED_ROOTS))
        mount.chmod(0o711)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], check=True)
        try:
            _expect_refusal(tmp_path, mount, "tmpfs")
        finally:
            subprocess.run(["umount", str(mount)], check=True)
            mount.rmdir()
        return
    fs = "ext4" if kind == "ext4" else "btrfs"
    plain = ["mkfs.ext4", "-q", "-F"] if fs == "ext4" else None  # no quota feature
    with loop_filesystem(fs, 128 if fs == "ext4" else 256, mount_options=[], mkfs=plain) as mount:
        if kind == "ext4":
            why = "ext4 project quotas are not on"  # this kernel has no ext4 quotas at all
        else:
            subprocess.run(["btrfs", "quota", "enable", str(mount)], check=True)
            why = "full qgroups"
        _expect_refusal(tmp_path, mount, why)


def _expect_refusal(tmp_path: Path, mount: Path, why: str) -> None:
    root_on(tmp_path, mount)
    with pytest.raises(AssertionError, match="daemon exited") as raised:
        start_daemon(tmp_path, *uid_args(tmp_path, 460_000), "--disk-max=16M")
    message = str(raised.value)
    assert "start-up failed at disk" in message, message
    assert why in message, message


@ON_HOST
def test_the_driver_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The branches no daemon takes on its own: a plain directory under a btrfs root (made
    before limits were on), and a qgroup call the kernel refuses at start-up."""
    with loop_filesystem("btrfs", 256) as mount:
        driver = BtrfsQuotas.open(str(mount), DiskLimits(LIMIT, None))
        try:
            plain = mount / "0123456789abcdef"
            (plain / "workspace").mkdir(parents=True)
            (plain / "workspace" / "f").write_text("x")
            assert driver.usage(str(plain)) == DiskUsage(None, None, None, None)
            driver.destroy(str(plain), remove_tree)
            assert not plain.exists()
            driver.destroy(str(plain), remove_tree)  # gone already: fine

            def refused(fd: int, qgroupid: int, max_referenced: int) -> None:
                raise PermissionError(1, "Operation not permitted")

            monkeypatch.setattr(btrfs_ioctl, "limit_qgroup", refused)
            with pytest.raises(DiskUnavailable, match=r"btrfs subvolume with a qgroup on .*permit"):
                BtrfsQuotas.open(str(mount), DiskLimits(LIMIT, None))
            assert not (mount / PROBE).exists() and qgroups(mount) == set()
        finally:
            os.close(driver.root_fd)


SANDBOX = Identity(430_017, 430_017)
"""The owner of the in-process tests' sandbox directories (no daemon hands it out)."""


def _subvolume_id(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return btrfs_ioctl.subvolume_id(fd)
    finally:
        os.close(fd)


@ON_HOST
def test_a_read_only_subvolume_of_the_sandbox_goes_with_it(tmp_path: Path) -> None:
    """The sandbox's own user can make a nested subvolume read-only, which no file removal
    can empty: the kill deletes it whole, then the sandbox's, and its qgroup."""
    with loop_filesystem("btrfs", 256) as mount:
        driver = BtrfsQuotas.open(str(mount), DiskLimits(LIMIT, None))
        try:
            path = mount / "0123456789abcdef"
            driver.make_directory(str(path), SANDBOX)
            os.chown(path, SANDBOX.uid, SANDBOX.gid)
            script = "btrfs subvolume create n/ && mkdir n/d && echo x > n/d/f"
            script += " && btrfs property set n ro true && ! rm n/d/f 2>/dev/null"
            as_sandbox = ["setpriv", f"--reuid={SANDBOX.uid}", f"--regid={SANDBOX.gid}"]
            done = subprocess.run(
                [*as_sandbox, "--clear-groups", "sh", "-c", script],
                cwd=path,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            driver.destroy(str(path), remove_tree)
            assert not path.exists() and qgroups(mount) == set()
        finally:
            os.close(driver.root_fd)


@ON_HOST
def test_the_driver_when_the_kernel_refuses_or_forgot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A qgroup removed behind the driver's back, a deletion or qgroup removal the kernel
    refuses, and quotas turned off under a running driver."""
    with loop_filesystem("btrfs", 256) as mount:
        driver = BtrfsQuotas.open(str(mount), DiskLimits(LIMIT, None))
        try:
            forgotten = mount / "forgotten"
            driver.make_directory(str(forgotten), SANDBOX)
            sid = _subvolume_id(forgotten)
            subprocess.run(["btrfs", "qgroup", "remove", f"0/{sid}", f"1/{sid}", str(mount)])
            subprocess.run(["btrfs", "qgroup", "destroy", f"1/{sid}", str(mount)], check=True)
            assert driver.usage(str(forgotten)) == DiskUsage(None, None, None, None)
            driver.destroy(str(forgotten), remove_tree)
            assert not forgotten.exists()

            refused = mount / "refused"
            driver.make_directory(str(refused), SANDBOX)

            def eperm(*args: object, **kwargs: object) -> None:
                raise PermissionError(1, "Operation not permitted")

            with monkeypatch.context() as patch:
                patch.setattr(btrfs_ioctl, "destroy_subvolume", eperm)
                with pytest.raises(PermissionError):
                    driver.destroy(str(refused), remove_tree)
            assert refused.exists()

            subprocess.run(["btrfs", "qgroup", "create", "1/4242", str(mount)], check=True)
            with monkeypatch.context() as patch:  # a stale qgroup the kernel will not remove
                patch.setattr(btrfs_ioctl, "remove_qgroup", eperm)
                assert driver.sweep(lambda rid: False) == 0  # kept, and logged
                with pytest.raises(PermissionError):
                    driver.destroy(str(refused), remove_tree)  # the subvolume went first
                assert not refused.exists()
            assert "1_4242" in qgroups(mount)
            assert driver.sweep(lambda rid: False) >= 1 and "1_4242" not in qgroups(mount)

            subprocess.run(["btrfs", "quota", "disable", str(mount)], check=True)
            assert driver.sweep(lambda rid: False) == 0  # no qgroups directory any more
        finally:
            os.close(driver.root_fd)


@ON_HOST
def test_start_up_says_btrfs_bounds_files_by_bytes() -> None:
    """btrfs has no inode limit: with ``SANDBOXD_FILES_MAX`` the boot log says what bounds
    the files instead."""
    config = Config.load({"SANDBOXD_DISK_MAX": "32M", "SANDBOXD_FILES_MAX": "1000"})
    with loop_filesystem("btrfs", 256) as mount, capturedLogs() as events:
        disk = boot.start_disk(config, Layout(str(mount), owns_files=False))
        assert isinstance(disk, BtrfsQuotas)
        os.close(disk.root_fd)
    said = [formatEvent(event) for event in events]
    assert any("33554432 bytes, 1000 files per sandbox" in line for line in said), said
    assert any("btrfs has no inode limit" in line for line in said), said


def test_btrfs_without_simple_quotas_is_refused(tmp_path: Path) -> None:
    """A kernel before 6.7 (the VM's 6.1) has no simple quotas: start-up says so."""
    major, minor = (int(n) for n in os.uname().release.split(".")[:2])
    if (major, minor) >= (6, 7):
        pytest.skip("this kernel has simple quotas")
    with loop_filesystem("btrfs", 256) as mount:
        _expect_refusal(tmp_path, mount, "they need Linux 6.7 or later")
