"""Finding hierarchies and our place in them; naming instances and sandboxes; limit values."""

import pytest
from werkzeug.routing import Map

from sandboxd.core.layout import RID_PATTERN
from sandboxd.http.parse import RidConverter
from sandboxd.isolation.base import Limits
from sandboxd.isolation.cgroups.hierarchy import (
    UNIFIED,
    Mount,
    directory,
    override_path,
    parse_mountinfo,
    parse_proc_cgroup,
    v1_mount,
    v2_mount,
)
from sandboxd.isolation.cgroups.limits import (
    cpu_quota_us,
    v1_cpu_quota,
    v1_memory,
    v1_pids,
    v2_values,
)
from sandboxd.isolation.naming import check_rid, instance_name, is_rid

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
39 31 0:36 /docker/abc /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
42 31 0:39 / /mnt/with\\040space rw - cgroup2 cgroup2 rw
bad line
7 8 0:1 / /short - cgroup
"""

PROC = """\
9:name=systemd:/
4:cpu,cpuacct:/a
3:memory:/process_api/x
0::/user.slice/u:1
garbage
"""


def test_parse_mountinfo_keeps_cgroup_mounts_with_their_options() -> None:
    mounts = parse_mountinfo(HYBRID)
    assert [m.mountpoint for m in mounts] == [
        "/sys/fs/cgroup/cpu,cpuacct",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/unified",
        "/mnt/with space",
    ]
    assert mounts[0].options == frozenset({"rw", "cpu", "cpuacct"})
    assert mounts[2].root == "/docker/abc"
    assert v1_mount(mounts, "cpuacct") == mounts[0]
    assert v1_mount(mounts, "freezer") is None
    assert v2_mount(mounts) == mounts[3]
    assert v2_mount(mounts[:3]) is None


def test_parse_proc_cgroup_maps_every_controller() -> None:
    own = parse_proc_cgroup(PROC)
    assert own == {
        "name=systemd": "/",
        "cpu": "/a",
        "cpuacct": "/a",
        "memory": "/process_api/x",
        UNIFIED: "/user.slice/u:1",
    }


def test_directory_joins_the_path_below_the_mount_root() -> None:
    plain = Mount("/", "/sys/fs/cgroup/memory", "cgroup", frozenset())
    bound = Mount("/docker/abc", "/sys/fs/cgroup/pids", "cgroup", frozenset())
    assert directory(plain, "/") == "/sys/fs/cgroup/memory"
    assert directory(plain, "/a/b") == "/sys/fs/cgroup/memory/a/b"
    assert directory(bound, "/docker/abc") == "/sys/fs/cgroup/pids"
    assert directory(bound, "/docker/abc/x") == "/sys/fs/cgroup/pids/x"
    assert directory(bound, "/docker/abcd") is None
    assert directory(bound, "/") is None


def test_override_path_accepts_cgroup_paths_and_directories() -> None:
    mounts = parse_mountinfo(HYBRID)
    assert override_path(mounts, "/sandboxd/") == "/sandboxd"
    assert override_path(mounts, "/sys/fs/cgroup/memory/sandboxd") == "/sandboxd"
    assert override_path(mounts, "/sys/fs/cgroup/memory") == "/"
    assert override_path(mounts, "/sys/fs/cgroup/pids/x") == "/docker/abc/x"
    assert override_path(mounts, "/sys/fs/cgroup/pids") == "/docker/abc"


def test_rids_are_sixteen_lowercase_hex_digits() -> None:
    assert check_rid("0123456789abcdef") == "0123456789abcdef"
    assert is_rid("0123456789abcdef")
    for bad in ["0123456789ABCDEF", "0123456789abcde", "../../../etc/xx", "0123456789abcdef\n"]:
        assert not is_rid(bad)
        with pytest.raises(ValueError):
            check_rid(bad)
    with pytest.raises(ValueError):
        check_rid(None)  # type: ignore[arg-type]
    # One pattern everywhere: the URL's converter and the state root's listing take the same.
    assert RidConverter(Map()).to_python("0123456789abcdef\n") == ""
    assert RID_PATTERN.match("0123456789abcdef0") is None


def test_instance_name_depends_only_on_the_normalised_root() -> None:
    one = instance_name("/var/lib/sandboxd/sandboxes")
    assert one.startswith("sandboxd-") and len(one) == len("sandboxd-") + 12
    assert instance_name("/var/lib/sandboxd//sandboxes/") == one
    assert instance_name("/var/lib/other") != one


def test_limit_values() -> None:
    assert cpu_quota_us(None) is None
    assert cpu_quota_us(1.5) == 150_000
    assert cpu_quota_us(0.001) == 1_000
    full = Limits(memory_bytes=512 << 20, cpu_cores=0.2, pids=20)
    assert v2_values(full) == {
        "memory.max": str(512 << 20),
        "memory.swap.max": "0",
        "cpu.max": "20000 100000",
        "pids.max": "20",
    }
    none = Limits(None, None, None)
    assert v2_values(none)["memory.max"] == "max"
    assert v2_values(none)["cpu.max"] == "max 100000"
    assert v2_values(none)["pids.max"] == "max"
    assert (v1_memory(full), v1_cpu_quota(full), v1_pids(full)) == (str(512 << 20), "20000", "20")
    assert (v1_memory(none), v1_cpu_quota(none), v1_pids(none)) == ("-1", "-1", "max")
