"""``sandboxctl`` against a replica from before tar streams (``files.tree``) and background
processes (``processes``): the real daemon's API in memory, its ``/healthz`` listing neither.
Trees go file by file, stdin goes whole in the exec request (up to 48 MiB), and what needs
the newer replica (``put -``, ``get … -``) is refused by name."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock

from sandboxd_client import HttpSandbox
from sandboxd_client.cli import Console, parse_args, run
from sandboxd_client.cli._stdin import BUFFERED_MAX
from sandboxd_client.cli._trees import get_tree

from .daemon_in_memory import POD_URL, InMemoryDaemon, older, serve_in_memory

TOKEN = "older-replica-token"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InMemoryDaemon]:
    for served in serve_in_memory(tmp_path, TOKEN.encode()):
        older(served, "files.tree", "processes")
        yield served


@pytest.fixture
def client(daemon: InMemoryDaemon) -> Iterator[HttpSandbox]:
    c = HttpSandbox(POD_URL, token=TOKEN, reactor=reactor, clock=Clock(), agent=daemon.agent)
    yield c
    pytest_twisted.blockon(c.close())


class Terminal:
    """What one command wrote (stdout bytes, stderr text), and the stdin it was given."""

    def __init__(self, stdin: io.BufferedIOBase | None = None) -> None:
        self.out = io.BytesIO()
        self.err = io.StringIO()
        self.console = Console(self.out, self.err, tty=False, stdin=stdin)  # type: ignore[arg-type]


async def ctl(
    client: HttpSandbox, *argv: str, stdin: io.BufferedIOBase | None = None
) -> tuple[int, Terminal]:
    terminal = Terminal(stdin)
    code = await run(client, parse_args(["--url", POD_URL, *argv]), terminal.console)
    return code, terminal


@pytest_twisted.ensureDeferred
async def test_the_replica_lists_neither_capability(client: HttpSandbox) -> None:
    handle = await client.create()
    assert {"files.tree", "processes"}.isdisjoint(await client.capabilities(handle))


@pytest_twisted.ensureDeferred
async def test_a_tree_goes_file_by_file_both_ways(client: HttpSandbox, tmp_path: Path) -> None:
    handle = (await client.create()).id
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "one.txt").write_bytes(b"1" * 10)
    (tree / "two.txt").write_bytes(b"2" * 2000)
    (tree / "empty").mkdir()
    code, put = await ctl(client, "put", handle, str(tree), "proj")
    assert (code, put.out.getvalue(), put.err.getvalue()) == (0, b"", "")
    listed = sorted((e.path, e.size) for e in await client.walk(handle, "proj"))
    assert listed == [("/proj/a/one.txt", 10), ("/proj/two.txt", 2000)]
    made = await client.exec(handle, ["find", "proj", "-type", "d"])
    assert sorted(made.stdout.decode().split()) == ["proj", "proj/a", "proj/a/b", "proj/empty"]

    back = tmp_path / "back"
    code, got = await ctl(client, "--json", "get", handle, "proj", str(back))
    assert (code, got.out.getvalue()) == (0, b'{"ok": true}\n')
    assert (back / "a" / "one.txt").read_bytes() == b"1" * 10
    assert (back / "two.txt").read_bytes() == b"2" * 2000
    assert sorted(os.listdir(back)) == ["a", "two.txt"], "only files: empty directories not"


@pytest_twisted.ensureDeferred
async def test_a_bare_directory_is_made_remotely(client: HttpSandbox, tmp_path: Path) -> None:
    handle = (await client.create()).id
    (tmp_path / "bare").mkdir()
    assert (await ctl(client, "put", handle, str(tmp_path / "bare"), "bare"))[0] == 0
    made = await client.exec(handle, ["test", "-d", "bare"])
    assert made.exit_code == 0


@pytest_twisted.ensureDeferred
async def test_a_file_that_fails_fails_the_tree(client: HttpSandbox, tmp_path: Path) -> None:
    handle = (await client.create()).id
    await client.upload(handle, "proj/a", b"a file, where the tree has a directory")
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "inner.txt").write_bytes(b"under a")
    with pytest.raises(Exception) as failed:
        await ctl(client, "put", handle, str(tree), "proj")
    assert not isinstance(failed.value, AssertionError)
    assert await client.download(handle, "proj/a") == b"a file, where the tree has a directory"


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["put", "-", "in"], "put -: this sandboxd has no tar streams"),
        (["get", "in", "-"], "get … -: this sandboxd has no tar streams"),
    ],
    ids=["put", "get"],
)
async def test_dash_needs_tar_streams(client: HttpSandbox, argv: list[str], says: str) -> None:
    handle = (await client.create()).id
    await client.upload(handle, "in/f", b"x")
    tar_in = io.BytesIO(b"never read")
    with pytest.raises(ValueError, match=f"^{says} \\(files.tree\\): upgrade it$"):
        await ctl(client, argv[0], handle, *argv[1:], stdin=tar_in)
    assert tar_in.tell() == 0, "stdin was not read"
    assert [e.path for e in await client.walk(handle, "/")] == ["/in/f"]


@pytest_twisted.ensureDeferred
async def test_stdin_goes_whole_in_the_exec_request(client: HttpSandbox) -> None:
    handle = (await client.create()).id
    read, write = os.pipe()
    os.write(write, b"piped\nlines\n")
    os.close(write)
    with open(read, "rb") as pipe:
        code, ran = await ctl(client, "exec", handle, "wc", "-l", stdin=pipe)  # type: ignore[arg-type]
    assert (code, ran.out.getvalue().strip()) == (0, b"2")
    code, ran = await ctl(client, "exec", "-i", handle, "cat", stdin=io.BytesIO(b"in memory"))
    assert (code, ran.out.getvalue()) == (0, b"in memory")


@pytest_twisted.ensureDeferred
async def test_stdin_over_47_mib_is_refused_by_name(client: HttpSandbox) -> None:
    handle = (await client.create()).id
    await client.upload(handle, "mark", b"")
    with pytest.raises(ValueError, match=r"^stdin is over 47 MiB: this sandboxd takes stdin"):
        await ctl(
            client,
            "exec",
            "-i",
            handle,
            "rm",
            "mark",
            stdin=io.BytesIO(bytes(BUFFERED_MAX + 1)),
        )
    assert await client.size(handle, "mark") == 0, "the command never ran"
    code, ran = await ctl(
        client, "exec", "-i", handle, "wc", "-c", stdin=io.BytesIO(bytes(BUFFERED_MAX))
    )
    assert (code, ran.out.getvalue().strip()) == (0, str(BUFFERED_MAX).encode())


@pytest_twisted.ensureDeferred
async def test_get_tree_of_a_path_that_walks_to_itself_downloads_that_one_file(
    client: HttpSandbox, tmp_path: Path
) -> None:
    """A walk of a file's own path lists that file alone (``sandboxctl get`` reaches this when
    the file appears between its size probe and its walk): the one file is downloaded."""
    handle = await client.create()
    await client.upload(handle, "only.txt", b"just one")
    target = tmp_path / "only.txt"
    downloaded: list[str] = []

    async def download_file() -> None:
        await client.download_to_file(handle, "only.txt", str(target))
        downloaded.append("only.txt")

    def quiet(done: int, total: int | None) -> None:
        """No progress to show."""

    received = await get_tree(client, handle, "only.txt", str(target), quiet, download_file)
    assert (received, downloaded, target.read_bytes()) == (1, ["only.txt"], b"just one")
