"""The bash kernel's parts that need no ipykernel (docs/extensions.rst, "Contexts"), driving a
real ``bash -i`` on pipes, and bash's per-execution environment cells run by a real bash."""

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandboxd.core.contexts import shell_kernel
from sandboxd.core.contexts.languages import BASH
from sandboxd.core.contexts.shell_kernel import Cells, Shell, Stream

Said = list[tuple[str, str]]


def cells_said() -> tuple[Cells, Said]:
    return Cells(), []


def joined(said: Said, stream: str) -> str:
    """What was said on ``stream``, in however many pieces the pipe gave it."""
    return "".join(text for name, text in said if name == stream)


def test_state_streams_and_status() -> None:
    cells, said = cells_said()
    try:
        assert cells.execute("x=41; cd /", lambda *s: said.append(s)) is None
        assert cells.execute("echo $((x + 1)) $PWD; echo e >&2", lambda *s: said.append(s)) is None
        assert (joined(said, "stdout"), joined(said, "stderr")) == ("42 /\n", "e\n")
        said.clear()
        assert cells.execute("printf partial; (exit 3)", lambda *s: said.append(s)) == ("", "3")
        assert said == [("stdout", "partial")]  # no newline added, none waited for
        said.clear()
        assert cells.execute("echo 'unterminated", lambda *s: said.append(s)) == ("", "2")
        assert [stream for stream, _ in said] == ["stderr"]  # bash's syntax error, the cell's
        assert cells.execute("cat; echo read nothing", lambda *s: said.append(s)) is None
        assert said[-1] == ("stdout", "read nothing\n")  # a cell's stdin is /dev/null
    finally:
        cells.shell.close()


def test_an_interrupt_stops_the_command_and_keeps_the_shell() -> None:
    cells, said = cells_said()
    try:
        cells.execute("kept=yes", lambda *s: None)
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        error = cells.execute("echo started; sleep 60; echo never", lambda *s: said.append(s))
        timer.join()
        assert error == ("KeyboardInterrupt", "")
        assert said == [("stdout", "started\n")]
        assert cells.execute("echo $kept", lambda *s: said.append(s)) is None
        assert said[-1] == ("stdout", "yes\n")
    finally:
        cells.shell.close()


def test_a_shell_that_exits_is_replaced() -> None:
    cells, said = cells_said()
    try:
        cells.execute("gone=1", lambda *s: None)
        name, _ = cells.execute("exit 4", lambda *s: None) or ("", "")
        assert name == "ShellExited"
        assert cells.execute('echo "[$gone]"', lambda *s: said.append(s)) is None
        assert said == [("stdout", "[]\n")]
        cells.shell.bash.kill()
        cells.shell.bash.wait()
        assert cells.shell.run("echo", lambda *s: None) is None  # nothing more reaches it
    finally:
        cells.shell.close()


@pytest.mark.parametrize("chunks", [["ab", "cTOKEN", " 0\n"], ["abc", "TO", "KEN 0", "\n"]])
def test_a_stream_holds_back_what_may_begin_its_token(chunks: list[str]) -> None:
    said: Said = []
    stream = Stream("stdout", "TOKEN ", lambda *s: said.append(s), status=True)
    for chunk in chunks:
        assert not stream.ended
        stream.take(chunk.encode())
    assert stream.ended and stream.rest == "0\n"
    assert "".join(text for _, text in said) == "abc"


def test_a_stream_keeps_a_split_character_whole() -> None:
    said: Said = []
    stream = Stream("stderr", "T\n", lambda *s: said.append(s))
    data = "é".encode()
    stream.take(data[:1])
    stream.take(data[1:] + b"T\n")
    assert said == [("stderr", "é")] and stream.ended


def run_bash(script: str) -> str:
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    return done.stdout


def test_bash_env_code_sets_then_restores() -> None:
    before, after = BASH.env_code({"A": "new 'quoted' $x", "B": "2"})
    script = f'export B=old\n{before}\necho "$A|$B"\n{after}\necho "${{A-unset}}|$B"'
    assert run_bash(script).splitlines() == ["new 'quoted' $x|2", "unset|old"]
    with pytest.raises(ValueError, match="'not a name'"):
        BASH.env_code({"not a name": "1"})


def test_closing_a_shell_kills_what_it_left_running() -> None:
    shell = Shell()
    said: Said = []
    shell.run("sleep 60 & echo $!", lambda *s: said.append(s))
    [pid] = [text for stream, text in said if stream == "stdout"]  # stderr: bash's "[1] pid"
    sleeper = Path(f"/proc/{int(pid)}/stat")
    shell.close()
    for _ in range(100):  # killed at once; its reaping (by init) is not ours to wait on
        if not sleeper.exists() or sleeper.read_text().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the background sleep outlived its shell")


def gone(pid: int, looks: int = 100) -> bool:
    """Whether ``pid`` has ended (a zombie waiting for init counts as ended)."""
    stat = Path(f"/proc/{pid}/stat")
    for _ in range(looks):  # killed at once; its reaping is not ours to wait on
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def exit_leaving_a_job_behind(cells: Cells) -> None:
    """``sleep 60 & exit``: bash's end is seen though the sleep holds its pipes open."""
    said: Said = []
    started = time.monotonic()
    error = cells.execute("echo before; sleep 60 & echo $!; exit 3", lambda *s: said.append(s))
    assert time.monotonic() - started < 10  # not the sleep's 60 s
    assert error is not None and error[0] == "ShellExited"
    before, pid = joined(said, "stdout").splitlines()
    assert before == "before"
    assert gone(int(pid))  # killed with its shell's group
    said.clear()
    assert cells.execute("echo again", lambda *s: said.append(s)) is None  # a new shell
    assert said == [("stdout", "again\n")]


def test_a_shell_that_exits_leaving_a_job_behind_is_replaced() -> None:
    cells = Cells()
    try:
        assert cells.shell.exited_fd is not None  # a pidfd watches bash
        exit_leaving_a_job_behind(cells)
    finally:
        cells.shell.close()


def test_without_a_pidfd_bash_is_looked_at(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", refused)  # Linux before 5.3
    cells = Cells()
    try:
        assert cells.shell.exited_fd is None
        exit_leaving_a_job_behind(cells)
    finally:
        cells.shell.close()


def test_what_comes_after_bash_exited_is_read_up_to_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What its jobs wrote is read once bash has exited, as far as the bound, however much
    more they write."""
    monkeypatch.setattr(shell_kernel, "AFTER_EXIT_MAX", 4096)
    shell = Shell()
    said: Said = []
    read, write = os.pipe()
    try:
        os.write(write, b"y\n" * 5000)
        with selectors.DefaultSelector() as selector:
            selector.register(read, selectors.EVENT_READ)
            assert shell.exited_fd is not None
            selector.register(shell.exited_fd, selectors.EVENT_READ)
            stream = Stream("stdout", "TOKEN ", lambda *s: said.append(s), status=True)
            shell._read_what_is_there(selector, {read: stream})
        assert len(joined(said, "stdout")) + len(stream.held) == 4096
    finally:
        os.close(read)
        os.close(write)
        shell.close()


KERNEL = """
import sys
from sandboxd.core.contexts.shell_kernel import Shell
shell = Shell()
shell.run("sleep 60 & echo $!", lambda stream, text: stream == "stdout" and print(text, end=""))
sys.stdout.flush()
sys.stdin.read()  # until killed
"""


def test_what_a_cell_left_running_dies_with_its_kernel() -> None:
    """The kernel killed (``SIGKILL``: it can do nothing), its bash's group is killed too."""
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(shell_kernel.__file__).parents[3])},
    )
    try:
        assert kernel.stdout is not None
        sleeper = int(kernel.stdout.readline())
        assert not gone(sleeper, looks=1)
    finally:
        kernel.kill()
        kernel.wait()
    assert gone(sleeper)


def test_without_a_sentinel_the_shell_runs_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shell_kernel, "SENTINEL", ("/nonexistent/sh",))  # a root without sh
    cells, said = cells_said()
    try:
        assert cells.shell.sentinel is None
        assert cells.execute("echo still", lambda *s: said.append(s)) is None
        assert said == [("stdout", "still\n")]
    finally:
        cells.shell.close()
