"""``sandboxctl``'s commands (``cli.run``) against the real daemon's API in memory: background
processes (``run -d``, ``ps``, ``logs``, ``signal``, ``watch``) and trees (``put``/``get`` of
directories, a failed file of a tree), as a person at a terminal and as ``--json``."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock, deferLater

from sandboxd_client import HttpSandbox, ProcessNotFound
from sandboxd_client.cli import Console, parse_args, run

from .daemon_in_memory import POD_URL, InMemoryDaemon, serve_in_memory

TOKEN = "cli-in-memory-token"
LOG_MAX = 64
"""Bytes a background process's log keeps here (``process-log-max``): small, so that a test
can make older output fall out."""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InMemoryDaemon]:
    yield from serve_in_memory(tmp_path, TOKEN.encode(), {"process-log-max": str(LOG_MAX)})


@pytest.fixture
def client(daemon: InMemoryDaemon) -> Iterator[HttpSandbox]:
    c = HttpSandbox(POD_URL, token=TOKEN, reactor=reactor, clock=Clock(), agent=daemon.agent)
    yield c
    pytest_twisted.blockon(c.close())


class Terminal:
    """What one command wrote: stdout (bytes) and stderr (text)."""

    def __init__(self, tty: bool = False) -> None:
        self.out = io.BytesIO()
        self.err = io.StringIO()
        self.console = Console(self.out, self.err, tty=tty)

    def lines(self) -> list[str]:
        return self.out.getvalue().decode().splitlines()


async def ctl(client: HttpSandbox, *argv: str, tty: bool = False) -> tuple[int, Terminal]:
    terminal = Terminal(tty)
    code = await run(client, parse_args(["--url", POD_URL, *argv]), terminal.console)
    return code, terminal


async def created(client: HttpSandbox) -> str:
    return (await client.create()).id


async def turn() -> None:
    """Let the reactor run once round (the in-memory connections move on a pump)."""
    await deferLater(reactor, 0.01, lambda: None)


@pytest_twisted.ensureDeferred
async def test_run_d_ps_logs_and_signal(
    client: HttpSandbox, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = await created(client)
    code, empty = await ctl(client, "ps", handle)
    assert (code, empty.lines(), empty.err.getvalue()) == (0, [], "no background processes\n")
    code, started = await ctl(
        client,
        "run",
        "-d",
        handle,
        "--tag",
        "t",
        "--",
        "sh",
        "-c",
        "echo hi; echo oops >&2; exit 3",
    )
    assert code == 0
    [first] = started.lines()  # the id alone: P=$(sandboxctl run -d ...) names it
    pid = started.err.getvalue().removeprefix("pid ").strip()
    assert int(pid) > 0

    code, followed = await ctl(client, "logs", "-f", handle, first)
    assert (code, followed.out.getvalue()) == (3, b"hi\n"), "the process's exit code"
    assert capsys.readouterr().err == "oops\n"
    code, again = await ctl(client, "logs", "--offset", "1", handle, first)
    assert (code, again.out.getvalue()) == (0, b"i\n"), "without -f: 0, whatever it exited with"
    capsys.readouterr()

    code, as_json = await ctl(client, "--json", "run", "-d", handle, "--", "sleep", "60")
    assert code == 0
    sleeper = json.loads(as_json.out.getvalue())
    assert set(sleeper) == {"id", "pid"} and isinstance(sleeper["pid"], int)

    code, listing = await ctl(client, "ps", handle)
    assert code == 0 and listing.err.getvalue() == ""
    done, running = listing.lines()
    assert done.split() == [
        first,
        pid,
        "exit=3",
        "t",
        "sh",
        "-c",
        "echo",
        "hi;",
        "echo",
        "oops",
        ">&2;",
        "exit",
        "3",
    ]
    assert running.split()[:5] == [sleeper["id"], str(sleeper["pid"]), "running", "-", "sleep"]

    assert (await ctl(client, "signal", handle, sleeper["id"], "sigterm"))[0] == 0
    code, _ = await ctl(client, "logs", "-f", handle, sleeper["id"])
    assert code == 143, "ended by the TERM sent as sigterm"
    code, listed = await ctl(client, "--json", "ps", handle)
    records = json.loads(listed.out.getvalue())
    assert code == 0 and [(r["id"], r["exit_code"], r["running"]) for r in records] == [
        (first, 3, False),
        (sleeper["id"], 143, False),
    ]


@pytest_twisted.ensureDeferred
async def test_run_d_needs_a_command(client: HttpSandbox) -> None:
    handle = await created(client)
    with pytest.raises(ValueError, match="run needs a command"):
        await ctl(client, "run", "-d", handle)
    assert await client.processes(handle) == []


@pytest_twisted.ensureDeferred
async def test_logs_names_the_bytes_that_fell_out_and_where_to_resume(
    client: HttpSandbox, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = await created(client)
    script = f"head -c {3 * LOG_MAX} /dev/zero | tr '\\0' x"
    started = await client.start_process(handle, ["sh", "-c", script])
    await client.output(handle, started.id)  # until it has ended: all its output written
    code, read = await ctl(client, "logs", handle, started.id)
    assert code == 0 and read.out.getvalue() == b"x" * LOG_MAX, "the newest bytes only"
    assert (
        read.err.getvalue()
        == f"sandboxctl: {2 * LOG_MAX} bytes fell out of the host's log before they were read\n"
    )

    with pytest.raises(ProcessNotFound):
        await ctl(client, "logs", "--offset", "7", handle, "no-such-process")
    assert capsys.readouterr().err == ""
    # The console's line is what the person sees before the error itself.
    terminal = Terminal()
    with pytest.raises(ProcessNotFound):
        await run(
            client,
            parse_args(["--url", POD_URL, "logs", "--offset", "7", handle, "nope"]),
            terminal.console,
        )
    assert (
        terminal.err.getvalue() == "sandboxctl: the output stream failed: resume with --offset 7\n"
    )


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest_twisted.ensureDeferred
async def test_watch_prints_each_change_until_interrupted(
    client: HttpSandbox, as_json: bool
) -> None:
    handle = await created(client)
    await client.mkdir(handle, "src")
    terminal = Terminal()
    argv = ["--url", POD_URL, *(["--json"] if as_json else []), "watch", handle, "/src"]
    watching: Deferred[int] = Deferred.fromCoroutine(
        run(client, parse_args(argv), terminal.console)
    )

    def seen() -> tuple[set[str], set[str]]:
        """The directories and the files whose creation the watch printed."""
        dirs, files = set(), set()
        for line in terminal.lines():
            if as_json:
                event = json.loads(line)
                kind, path, is_dir = event["event"], event["path"], event["dir"]
            else:
                kind, shown = line.split()
                path, is_dir = shown.rstrip("/"), shown.endswith("/")
            if kind == "create":
                (dirs if is_dir else files).add(path)
        return dirs, files

    made_dirs: set[str] = set()
    made_files: set[str] = set()
    for n in range(500):  # until the watch is in place, then a new directory and file are seen
        await client.mkdir(handle, f"src/d{n}")
        await client.upload(handle, f"src/f{n}.txt", b"x")
        made_dirs.add(f"/src/d{n}")
        made_files.add(f"/src/f{n}.txt")
        dirs, files = seen()
        if dirs & made_dirs and files & made_files:
            break
        await turn()
    watching.cancel()
    with pytest.raises(CancelledError):
        await watching
    dirs, files = seen()
    assert dirs & made_dirs and dirs <= made_dirs, terminal.lines()
    assert files & made_files and not files & made_dirs, terminal.lines()


@pytest_twisted.ensureDeferred
async def test_put_and_get_of_a_tree(client: HttpSandbox, tmp_path: Path) -> None:
    handle = await created(client)
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "one.txt").write_bytes(b"1" * 10)
    (tree / "two.txt").write_bytes(b"2" * 20)
    (tree / "empty").mkdir()
    code, put = await ctl(client, "--json", "put", handle, str(tree), "proj")
    assert (code, json.loads(put.out.getvalue())) == (0, {"ok": True})
    listed = sorted((e.path, e.size) for e in await client.walk(handle, "proj"))
    assert listed == [("/proj/a/one.txt", 10), ("/proj/two.txt", 20)]
    assert await client.download(handle, "proj/two.txt") == b"2" * 20

    code, _ = await ctl(client, "get", handle, "proj", str(tmp_path / "back"))
    assert code == 0
    back = tmp_path / "back"
    assert (back / "a" / "one.txt").read_bytes() == b"1" * 10
    assert (back / "two.txt").read_bytes() == b"2" * 20

    # A file: that one file.
    code, _ = await ctl(client, "get", handle, "proj/a/one.txt", str(tmp_path / "one"))
    assert code == 0 and (tmp_path / "one").read_bytes() == b"1" * 10

    # A bare directory: the remote directory is made, with no file in it.
    (tmp_path / "bare").mkdir()
    assert (await ctl(client, "put", handle, str(tmp_path / "bare"), "bare"))[0] == 0
    code, ls = await ctl(client, "ls", handle, "bare")
    assert code == 0 and ls.err.getvalue() == "no files under bare\n"


@pytest_twisted.ensureDeferred
async def test_a_tree_whose_file_cannot_be_written_fails_the_put(
    client: HttpSandbox, tmp_path: Path
) -> None:
    handle = await created(client)
    await client.upload(handle, "proj/a", b"a file, where the tree has a directory")
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "inner.txt").write_bytes(b"under a")
    (tree / "z.txt").write_bytes(b"fine")
    with pytest.raises(ValueError, match="member 'a': a file or symlink is in its way"):
        await ctl(client, "put", handle, str(tree), "proj")
    assert await client.download(handle, "proj/a") == b"a file, where the tree has a directory"


@pytest_twisted.ensureDeferred
async def test_create_exec_and_rm(client: HttpSandbox) -> None:
    code, made = await ctl(client, "--json", "create")
    handle = json.loads(made.out.getvalue())["handle"]
    assert code == 0 and (await client.ready(handle)) is False
    code, ran = await ctl(client, "exec", handle, "sh", "-c", "echo out; echo err >&2; exit 2")
    assert (code, ran.out.getvalue(), ran.err.getvalue()) == (2, b"out\n", "err\n")
    await client.upload(handle, "d/f", b"x")
    await client.upload(handle, "g", b"y")
    code, removed = await ctl(client, "--json", "rm", handle, "g")
    assert (code, json.loads(removed.out.getvalue())) == (0, {"ok": True})
    assert (await ctl(client, "rm", "-r", handle, "d"))[0] == 0
    assert await client.walk(handle, "/") == []
