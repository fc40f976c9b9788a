"""Real-kernel suite: the default seccomp filter refuses the kernel's attack surface, for real.

Issue 14 ("kernel attack surface"). Two real daemons as root, the same but for the filter:
``filtered`` (the default) and ``unfiltered`` (``--seccomp=off``). Each attack of
``seccomp_attacks.py`` runs inside a sandbox of both: the filtered one must answer what the filter
answers (``EPERM``; ``ENOSYS`` for clone3; ``EAFNOSUPPORT`` for the refused socket families), and
the unfiltered one something else (mostly success: the attack works without the layer), which
proves the filter is what refused. Attacks that need a capability a user namespace gives (the
mount API, ``AF_PACKET``) run in the unfiltered sandbox inside ``unshare -Urmn``, as an attacker
would (the filtered one cannot make that namespace at all). The filter program as a whole, with
the calls that cannot be tried here (kexec, modules, reboot...), is checked in
``tests/isolation/test_isolation_seccomp_filter.py``.

And what must keep working under the filter: ``strace``, ``gdb``, ``pip`` into a venv,
``git``, the C compiler.
"""

import io
import json
import os
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel.kernel_http import SLOW, Box, KernelDaemon, isolation_problem

WHY_NOT = isolation_problem()
pytestmark = [pytest.mark.kernel, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

ATTACKS = Path(__file__).with_name("seccomp_attacks.py")

IN_USER_NAMESPACE = ("unshare", "-Urmn")
"""How the unfiltered sandbox gets the capabilities a user namespace gives (root inside it)."""

REFUSED = {
    # attack: (the filter's answer, how the unfiltered sandbox tries it, what that answer must be
    # or None: anything but the filter's, which depends on the kernel's own settings)
    "new_user_namespace": ("EPERM", (), "ok"),
    "clone_user_namespace": ("EPERM", (), "ok"),
    "clone3": ("ENOSYS", (), "EINVAL"),
    "io_uring": ("EPERM", (), "ok"),
    "userfaultfd": ("EPERM", (), "ok"),
    "bpf": ("EPERM", (), "EINVAL"),
    "perf_event_open": ("EPERM", (), None),  # ok at perf_event_paranoid <= 2, EACCES at 3
    "add_key": ("EPERM", (), "ok"),
    "request_key": ("EPERM", (), "ENOKEY"),
    "keyctl": ("EPERM", (), "ok"),
    "mount": ("EPERM", (), "ENOENT"),
    "umount2": ("EPERM", (), "ENOENT"),
    "fsopen": ("EPERM", IN_USER_NAMESPACE, "ok"),
    "setns": ("EPERM", (), "EBADF"),
    "personality": ("EPERM", (), "ok"),
    "settimeofday": ("EPERM", (), "EINVAL"),
    "clock_settime": ("EPERM", (), "EINVAL"),
    "iopl": ("EPERM", (), None),  # EINVAL, or ENOSYS without CONFIG_X86_IOPL_IOPERM
    "ioperm": ("EPERM", (), None),
    "packet_socket": ("EAFNOSUPPORT", IN_USER_NAMESPACE, "ok"),
}

ALLOWED = ("netlink_socket", "tcp_socket")


def _start(tmp_path: Path, *args: str) -> Iterator[Box]:
    limits = ("--memory-max=512M", "--pids-max=256", "--exec-timeout=40m", "--log-timeout=40m")
    for box in KernelDaemon.one_sandbox(tmp_path, *limits, *args):
        assert box.upload("attacks.py", ATTACKS.read_bytes()).status == 204
        yield box


@pytest.fixture(scope="module")
def filtered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    yield from _start(tmp_path_factory.mktemp("filtered"))


@pytest.fixture(scope="module")
def unfiltered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    yield from _start(tmp_path_factory.mktemp("unfiltered"), "--seccomp=off")


def attempt(box: Box, names: list[str], prefix: tuple[str, ...] = ()) -> dict[str, str]:
    result = box.exec([*prefix, "python3", "attacks.py", *names], timeout=60 * SLOW)
    assert result.exit == 0, result
    return dict(json.loads(result.out))


def capabilities(box: Box) -> list[str]:
    return list(box.kd.call("GET", "/healthz").json()["capabilities"])


def test_healthz_lists_the_layer_only_when_on(filtered: Box, unfiltered: Box) -> None:
    assert "isolation.seccomp" in capabilities(filtered)
    assert "isolation.seccomp" not in capabilities(unfiltered)


def test_each_attack_is_refused_by_the_filter_and_only_by_it(
    filtered: Box, unfiltered: Box
) -> None:
    names = sorted(REFUSED)
    on = attempt(filtered, [*names, *ALLOWED, "vsock_socket"])
    assert on == {
        **{name: REFUSED[name][0] for name in names},
        **dict.fromkeys(ALLOWED, "ok"),
        "vsock_socket": "EAFNOSUPPORT",
    }
    off: dict[str, str] = {}
    for prefix in {how for _, how, _ in REFUSED.values()}:
        off.update(attempt(unfiltered, [n for n in names if REFUSED[n][1] == prefix], prefix))
    off.update(attempt(unfiltered, list(ALLOWED)))
    for name, (refused, _, expected) in REFUSED.items():
        assert off[name] != refused, (name, off[name])
        if expected is not None:
            assert off[name] == expected, (name, off[name])
    assert all(off[name] == "ok" for name in ALLOWED)


def test_no_user_namespace_for_the_unshare_command(filtered: Box, unfiltered: Box) -> None:
    refused = filtered.exec(["unshare", "-U", "-r", "id", "-u"])
    assert refused.exit != 0 and b"Operation not permitted" in refused.err, refused
    assert unfiltered.exec(["unshare", "-U", "-r", "id", "-u"]).text == "0"


def test_a_foreign_abi_is_killed(filtered: Box, unfiltered: Box) -> None:
    # getpid through int 0x80, the i386 entry (number 20 there), from a 64-bit process
    script = (
        "import ctypes, mmap, os, sys\n"
        "code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])  # mov eax, 20; int 0x80; ret\n"
        "page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "page.write(code)\n"
        "address = ctypes.addressof(ctypes.c_char.from_buffer(page))\n"
        "print(ctypes.CFUNCTYPE(ctypes.c_int)(address)() == os.getpid())\n"
    )
    killed = filtered.exec(["python3", "-c", script])
    assert killed.exit == 128 + 31, killed  # SIGSYS
    survived = unfiltered.exec(["python3", "-c", script])
    assert survived.exit == 0 and survived.text in ("True", "False"), survived


# --- what must keep working -----------------------------------------------------------------


def test_strace_traces_its_own_child(filtered: Box) -> None:
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (tests/run installs it as root)")
    traced = filtered.exec(["strace", "-f", "-e", "trace=execve,exit_group", "true"])
    assert traced.exit == 0, traced
    assert b"execve(" in traced.err and b"+++ exited with 0 +++" in traced.err


def test_gdb_runs_a_program_to_its_end(filtered: Box) -> None:
    if shutil.which("gdb") is None:
        pytest.skip("gdb is not installed (tests/run installs it as root)")
    debugged = filtered.exec(
        ["gdb", "-nx", "-batch", "-ex", "run", "-ex", "info inferiors", "--args", "/bin/true"],
        timeout=120 * SLOW,
    )
    assert debugged.exit == 0, debugged
    assert b"exited normally" in debugged.out, debugged
    assert b"Error disabling address space randomization" not in debugged.err, debugged


def test_git_init_and_commit(filtered: Box) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed (tests/run installs it as root)")
    out = filtered.ok(
        "git init -q repo && cd repo && echo hello > f && git add f"
        " && git -c user.name=t -c user.email=t@example.invalid commit -q -m first"
        " && git log --format=%s"
    )
    assert out == "first"


def test_the_c_compiler(filtered: Box) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    source = b'#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n'
    assert filtered.upload("hello.c", source).status == 204
    assert filtered.ok("cc -O2 -o hello hello.c && ./hello", timeout=120 * SLOW) == "hello"


def tiny_wheel() -> bytes:
    """A pure-Python wheel of one module (no network, no build backend needed)."""
    files = {
        "sbxdemo/__init__.py": "ANSWER = 42\n",
        "sbxdemo-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: sbxdemo\nVersion: 0.1\n",
        "sbxdemo-0.1.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: sandboxd-tests\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in files) + "sbxdemo-0.1.dist-info/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for name, text in {**files, "sbxdemo-0.1.dist-info/RECORD": record}.items():
            wheel.writestr(name, text)
    return buffer.getvalue()


@pytest.mark.skipif(
    os.environ.get("SANDBOXD_VM") == "1",
    reason="minutes under the VM's software emulation: the host's run proves it",
)
def test_pip_installs_a_local_wheel_into_a_venv(filtered: Box) -> None:
    assert filtered.upload("sbxdemo-0.1-py3-none-any.whl", tiny_wheel()).status == 204
    out = filtered.ok(
        "python3 -m venv venv && venv/bin/pip --version >/dev/null"
        " && venv/bin/pip install -q --no-index --no-cache-dir ./sbxdemo-0.1-py3-none-any.whl"
        " && venv/bin/python -c 'import sbxdemo; print(sbxdemo.ANSWER)'",
        timeout=300 * SLOW,
    )
    assert out.splitlines()[-1] == "42"
