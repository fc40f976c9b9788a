"""The parts of contexts that need no kernel (docs/extensions.rst, "Contexts"): the host probe,
the connection file, the E2B result bundle, and the kernel threads' shutdown."""

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import ensureDeferred
from twisted.python.threadpool import ThreadPool

from sandboxd.core.contexts.context import Context
from sandboxd.core.contexts.events import Count, Event, Result
from sandboxd.core.contexts.kernel import (
    SOCKET_PATH_MAX,
    KernelGone,
    KernelLink,
    connection_info,
    write_connection_file,
)
from sandboxd.core.contexts.languages import PYTHON, probe_kernels
from sandboxd.core.contexts.service import ContextCommands
from sandboxd.e2b.wire import result_fields


def test_the_probe_names_what_is_missing() -> None:
    assert probe_kernels("/usr/bin/python3").languages == ("python", "bash")
    for silent in ("/bin/false", "/bin/true"):  # no answer; an answer that is not JSON
        kernels = probe_kernels(silent)
        assert kernels.languages == ()
        assert "has no ipykernel: install ipykernel" in kernels.missing["python"]
        assert "has no ipykernel, bash:" in kernels.missing["bash"]
    kernels = probe_kernels("/nonexistent/python3")
    assert kernels.languages == ()
    assert "cannot run" in kernels.missing["bash"]


def test_a_probe_that_does_not_answer_finds_no_kernel(tmp_path: Path) -> None:
    hanging = tmp_path / "python3"
    hanging.write_text("#!/bin/sh\nexec sleep 60\n")
    hanging.chmod(0o755)
    kernels = probe_kernels(str(hanging), timeout=0.2)
    assert kernels.languages == ()
    assert kernels.missing["python"] == (
        f"{hanging} did not answer within 0.2s: set SANDBOXD_KERNEL_PYTHON"
    )


class HeldPool:
    """A thread pool whose work runs when the test says (:meth:`run`)."""

    def __init__(self) -> None:
        self.work: list[tuple[Any, Any]] = []

    def callInThreadWithCallback(self, on_result: Any, f: Any) -> None:
        self.work.append((on_result, f))

    def run(self) -> None:
        for on_result, f in self.work:
            on_result(True, f())
        self.work.clear()


class AtOnce:
    def callFromThread(self, f: Any, *args: Any) -> None:
        f(*args)


def test_the_kernels_are_probed_once_in_a_thread_every_asker_waiting() -> None:
    owner = ContextCommands()
    owner.config = type("Config", (), {"kernel_python": "/usr/bin/python3"})()
    owner.reactor, owner.admin_pool = AtOnce(), HeldPool()
    first, second = owner.kernels_probed(), ensureDeferred(owner.contexts_missing())
    answers: list[Any] = []
    first.addCallback(answers.append)
    second.addCallback(answers.append)
    assert len(owner.admin_pool.work) == 1 and answers == []  # one probe, running
    owner.admin_pool.run()
    assert answers[0].languages == ("python", "bash") and answers[1] is None
    third = owner.kernels_probed()  # answered at once, never asked again
    assert third.called and owner.admin_pool.work == []


def test_connection_info_and_file(tmp_path: Path) -> None:
    prefix = str(tmp_path / "k")
    info = connection_info(prefix)
    assert info["transport"] == "ipc" and info["ip"] == prefix
    assert sorted(info[name] for name in info if name.endswith("_port")) == [1, 2, 3, 4, 5]
    path = str(tmp_path / "k.json")
    write_connection_file(path, info)
    assert json.loads(Path(path).read_text()) == info
    assert Path(path).stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        write_connection_file(path, info)  # never over a file the sandbox put there
    with pytest.raises(ValueError, match="shorter SANDBOXD_ROOT"):
        connection_info("/" + "r" * SOCKET_PATH_MAX)


def test_env_code_sets_then_restores() -> None:
    env_code = PYTHON.env_code
    before, after = env_code({"A": "1"})
    namespace: dict[str, Any] = {}
    import os

    os.environ.pop("A", None)
    os.environ["B_SANDBOXD_TEST"] = "kept"
    exec(before, namespace)
    assert os.environ["A"] == "1"
    exec(after, namespace)
    assert "A" not in os.environ
    before, after = env_code({"B_SANDBOXD_TEST": "new"})
    exec(before, namespace)
    assert os.environ["B_SANDBOXD_TEST"] == "new"
    exec(after, namespace)
    assert os.environ.pop("B_SANDBOXD_TEST") == "kept"


def test_result_fields_keep_unknown_types_in_extra() -> None:
    bundle = {"text/plain": "1", "image/png": "iVBOR", "application/vnd.custom+json": {"a": 1}}
    assert result_fields(bundle) == {
        "text": "1",
        "png": "iVBOR",
        "extra": {"application/vnd.custom+json": {"a": 1}},
    }
    assert result_fields({"text/plain": "1"}) == {"text": "1"}


class Link:
    """What the shutdown asks of a kernel link: give up its wait, then close."""

    def __init__(self) -> None:
        self.given_up = threading.Event()
        self.closed = False

    def close(self) -> None:
        assert self.given_up.is_set()
        self.closed = True


class Box:
    def __init__(self, contexts: dict[str, Context]) -> None:
        self.contexts = contexts


def test_shutdown_gives_up_every_wait_then_closes_the_links() -> None:
    """A thread waiting on a kernel (an infinite loop in a cell) must not hold the daemon's
    exit: the wait is given up, the pool joined, then every link closed."""
    waiting, idle = Context("a", "python", "/"), Context("b", "python", "/")
    link = Link()
    waiting.link = link  # type: ignore[assignment]
    owner = ContextCommands()
    owner.sandboxes = {"r": Box({"a": waiting, "b": idle})}  # type: ignore[dict-item]
    pool = ThreadPool(1, 1)
    pool.start()
    pool.callInThread(link.given_up.wait)  # a worker held until the wait is given up
    owner._kernel_pool = pool
    owner._stop_kernel_pool()
    assert link.closed and pool.joined


def test_a_link_to_no_kernel_gives_up(tmp_path: Path) -> None:
    link = KernelLink(connection_info(str(tmp_path / "k")), alive=lambda: True)
    try:
        with pytest.raises(KernelGone, match=r"did not answer within 0\.5s"):
            link.wait_ready(0.5)
        link.given_up.set()
        with pytest.raises(KernelGone, match="removed"):
            link.wait_ready(0.5)
    finally:
        link.close()


def test_a_real_kernel_skips_what_another_request_caused(tmp_path: Path) -> None:
    """A real ipykernel (the host's python3): an execution's events are its own, not those of
    a request sent before it (the status of a ``kernel_info``)."""
    info = connection_info(str(tmp_path / "k"))
    conn = str(tmp_path / "k.json")
    write_connection_file(conn, info)
    kernel = subprocess.Popen(
        ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", conn], stdout=subprocess.DEVNULL
    )
    link = KernelLink(info, alive=lambda: kernel.poll() is None)
    try:
        link.wait_ready(30)
        link.client.kernel_info()
        events: list[Event] = []
        link.execute("1 + 1", events.append)
        assert events == [Count(1), Result({"text/plain": "2"}, True)]
        with pytest.raises(KernelGone, match="did not finish"):
            link.run_silently("import time; time.sleep(3)", timeout=0.3)
    finally:
        link.close()
        kernel.kill()
        kernel.wait()


def test_stopping_a_context_whose_kernel_never_started() -> None:
    """A sandbox killed while its context's first kernel is being made: nothing to kill."""
    context = Context("c", "python", "/")
    done = ensureDeferred(ContextCommands()._stop_kernel(context))
    assert done.called and context.run is None and context.link is None


class Running:
    """A kernel's run whose end has not been seen yet."""

    ended = False

    def abort(self) -> None:
        pass


def test_a_context_stopped_is_not_alive_before_its_kernel_is_seen_to_end() -> None:
    """The kill of a cell deaf to its interrupt: the execution queued behind it must start a
    fresh kernel, not use the given-up link (seen: ``KernelDied`` at once)."""
    context = Context("c", "python", "/")
    context.run, context.link = Running(), Link()  # type: ignore[assignment]
    assert context.alive
    context.stop()
    assert not context.alive
