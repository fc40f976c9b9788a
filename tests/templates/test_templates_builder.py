"""The builder's own logic on real files, in the test's process (docs/extensions.rst, "Building
a template"): the steps that run no command (FROM a template, FROM a cached Debian suite, COPY,
ENV, WORKDIR's record), a build cancelled between steps, a fault, and what a build refuses
before it starts. ``RUN`` itself is tested against a real daemon (``test_templates_build``)."""

import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.task import deferLater
from twisted.logger import capturedLogs
from twisted.python.failure import Failure

from sandboxd.core.templates import build_files
from sandboxd.core.templates.build_events import (
    BuildEvent,
    BuildFailed,
    Built,
    StepOutput,
    StepStarted,
)
from sandboxd.core.templates.build_limits import BuildLimits
from sandboxd.core.templates.builder import (
    LINE_MAX,
    SHUTDOWN_WAIT,
    Build,
    _RunProtocol,
    start_build,
)
from sandboxd.core.templates.dockerfile import parse_dockerfile
from sandboxd.core.templates.store import TemplateStore
from sandboxd.errors import BadRequest, TemplateCannotRun, TemplateConflict, TemplateNotFound
from tests.support.fakes import SyncPool
from tests.templates.archives import directory, file, tar
from tests.templates.rootfs import rootfs
from tests.templates.test_templates_store import put, result, store_at


def context(*members: tarfile.TarInfo | tuple[str, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                archive.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                archive.addfile(info, io.BytesIO(member[1]))
    out.seek(0)
    return out


def hard_link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.LNKTYPE, target
    return info


def run(
    store: TemplateStore,
    text: str,
    ctx: io.BytesIO | None = None,
    emit: Any = None,
    name: str = "new",
) -> tuple[Any, list[BuildEvent]]:
    frames: list[BuildEvent] = []
    store.reserve(name)
    build = Build(store, name, parse_dockerfile(text), ctx, "none", emit or frames.append)
    return result(Deferred.fromCoroutine(build.run())), frames


def names(root: Path) -> list[str]:
    return sorted(os.listdir(root / ".templates"))


@pytest.fixture
def store(tmp_path: Path) -> TemplateStore:
    templates = store_at(tmp_path)
    put(templates, "base", tar([directory("etc"), file("etc/base", b"from base")]))
    return templates


def test_a_build_from_a_template_copies_it_and_keeps_the_steps(
    store: TemplateStore, tmp_path: Path
) -> None:
    text = "FROM base\nENV A=1 B=2\nCOPY d/ two.txt /srv/\nCOPY one.txt /etc/renamed\n"
    files = context(
        ("d/one.txt", b"1"),
        hard_link("d/again", "d/one.txt"),
        ("two.txt", b"22"),
        ("one.txt", b"x"),
    )
    template, frames = run(store, text, files)
    assert frames == [
        StepStarted(1, 4, 1, "FROM base"),
        StepStarted(2, 4, 2, "ENV A=1 B=2"),
        StepStarted(3, 4, 3, "COPY d/ two.txt /srv/"),
        StepStarted(4, 4, 4, "COPY one.txt /etc/renamed"),
        Built(template),
    ]
    assert (template.env, template.workdir, template.size) == ({"A": "1", "B": "2"}, "/", 13)
    rootfs = tmp_path / ".templates" / "new" / "rootfs"
    assert (rootfs / "etc" / "base").read_bytes() == b"from base"
    assert (rootfs / "srv" / "one.txt").read_bytes() == b"1"
    assert (rootfs / "srv" / "again").stat().st_ino == (rootfs / "srv" / "one.txt").stat().st_ino
    assert (rootfs / "srv" / "two.txt").read_bytes() == b"22"
    assert (rootfs / "etc" / "renamed").read_bytes() == b"x"
    assert names(tmp_path) == ["base", "new"]
    assert store.get("new") == template
    with pytest.raises(TemplateConflict):
        store.reserve("new")


@pytest.mark.parametrize(
    ("text", "ctx", "error"),
    [
        ("FROM base\nCOPY a /b\n", None, "COPY needs a context: send the build as a tar"),
        ("FROM base\nCOPY nope /b\n", context(), "COPY nope: no such file in the context"),
        (
            "FROM base\nCOPY d /b\n",
            context(("x", b"x"), hard_link("d/h", "x")),
            "member 'b/h': a hard link to a file outside this layer",
        ),
        ("FROM base\nCOPY x /etc/base/under\n", context(("x", b"x")), "member 'etc/base/under'"),
    ],
)
def test_a_failed_copy_names_its_step_and_leaves_nothing(
    store: TemplateStore, tmp_path: Path, text: str, ctx: io.BytesIO | None, error: str
) -> None:
    template, frames = run(store, text, ctx)
    assert template is None
    end = frames[-1]
    assert isinstance(end, BuildFailed)
    assert (end.step, end.line, end.instruction, end.output) == (2, 2, text.split("\n")[1], ())
    assert end.error.startswith(error) and end.exit_code is None
    assert names(tmp_path) == ["base"]
    store.reserve("new")  # the name is free again


def test_a_build_cancelled_between_steps_stops_and_leaves_nothing(
    store: TemplateStore, tmp_path: Path
) -> None:
    frames: list[BuildEvent] = []
    store.reserve("new")
    build = Build(
        store, "new", parse_dockerfile("FROM base\nENV A=1\n"), None, "none", frames.append
    )

    def emit(frame: BuildEvent) -> None:
        frames.append(frame)
        build.cancel()  # the client goes while the first step runs

    build.emit = emit
    assert result(Deferred.fromCoroutine(build.run())) is None
    assert frames[-1] == BuildFailed(2, 2, "ENV A=1", "the build was cancelled", ())
    assert names(tmp_path) == ["base"]


def test_a_fault_of_the_daemons_ends_the_build_as_a_failed_step_and_is_logged(
    store: TemplateStore, tmp_path: Path
) -> None:
    frames: list[BuildEvent] = []

    def emit(frame: BuildEvent) -> None:
        if isinstance(frame, StepStarted):
            raise RuntimeError("a bug")
        frames.append(frame)

    with capturedLogs() as logged:
        template, _ = run(store, "FROM base\n", emit=emit)
    assert template is None
    assert frames == [BuildFailed(1, 1, "FROM base", "RuntimeError: a bug", ())]
    assert any(e.get("name") == "new" and "log_failure" in e for e in logged)
    assert names(tmp_path) == ["base"]


def test_a_build_that_cannot_begin_fails_its_first_step_and_frees_its_name(
    tmp_path: Path,
) -> None:
    (tmp_path / "file").write_bytes(b"")
    store = store_at(tmp_path)
    store.directory = str(tmp_path / "file" / ".templates")  # a state root that is a file
    template, frames = run(store, "FROM base\nENV A=1\n")
    assert template is None
    (end,) = frames
    assert isinstance(end, BuildFailed)
    assert (end.step, end.instruction) == (1, "FROM base")
    assert "Not a directory" in end.error
    store.reserve("new")


def test_from_a_cached_debian_suite_writes_its_tarball(
    store: TemplateStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "debian-testsuite.tar").write_bytes(
        tar([directory("etc"), file("etc/debian_version", b"12\n")])
    )
    monkeypatch.setenv("SANDBOXD_DEBIAN_CACHE", str(cache))
    template, frames = run(store, "FROM debian:testsuite\n")
    assert frames[-1] == Built(template), frames
    assert template.env["PATH"].startswith("/usr/local/sbin:")
    assert (
        tmp_path / ".templates" / "new" / "rootfs" / "etc" / "debian_version"
    ).read_bytes() == b"12\n"
    template, frames = run(store, "FROM debian:Not_A_Suite\n", name="other")
    assert frames[-1] == BuildFailed(
        1, 1, "FROM debian:Not_A_Suite", "debian:Not_A_Suite: not a Debian suite's name", ()
    )


def test_what_a_build_refuses_before_it_starts(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    not_root = store_at(tmp_path / "a")
    with pytest.raises(TemplateCannotRun, match="need a daemon running as root"):
        start_build(not_root, "x", "FROM base\n", None, "none", print)
    (tmp_path / "b").mkdir()
    root = TemplateStore.open(str(tmp_path / "b"), 1 << 20, True, not_root.reactor, not_root.pool)
    with pytest.raises(BadRequest, match="network: must be one of none, host"):
        start_build(root, "x", "FROM base\n", None, "bridge", print)
    with pytest.raises(TemplateNotFound, match="no template named 'base'"):
        start_build(root, "x", "FROM base\n", None, "none", print)
    with pytest.raises(BadRequest, match="Dockerfile line 2: instruction USER"):
        start_build(root, "x", "FROM base\nUSER x\n", None, "none", print)
    build = start_build(root, "x", "FROM debian:bookworm\n", None, "host", print)
    assert (build.name, build.network) == ("x", "host")
    with pytest.raises(TemplateConflict, match="template 'x' exists"):
        start_build(root, "x", "FROM debian:bookworm\n", None, "none", print)


def test_the_dockerfile_is_read_from_the_contexts_top() -> None:
    found = context(("sub/Dockerfile", b"no"), ("Dockerfile", b"FROM base\n"))
    assert build_files.read_dockerfile(found) == "FROM base\n"
    with pytest.raises(BadRequest, match="the build's context has no Dockerfile at its top"):
        build_files.read_dockerfile(context(("sub/Dockerfile", b"no")))
    with pytest.raises(BadRequest, match="the build's body is not a tar of its context"):
        build_files.read_dockerfile(io.BytesIO(b"FROM base\n" * 100))
    with pytest.raises(BadRequest, match="the context's Dockerfile is over 1 MiB"):
        build_files.read_dockerfile(context(("Dockerfile", b"#" * (1 << 20) + b"\n")))


def test_a_digest_covers_the_base_the_steps_and_the_context() -> None:
    plain = build_files.context_digest("FROM a", None, "sha256:1")
    assert plain.startswith("sha256:") and len(plain) == 71
    assert build_files.context_digest("FROM a", context(("x", b"1")), "sha256:1") != plain
    assert build_files.context_digest("FROM a", None, "sha256:2") != plain


def test_a_runs_output_is_split_into_lines_and_a_kill_is_128_and_9() -> None:
    lines: list[str] = []
    protocol = _RunProtocol(lines.append)
    protocol.childDataReceived(1, b"one\ntw")
    protocol.childDataReceived(2, b"err\n")
    protocol.childDataReceived(1, b"o\nunfinished")
    protocol.processEnded(Failure(ProcessDone(0)))
    assert lines == ["one", "err", "two", "unfinished"]
    assert result(protocol.ended) == 0
    killed = _RunProtocol(lines.append)
    killed.processEnded(Failure(ProcessTerminated(None, 9)))
    assert result(killed.ended) == 137


def test_output_without_newlines_is_cut_into_lines_of_at_most_line_max() -> None:
    lines: list[str] = []
    protocol = _RunProtocol(lines.append)
    for _ in range(5):
        protocol.childDataReceived(1, b"x" * (LINE_MAX - 1))
    assert [len(line) for line in lines] == [LINE_MAX] * 4
    assert len(protocol._partial[1]) == LINE_MAX - 5
    protocol.childDataReceived(1, b"end\n")
    protocol.processEnded(Failure(ProcessDone(0)))
    assert [len(line) for line in lines] == [LINE_MAX] * 4 + [LINE_MAX - 2]
    assert "".join(lines) == "x" * (5 * (LINE_MAX - 1)) + "end"


@pytest_twisted.ensureDeferred
async def test_output_paused_is_read_once_resumed_even_after_its_command_ended(
    tmp_path: Path,
) -> None:
    """A command started while its client is behind is not read; it ends meanwhile (its
    output fits its pipe); a cancel reads it again, to its end (else the build never ends)."""
    from twisted.internet import reactor

    store = TemplateStore.open(str(tmp_path), 1 << 20, False, reactor, SyncPool())
    frames: list[BuildEvent] = []
    build = Build(store, "new", [], None, "none", frames.append)
    build.pause_output()
    spawned = Deferred.fromCoroutine(build._spawn(["/bin/sh", "-c", "echo unread"], {}))
    process = build._process
    deadline = reactor.seconds() + 30
    while process.pid is not None:  # not yet reaped
        assert reactor.seconds() < deadline
        await deferLater(reactor, 0.01)
    await deferLater(reactor, 0.1)
    assert frames == []
    build.cancel()
    await spawned
    assert frames == [StepOutput(0, "unread")]
    build.pause_output()  # no command runs: nothing to pause
    build.resume_output()


def test_a_build_timed_out_during_a_step_that_runs_nothing_fails_at_it(
    store: TemplateStore,
) -> None:
    """The time ends while an ``ENV`` is the step: the build fails there, saying why."""
    frames: list[BuildEvent] = []
    store.reserve("late")
    build = Build(
        store, "late", parse_dockerfile("FROM base\nENV A=1"), None, "none", frames.append
    )

    def emit(frame: BuildEvent) -> None:
        frames.append(frame)
        if frame == StepStarted(2, 2, 2, "ENV A=1"):
            build._time_out()

    build.emit = emit
    assert result(Deferred.fromCoroutine(build.run())) is None
    end = frames[-1]
    assert isinstance(end, BuildFailed) and end.step == 2
    assert "time limit (1800 s, SANDBOXD_BUILD_TIMEOUT)" in end.error
    assert names(Path(store.directory).parent) == ["base"]


@pytest.fixture
def real_store(tmp_path: Path) -> TemplateStore:
    """A store whose builds spawn real commands (the reactor's), its ``base`` a busybox root."""
    if os.geteuid() != 0:
        pytest.skip("a RUN maps the host's ids: it needs root")
    from twisted.internet import reactor

    templates = TemplateStore.open(str(tmp_path), 1 << 30, True, reactor, SyncPool())
    return templates


@pytest_twisted.ensureDeferred
async def test_a_run_without_a_cgroup_driver_runs_and_its_time_still_ends_it(
    real_store: TemplateStore,
) -> None:
    """A store made without the daemon's isolation (no cgroup driver): a ``RUN`` runs in the
    daemon's own cgroup; the build's time limit still kills it, at its step."""
    await real_store.put("busybox", io.BytesIO(rootfs()))
    real_store.build_limits = BuildLimits(timeout=2)
    frames: list[BuildEvent] = []
    dockerfile = "FROM busybox\nRUN echo ran; exit 3\n"
    build = start_build(real_store, "exits", dockerfile, None, "none", frames.append)
    assert await build.run() is None
    assert frames[-2:] == [
        StepOutput(2, "ran"),
        BuildFailed(2, 2, "RUN echo ran; exit 3", "the command exited with 3", ("ran",), 3),
    ]
    frames.clear()
    dockerfile = "FROM busybox\nRUN echo waiting; sleep 30.5\n"
    build = start_build(real_store, "slow", dockerfile, None, "none", frames.append)
    assert await build.run() is None
    end = frames[-1]
    assert isinstance(end, BuildFailed) and end.exit_code == 137, end
    assert "SANDBOXD_BUILD_TIMEOUT" in end.error and end.output == ("waiting",)
    assert sorted(real_store.templates) == ["busybox"]


def test_a_build_the_daemons_stop_finds_running_is_cancelled_and_waited_for(
    store: TemplateStore, tmp_path: Path
) -> None:
    """The reactor's ``before shutdown`` trigger cancels the build, and its Deferred fires
    once the build has ended (its directory left: the pool stops with the daemon); a build
    that ended removed its own trigger."""
    frames: list[BuildEvent] = []
    store.reserve("new")
    build = Build(store, "new", parse_dockerfile("FROM base\nENV A=1\n"), None, "none", print)
    clock = store.reactor
    stopped: list[Any] = []

    def emit(frame: BuildEvent) -> None:
        frames.append(frame)
        if frame == StepStarted(1, 2, 1, "FROM base"):
            (trigger,) = clock.shutdown
            stopped.append(trigger())

    build.emit = emit
    assert result(Deferred.fromCoroutine(build.run())) is None
    assert frames[-1] == BuildFailed(2, 2, "ENV A=1", "the build was cancelled", ())
    assert result(stopped[0]) is None  # the reactor may go on stopping
    (left,) = [n for n in names(tmp_path) if n != "base"]  # for the next start to remove
    assert left.startswith(".build-")
    assert clock.shutdown == [build._shut_down]  # fired (a real reactor drops it)
    clock.shutdown.clear()
    template, _ = run(store, "FROM base\n", name="other")
    assert template is not None and clock.shutdown == []


def test_a_stopping_daemon_waits_for_a_build_a_bounded_time(store: TemplateStore) -> None:
    """A build whose end never comes (a step in a pool that stopped): the stop goes on after
    ``SHUTDOWN_WAIT`` seconds."""
    build = Build(store, "new", parse_dockerfile("FROM base\n"), None, "none", print)
    stopping = build._shut_down()  # its run never began: it never ends
    assert not stopping.called and build.cancelled
    store.reactor.advance(SHUTDOWN_WAIT)
    assert result(stopping) is None
