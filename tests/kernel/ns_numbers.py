"""The kernel's numbers of mount namespaces, and which CPU hands out the higher ones now.

From Linux 6.18 namespaces are numbered in per-CPU batches, and the kernel pins (bind-mounts) a
mount namespace only for a pinner whose own mount namespace is numbered lower: a daemon whose own
mount namespace came from the CPU with the higher batch cannot pin one made on the other CPU,
unless it makes it anew where numbers are high enough (``sandboxd_exec_ns.h``).
"""

import fcntl
import os
import struct
import subprocess
import time

NS_GET_MNTNS_ID = 0x8008B705
"""``_IOR(0xb7, 0x5, __u64)`` (linux/nsfs.h)."""


def mount_namespace_number(path: str) -> int | None:
    """The kernel's number of the mount namespace at ``path`` (``/proc/PID/ns/mnt``);
    ``None`` where the kernel gives user space none."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        answer = fcntl.ioctl(fd, NS_GET_MNTNS_ID, bytes(8))
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(struct.unpack("Q", answer)[0])


def number_made_on(cpu: int) -> int | None:
    """The number of a new mount namespace made now on ``cpu`` (``unshare(1)`` under
    ``taskset``); ``None`` where the kernel gives user space none."""
    own = os.stat("/proc/self/ns/mnt").st_ino
    holder = subprocess.Popen(
        ["taskset", "-c", str(cpu), "unshare", "--mount", "--propagation", "unchanged", "cat"],
        stdin=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        path = f"/proc/{holder.pid}/ns/mnt"
        while os.stat(path).st_ino == own:  # it differs once unshare(2) has made it
            assert time.monotonic() < deadline, "unshare did not start"
            time.sleep(0.001)
        return mount_namespace_number(path)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)


def cpus_by_number() -> list[int] | None:
    """This process's CPUs, the one handing out the highest mount namespace numbers first;
    ``None`` where the kernel numbers them for nobody to see (one global sequence)."""
    numbers = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        number = number_made_on(cpu)
        if number is None:
            return None
        numbers[cpu] = number
    return sorted(numbers, key=lambda cpu: -numbers[cpu])
