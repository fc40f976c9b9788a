"""Control-file helpers, and the kill sweep that never signals a recycled pid."""

import errno
import signal
import subprocess
from pathlib import Path

import pytest
from attrs import evolve

from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.cgroups.cgfiles import (
    Kernel,
    make_dirs,
    read_int,
    read_keyed,
    read_keyed_or_empty,
    read_pids,
    remove_dir,
    require_root,
    sweep,
    write_text,
)
from tests.support.kernel_fakes import FakeKernel, write


def test_readers(tmp_path: Path) -> None:
    write(tmp_path / "n", " 42\n")
    write(tmp_path / "k", "usage_usec 10\nbad line\nname word\noom_kill 2\n")
    write(tmp_path / "p", "1\n2\n")
    assert read_int(str(tmp_path / "n")) == 42
    assert read_keyed(str(tmp_path / "k")) == {"usage_usec": 10, "oom_kill": 2}
    assert read_keyed_or_empty(str(tmp_path / "missing")) == {}
    assert read_pids([str(tmp_path / "p"), str(tmp_path / "missing"), str(tmp_path / "n")]) == {
        1,
        2,
        42,
    }


def test_write_text_writes_an_existing_file_only(tmp_path: Path) -> None:
    write(tmp_path / "f", "old")
    write_text(str(tmp_path / "f"), "new")
    assert (tmp_path / "f").read_text() == "new"
    with pytest.raises(FileNotFoundError):
        write_text(str(tmp_path / "absent"), "x")


def test_real_kernel_defaults_are_the_os_calls() -> None:
    kernel = Kernel()
    assert kernel.write is write_text
    assert kernel.getpid() > 0


def test_require_root() -> None:
    require_root(Kernel(geteuid=lambda: 0), "cgroup2")
    with pytest.raises(
        IsolationUnavailable, match=r"cgroup2 isolation needs root \(running as uid 1000\)"
    ):
        require_root(Kernel(geteuid=lambda: 1000), "cgroup2")


def test_make_dirs_and_remove_dir_tolerate_what_is_already_so(tmp_path: Path) -> None:
    kernel = Kernel()
    make_dirs(kernel, str(tmp_path / "d"))
    make_dirs(kernel, str(tmp_path / "d"))
    remove_dir(kernel, str(tmp_path / "d"))
    remove_dir(kernel, str(tmp_path / "d"))
    assert not (tmp_path / "d").exists()


def fake_v2(tmp_path: Path) -> tuple[FakeKernel, Path]:
    fake = FakeKernel(tmp_path, 2)
    fake.make_root()
    fake.make_cgroup(tmp_path / "box")
    return fake, tmp_path / "box"


def test_sweep_kills_every_listed_process_through_pidfds(tmp_path: Path) -> None:
    fake, box = fake_v2(tmp_path)
    pids = [fake.spawn(box) for _ in range(3)]
    assert sweep([str(box / "cgroup.procs")], fake.kernel()) == 3
    assert sorted(fake.signalled) == pids
    assert fake.open_fds == set()


def test_sweep_skips_a_pid_that_left_between_the_two_reads(tmp_path: Path) -> None:
    fake, box = fake_v2(tmp_path)
    gone = fake.spawn(box)
    stays = fake.spawn(box)
    kernel = fake.kernel()
    opened: list[int] = []

    def pidfd_open(pid: int) -> int:
        fd = fake.pidfd_open(pid)
        opened.append(pid)
        if pid == gone:  # exits (and its pid may be reused) after being pinned
            fake._die(gone)
        return fd

    swept = sweep([str(box / "cgroup.procs")], evolve(kernel, pidfd_open=pidfd_open))
    assert swept == 1
    assert fake.signalled == [stays]
    assert sorted(opened) == [gone, stays]
    assert fake.open_fds == set()


def test_sweep_ignores_processes_that_die_before_being_pinned_or_signalled(tmp_path: Path) -> None:
    fake, box = fake_v2(tmp_path)
    pid = fake.spawn(box)
    kernel = fake.kernel()

    def vanished(_: int) -> int:
        raise ProcessLookupError(errno.ESRCH, "gone")

    def dies_first(_: int) -> None:
        raise ProcessLookupError(errno.ESRCH, "gone")

    procs = [str(box / "cgroup.procs")]
    assert sweep(procs, evolve(kernel, pidfd_open=vanished)) == 0
    assert sweep(procs, evolve(kernel, pidfd_sigkill=dies_first)) == 0
    assert fake.alive(pid)
    assert fake.open_fds == set()


def test_sweep_falls_back_to_kill_without_pidfds(tmp_path: Path) -> None:
    fake, box = fake_v2(tmp_path)
    fake.pidfd = False
    pid = fake.spawn(box)
    assert sweep([str(box / "cgroup.procs")], fake.kernel()) == 1
    assert fake.signalled == [pid]
    kills: list[tuple[int, int]] = []

    def recording_kill(p: int, s: int) -> None:
        kills.append((p, s))

    sweep([str(box / "cgroup.procs")], evolve(fake.kernel(), kill=recording_kill))
    assert kills == [(pid, signal.SIGKILL)]


def test_sweep_raises_other_pidfd_errors_and_closes_what_it_opened(tmp_path: Path) -> None:
    fake, box = fake_v2(tmp_path)
    fake.spawn(box)
    fake.spawn(box)
    calls: list[int] = []

    def flaky(pid: int) -> int:
        calls.append(pid)
        if len(calls) == 2:
            raise OSError(errno.EMFILE, "Too many open files")
        return fake.pidfd_open(pid)

    with pytest.raises(OSError, match="Too many"):
        sweep([str(box / "cgroup.procs")], evolve(fake.kernel(), pidfd_open=flaky))
    assert fake.open_fds == set()
    assert fake.signalled == []


def test_real_pidfd_sigkill_kills_the_pinned_process() -> None:
    child = subprocess.Popen(["sleep", "30"])
    kernel = Kernel()
    fd = kernel.pidfd_open(child.pid)
    try:
        kernel.pidfd_sigkill(fd)
    finally:
        kernel.close(fd)
    assert child.wait(timeout=10) == -signal.SIGKILL
