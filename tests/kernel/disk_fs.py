"""Loop-mounted filesystems the disk-limit tests make and always take down again.

Each is an image file of modest size, attached to a loop device of its own, mounted beneath
``/tmp/sandboxd-tests`` (sandbox uids must pass through every directory above a state root),
and unmounted, detached and deleted when the ``with`` block ends, whatever happened in it.
"""

import base64
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support.daemon import SHARED_ROOTS, Daemon

MKFS = {
    "btrfs": ["mkfs.btrfs", "-q", "-f"],
    # -m 0: no blocks reserved for root, or the daemon's own writes (uploads, as root) would
    # find room in them after a sandbox filled the rest.
    "ext4": ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "quota,project"],
    "xfs": ["mkfs.xfs", "-q", "-f"],
}
MOUNT_OPTIONS = {"btrfs": [], "ext4": ["-o", "prjquota"], "xfs": ["-o", "pquota"]}


def _run(argv: Sequence[str]) -> None:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@contextmanager
def loop_filesystem(
    kind: str,
    size_mib: int = 256,
    mount_options: Sequence[str] | None = None,
    mkfs: Sequence[str] | None = None,
) -> Iterator[Path]:
    """A fresh ``kind`` filesystem of ``size_mib`` MiB mounted at the path yielded (0711);
    ``mkfs`` and ``mount_options`` replace the defaults (quotas made and mounted on)."""
    SHARED_ROOTS.mkdir(mode=0o711, exist_ok=True)
    top = Path(tempfile.mkdtemp(prefix="disk-", dir=SHARED_ROOTS))
    top.chmod(0o711)
    image, mount = top / "image", top / "mnt"
    mount.mkdir()
    device = None
    mounted = False
    try:
        with open(image, "wb") as f:
            f.truncate(size_mib << 20)
        _run([*(MKFS[kind] if mkfs is None else mkfs), str(image)])
        if not os.path.exists("/dev/loop-control"):  # the VM's kernel has loop as a module
            subprocess.run(["modprobe", "loop"], capture_output=True)
        attach = ["losetup", "--find", "--show", str(image)]
        device = subprocess.run(attach, check=True, capture_output=True).stdout.decode().strip()
        options = MOUNT_OPTIONS[kind] if mount_options is None else list(mount_options)
        _run(["mount", "-t", kind, *options, device, str(mount)])  # device: once attached
        mounted = True
        mount.chmod(0o711)
        yield mount
    finally:
        if mounted and subprocess.run(["umount", str(mount)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        if device is not None:
            subprocess.run(["losetup", "-d", device], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


def root_on(tmp_path: Path, mount: Path) -> Path:
    """Make ``tmp_path/root`` (where ``start_daemon`` puts the state root) lead to ``mount``."""
    root = tmp_path / "root"
    root.symlink_to(mount)
    return root


def sh(daemon: Daemon, rid: str, script: str) -> tuple[int, str, str]:
    """Run ``sh -c script`` in the sandbox: exit code, stdout, stderr."""
    status, body = daemon.call("POST", f"/sandboxes/{rid}/exec", {"cmd": ["sh", "-c", script]})
    assert status == 200, body
    final = json.loads(body.splitlines()[-1])
    assert "exit" in final, final
    out = base64.b64decode(str(final["out"])).decode(errors="replace")
    err = base64.b64decode(str(final["err"])).decode(errors="replace")
    return int(final["exit"]), out, err


def upload(daemon: Daemon, rid: str, path: str, size: int) -> int:
    """``PUT`` ``size`` bytes to ``path`` in the sandbox (spooled: over 100 kB); the status."""
    return daemon.call("PUT", f"/sandboxes/{rid}/file?path={path}", raw=b"u" * size)[0]


def stats(daemon: Daemon, rid: str) -> dict[str, int | None]:
    body: dict[str, int | None] = daemon.json("GET", f"/sandboxes/{rid}/stats")
    return body
