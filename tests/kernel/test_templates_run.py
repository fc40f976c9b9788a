"""Sandboxes made from a template, for real (docs/isolation.rst, "A sandbox from a template"):
a real daemon as root with real isolation (cgroup v1 here, v2 in the VM; nothing here depends
on the cgroup version), a root filesystem tarball made in the test from host binaries (a
static busybox, and a setuid-root copy of ``id`` with its libraries, found by ``ldd``).

Each sandbox sees the template's files as ``/``, its own changes its own (a second sandbox of
the same template does not see them, the template is unchanged), its uid named ``user``, none
of the host's files, and setuid binaries of the template raise no privilege.
"""

import gzip
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel.kernel_http import Box, KernelDaemon, isolation_problem, wait_for
from tests.templates.archives import directory, file, link, oci_archive, tar
from tests.templates.rootfs import OS_RELEASE, rootfs

pytestmark = [pytest.mark.kernel]

HOST_MARKER = Path("/etc/sandboxd-template-test-marker")


@pytest.fixture(scope="module")
def kd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelDaemon]:
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    daemon = KernelDaemon.start(
        tmp_path_factory.mktemp("templates-run"), "--memory-max=128M", "--template-max=64M"
    )
    try:
        assert "templates.run" in daemon.call("GET", "/healthz").json()["capabilities"]
        answer = daemon.client.request("PUT", "/templates/busybox", rootfs())
        assert answer.status == 201, answer
        config = {"config": {"Env": ["MODE=from-image", "KEPT=yes"], "WorkingDir": "/app"}}
        app = tar([directory("app"), file("app/hello", b"hi\n")], "gz")
        image = oci_archive([gzip.compress(rootfs()), app], config)
        answer = daemon.client.request("PUT", "/templates/app", image)
        assert answer.status == 201, answer
        yield daemon
    finally:
        daemon.stop()


def create(kd: KernelDaemon, template: str) -> Box:
    answer = kd.call("POST", "/sandboxes", {"template": template})
    assert answer.status == 200, answer
    box = Box(kd, answer.json()["remote_id"])
    kd.rids.append(box.rid)
    return box


def test_a_sandbox_sees_the_template_as_its_root(kd: KernelDaemon) -> None:
    box = create(kd, "busybox")
    try:
        assert box.ok("whoami") == "user"
        assert box.ok("cat /etc/os-release").encode() + b"\n" == OS_RELEASE
        assert box.ok("cd /home/user && pwd").splitlines()[-1] == "/home/user"
        listing = set(box.ok("ls /").split())
        assert {"bin", "etc", "scratch", "proc", "dev", "tmp", "home", "run"} <= listing
        assert "usr" not in listing  # the host's /usr is out of sight
        assert set(box.ok("ls /dev").split()) == {
            *("null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm"),
            *("fd", "stdin", "stdout", "stderr"),
        } | ({"mqueue"} if os.path.isdir("/dev/mqueue") else set())
        assert "localhost" in box.ok("cat /etc/hosts")
        assert box.ok("ls /proc/self/fd >/dev/null && echo proc") == "proc"
    finally:
        box.kill()


def test_the_hosts_files_are_out_of_sight(kd: KernelDaemon) -> None:
    HOST_MARKER.write_text("host only\n")
    box = create(kd, "busybox")
    try:
        result = box.run(f"cat {HOST_MARKER}")
        assert result.exit != 0 and b"host only" not in result.out
        assert box.run(f"ls {kd.root}/.templates").exit != 0
        assert box.run("ls /root /usr/bin").exit != 0
    finally:
        HOST_MARKER.unlink()
        box.kill()


def test_writes_are_the_sandboxs_own(kd: KernelDaemon) -> None:
    first, second = create(kd, "busybox"), create(kd, "busybox")
    try:
        first.ok("echo mine > /scratch/note && echo home > /home/user/at-home")
        assert first.ok("cat /scratch/note") == "mine"
        assert second.run("cat /scratch/note").exit != 0
        assert not (kd.root / ".templates/busybox/rootfs/scratch/note").exists()
        # The native file API keeps "/" = the workspace, which is /home/user inside.
        assert first.download("at-home").body == b"home\n"
        assert first.upload("put", b"uploaded\n").status in (200, 201, 204)
        assert first.ok("cat /home/user/put") == "uploaded"
        # The sandbox's changes are in its own tree, under its disk limit.
        assert (first.directory / "root/upper/scratch/note").read_bytes() == b"mine\n"
    finally:
        first.kill()
        second.kill()
    assert not first.directory.exists()


def test_a_setuid_binary_of_the_template_raises_no_privilege(kd: KernelDaemon) -> None:
    stored = kd.root / ".templates/busybox/rootfs/bin/id-setuid"
    assert stored.stat().st_uid == 0 and stored.stat().st_mode & 0o4000  # setuid root there
    box = create(kd, "busybox")
    try:
        assert box.ok("/bin/id-setuid -u") == str(box.uid())
        assert box.ok("/bin/id-setuid -u") != "0"
        assert "nosuid" in box.ok("cat /proc/mounts").splitlines()[0]
    finally:
        box.kill()


def test_the_templates_env_and_workdir_apply_and_an_execs_env_wins(kd: KernelDaemon) -> None:
    box = create(kd, "app")
    try:
        assert box.ok("pwd; cat hello") == "/app\nhi"
        assert box.ok("echo $MODE $KEPT") == "from-image yes"
        mine = box.exec(["sh", "-c", "echo $MODE $KEPT"], env={"MODE": "mine"})
        assert mine.text == "mine yes"
    finally:
        box.kill()


def test_a_template_named_with_a_tag_runs(kd: KernelDaemon) -> None:
    # Its files live in ".templates/busybox:1.0/rootfs": the ':' separates the overlay's lower
    # directories unless escaped (before, the create was a 500 naming the path).
    answer = kd.client.request("PUT", "/templates/busybox:1.0", rootfs())
    assert answer.status == 201, answer
    box = create(kd, "busybox:1.0")
    try:
        assert box.ok("whoami; cat /etc/os-release").encode() + b"\n" == b"user\n" + OS_RELEASE
        box.ok("echo changed > /scratch/note")
        assert (box.directory / "root/upper/scratch/note").read_bytes() == b"changed\n"
    finally:
        box.kill()
    assert kd.call("DELETE", "/templates/busybox:1.0").status == 204


def test_a_template_in_use_cannot_be_deleted(kd: KernelDaemon) -> None:
    answer = kd.client.request("PUT", "/templates/doomed", rootfs())
    assert answer.status == 201, answer
    box = create(kd, "doomed")
    answer = kd.call("DELETE", "/templates/doomed")
    assert answer.status == 409, answer
    assert "used by 1 sandboxes" in json.loads(answer.body)["detail"]
    box.kill()
    assert kd.call("DELETE", "/templates/doomed").status == 204


def test_a_fork_copies_the_files_and_diverges_after(kd: KernelDaemon) -> None:
    source = create(kd, "busybox")
    try:
        source.ok("echo root-change > /scratch/note && echo ws > /home/user/file")
        source.ok("mkdir /home/user/deep && echo tmp > /tmp/t && ln -s /etc/hosts /home/user/l")
        source.ok("echo x > /home/user/deep/mine && chmod 4750 /home/user/deep/mine")
        answer = kd.call("POST", source.url("fork"))
        assert answer.status == 200, answer
        fork = Box(kd, answer.json()["remote_id"])
        kd.rids.append(fork.rid)
        try:
            assert fork.rid != source.rid and fork.uid() != source.uid()
            assert fork.ok("whoami; cat /etc/os-release | head -1") == "user\nID=made-in-test"
            assert fork.ok("cat /scratch/note /home/user/file /tmp/t") == "root-change\nws\ntmp"
            # Its own uid owns what the source's owned: it can change it.
            assert fork.ok("stat -c %u /home/user/file /scratch/note") == (
                f"{fork.uid()}\n{fork.uid()}"
            )
            # A link is copied as a link; a set-user-id bit of its own file survives the chown.
            assert fork.ok("readlink /home/user/l; stat -c %a /home/user/deep/mine") == (
                "/etc/hosts\n4750"
            )
            fork.ok("echo forked >> /home/user/file && rm /scratch/note")
            assert source.ok("cat /home/user/file /scratch/note") == "ws\nroot-change"
            source.ok("echo later > /home/user/later")
            assert fork.run("cat /home/user/later").exit != 0
            again = kd.call("POST", fork.url("fork"))  # a fork of a fork
            assert again.status == 200, again
            Box(kd, again.json()["remote_id"]).kill()
        finally:
            fork.kill()
    finally:
        source.kill()
    assert kd.call("POST", f"/sandboxes/{source.rid}/fork").status == 404


def test_a_fork_that_cannot_copy_says_so_and_leaves_nothing(kd: KernelDaemon) -> None:
    source = create(kd, "busybox")
    try:
        shutil.rmtree(source.directory / "home")  # the copy of it fails for real
        before = sorted(os.listdir(kd.root))
        answer = kd.call("POST", source.url("fork"))
        assert answer.status == 503, answer
        assert "fork: cannot copy the source's files" in answer.json()["detail"]
        assert sorted(os.listdir(kd.root)) == before
        assert kd.call("GET", "/sandboxes").json()["sandboxes"] == [
            entry
            for entry in kd.call("GET", "/sandboxes").json()["sandboxes"]
            if entry["remote_id"] == source.rid
        ]
    finally:
        source.kill()


def test_a_plain_sandbox_forks_too(kd: KernelDaemon) -> None:
    answer = kd.call("POST", "/sandboxes", {})
    assert answer.status == 200, answer
    source = Box(kd, answer.json()["remote_id"])
    try:
        source.ok("echo plain > file")
        answer = kd.call("POST", source.url("fork"))
        assert answer.status == 200, answer
        fork = Box(kd, answer.json()["remote_id"])
        assert fork.ok("cat file; ls -n file | cut -d' ' -f3") == f"plain\n{fork.uid()}"
        assert not (fork.directory / "root").exists()
        fork.kill()
    finally:
        source.kill()


def test_a_daemon_killed_with_templated_sandboxes_recovers_clean(tmp_path: Path) -> None:
    first = KernelDaemon.start(tmp_path, "--memory-max=128M")
    try:
        assert first.client.request("PUT", "/templates/busybox", rootfs()).status == 201
        box = create(first, "busybox")
        box.ok("echo left > /scratch/note")
        first.daemon.process.kill()  # SIGKILL: no drain, no cleanup
        first.daemon.process.wait(30)
    except BaseException:
        first.stop()
        raise
    second = KernelDaemon.start(tmp_path, "--memory-max=128M")
    try:
        deadline = time.monotonic() + 30
        while second.call("GET", "/readyz").status != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not box.directory.exists()  # its overlay's directories with it
        assert not (second.root / ".ns" / box.rid).exists()
        again = create(second, "busybox")
        assert again.run("cat /scratch/note").exit != 0
        again.kill()
        assert second.call("DELETE", "/templates/busybox").status == 204
    finally:
        second.stop()


def test_a_fork_copies_one_moment_of_a_busy_sandbox(kd: KernelDaemon) -> None:
    """The source writes ``a`` then ``b`` with the same number, over and over: frozen while
    copied, a fork finds ``b`` equal to ``a`` or one behind it (or one of them truncated by
    the ``echo`` writing it), never further."""
    source = create(kd, "busybox")
    try:
        loop = "i=0; while :; do i=$((i+1)); echo $i > /tmp/a; echo $i > /tmp/b; done"
        answer = kd.call("POST", source.url("processes"), {"cmd": ["sh", "-c", loop]})
        assert answer.status in (200, 201), answer
        time.sleep(0.2)
        for _ in range(5):
            answer = kd.call("POST", source.url("fork"))
            assert answer.status == 200, answer
            fork = Box(kd, answer.json()["remote_id"])
            a, b = fork.ok('echo "$(cat /tmp/a),$(cat /tmp/b)"').split(",")
            fork.kill()
            # One moment: both written, a one ahead, or one of them truncated by its echo.
            if a and b:
                assert 0 <= int(a) - int(b) <= 1, (a, b)
            else:
                assert (a or b).isdigit(), (a, b)
        later = [int(n) for _ in range(5) for n in source.ok("cat /tmp/a /tmp/b").split()]
        assert max(later) > int(a or b)  # the source runs on after
    finally:
        source.kill()


def test_a_templated_sandbox_in_a_pid_namespace(tmp_path: Path) -> None:
    """With ``isolation.pid`` the namespace's init mounts its ``/proc`` in the template's root
    and the relay joins the cgroups through the descriptors opened before ``setns``."""
    # the server's child runs the helper's steps, relay included (a zygote's child has none)
    kd = KernelDaemon.start(
        tmp_path, "--memory-max=128M", "--namespaces=ipc,mount,net,pid", "--spawner=server"
    )
    try:
        assert kd.client.request("PUT", "/templates/busybox", rootfs()).status == 201
        box = create(kd, "busybox")
        seen = box.ok("whoami; cat /proc/1/cmdline")
        assert seen.startswith("user\n") and "sandboxd-exec" in seen  # its init is pid 1
        listed = box.ok("ls /proc").split()
        pids = [name for name in listed if name.isdigit()]
        assert "1" in pids and len(pids) <= 4, pids  # init, the command and its children only
        answer = kd.call("POST", box.url("processes"), {"cmd": ["sleep", "30"]})
        assert answer.status in (200, 201), answer
        # The relay joined the cgroups too, by the descriptors opened before setns.
        assert wait_for(lambda: box.stats()["pids"] == 2, 10), box.stats()
        box.kill()
    finally:
        kd.stop()


def test_links_the_template_holds_where_the_root_is_made_are_never_followed(
    kd: KernelDaemon,
) -> None:
    shadow = Path("/etc/shadow").read_bytes()
    hostile = rootfs(
        extra=[link("etc/hosts", "/etc/shadow"), link("etc/resolv.conf", "../../../etc/shadow")]
    )
    assert kd.client.request("PUT", "/templates/links", hostile).status == 201
    box = create(kd, "links")
    try:
        assert "localhost" in box.ok("cat /etc/hosts")  # its own file, the link replaced
        assert box.run("test -L /etc/resolv.conf").exit != 0
    finally:
        box.kill()
    assert Path("/etc/shadow").read_bytes() == shadow
    assert kd.call("DELETE", "/templates/links").status == 204

    escape = rootfs(extra=[link(".sandboxd-host", "/tmp")])
    assert kd.client.request("PUT", "/templates/escape", escape).status == 201
    before = sorted(os.listdir(kd.root))
    answer = kd.call("POST", "/sandboxes", {"template": "escape"})
    assert answer.status == 500 and b"not a directory" in answer.body, answer
    assert sorted(os.listdir(kd.root)) == before  # nothing of it is left
    assert kd.call("DELETE", "/templates/escape").status == 204


def test_a_templated_sandbox_persists_and_restores_without_rsync_in_it(tmp_path: Path) -> None:
    """The archive's rsync end runs in the view the sandbox had before its root was switched
    (the template holds no rsync): persist, then a new sandbox of the item restores it."""
    kd = KernelDaemon.start(tmp_path, "--memory-max=128M", f"--archive-root={tmp_path / 'archive'}")
    try:
        assert kd.client.request("PUT", "/templates/busybox", rootfs()).status == 201
        answer = kd.call("POST", "/sandboxes", {"template": "busybox", "item_id": "kept"})
        assert answer.status == 200, answer
        first = Box(kd, answer.json()["remote_id"])
        assert first.run("rsync --version").exit == 127  # none in the template
        first.ok("mkdir -p /home/user/d && echo persisted > /home/user/d/f")
        assert kd.call("POST", first.url("mark-ready")).status == 204
        answer = kd.call("POST", first.url("persist"), {"delete": True})
        assert answer.status == 204, answer
        first.kill()
        answer = kd.call("POST", "/sandboxes", {"template": "busybox", "item_id": "kept"})
        assert answer.status == 200, answer
        again = Box(kd, answer.json()["remote_id"])
        assert again.ok("cat /home/user/d/f; whoami") == "persisted\nuser"
        again.kill()
    finally:
        kd.stop()
