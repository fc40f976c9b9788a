"""A Jupyter kernel for ``bash``, run inside a sandbox (docs/extensions.rst, "Contexts").

This file is not imported by the daemon: its text is the kernel's ``python3 -c`` program, run
by ``SANDBOXD_KERNEL_PYTHON`` as the sandbox (it needs only ipykernel, which Python's kernel
needs anyway, and a ``bash``). It speaks Jupyter's messaging through ipykernel's own
``Kernel`` class and keeps one ``bash -i`` running: variables, functions and the working
directory last from cell to cell.

Why not PyPI's ``bash_kernel``: it runs bash on a pseudo-terminal, and a sandbox may open
none (its ``/dev`` holds the host's ``ptmx`` bound alone, which finds no ``pts`` beside it).
Here bash runs on pipes, which also keeps a cell's stderr apart from its stdout:

- each cell is written to a file of the kernel's own (under ``TMPDIR``) and bash is sent the
  line ``read`` it, ``eval`` it (stdin ``/dev/null``, stderr to a pipe of the kernel's), then
  the line that prints a token of the cell's and ``$?`` on stdout and the token on that
  stderr pipe: the kernel streams both pipes until it has seen both tokens;
- bash's own stderr (prompts, the lines it reads echoed, job control's complaints) goes to
  ``/dev/null``; a command's stderr does not;
- bash leads a process group of its own, without job control (what a cell leaves running
  in the background stays in it), and dies with the kernel; an interrupt (``SIGINT`` to the
  kernel, during a cell) is passed on to that group: the command stops, bash drops the rest
  of the ``eval`` line and reads the next, so the token still comes;
- the group dies with the kernel, whatever kills it (the daemon kills the kernel's own group
  when it removes or restarts the context, or gives up on a cell): a sentinel in it
  (:data:`SENTINEL`, a ``sh`` asleep) is sent ``SIGUSR1`` when the kernel dies
  (``PR_SET_PDEATHSIG``) and kills the group; without ``sh`` there is none, and what a cell
  left running lives until the sandbox ends;
- a non-zero status is an ``error`` with name ``""`` and the status as its value, as PyPI's
  ``bash_kernel`` says it (what E2B's interpreter reports); a bash that exits (``exit``) is
  replaced by a new one, said as an error. Its exit is seen as itself (a pidfd, else a look
  every :data:`EXIT_POLL` seconds), not as the end of its pipes: what it left running in the
  background (``sleep 60 & exit``) holds them open. What comes on them once it has exited is
  read as far as is there already (:data:`AFTER_EXIT_MAX`), then its group is killed.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import os
import secrets
import selectors
import signal
import subprocess
import tempfile
from typing import Any

PR_SET_PDEATHSIG = 1
SENTINEL = (
    "sh",
    "-c",
    'trap "" INT TERM HUP QUIT; trap "kill -KILL 0" USR1; while :; do sleep 86400 & wait $!; done',
)
"""In bash's group, sent ``SIGUSR1`` when the kernel dies: it kills the group. Deaf to the
signals a cell or an interrupt sends the group (a cell's ``kill -USR1 0`` ends bash anyway)."""
EXIT_POLL = 0.2
"""Seconds between looks at whether bash has exited, where the kernel has no pidfd (Linux
before 5.3, Python before 3.9)."""
AFTER_EXIT_MAX = 1 << 20
"""Bytes read from a cell's pipes once bash has exited (what bash and its background jobs
wrote until then; they may write on, and are killed)."""
SETUP = (
    "PS1=; PS2=; PS0=; PROMPT_COMMAND=; set +H +m +o history; unset HISTFILE\n"
    '__sbx_done() {{ local s=$?; printf \'%s %d\\n\' "$1" "$s"; printf \'%s\\n\' "$1" >&{err}; }}\n'
)
CELL = (
    "IFS= read -r -d '' __sbx_cell < {path}; eval \"$__sbx_cell\" < /dev/null 2>&{err} {err}>&-\n"
    "__sbx_done {token}\n"
)


class Shell:
    """One ``bash -i`` on pipes: :meth:`run` a cell, telling ``say(stream, text)`` its
    output as it comes; its status, or ``None`` once bash has exited."""

    def __init__(self) -> None:
        self.err_read, err_write = os.pipe()
        self.bash = subprocess.Popen(
            ["bash", "--norc", "--noprofile", "-i"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            pass_fds=(err_write,),
            preexec_fn=_in_its_own_group,
        )
        os.close(err_write)
        self.err_fd = err_write
        self.exited_fd = _pidfd(self.bash.pid)
        """Readable once bash has exited (``None``: no pidfd here, bash is looked at)."""
        self.sentinel = _sentinel(self.bash.pid)
        self.cells = tempfile.mkdtemp(prefix="sandboxd-shell-")
        self.run(SETUP.format(err=err_write), lambda stream, text: None, setup=True)

    def interrupt(self) -> None:
        """``SIGINT`` to bash's process group: the command running stops, and bash drops the
        rest of the cell."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.bash.pid, signal.SIGINT)

    def close(self) -> None:
        """Kill bash's process group (what the cells left running in it too)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.bash.pid, signal.SIGKILL)
        self.bash.wait()
        if self.sentinel is not None:
            self.sentinel.wait()
        os.close(self.err_read)
        if self.exited_fd is not None:
            os.close(self.exited_fd)
        assert self.bash.stdin is not None and self.bash.stdout is not None
        with contextlib.suppress(BrokenPipeError):  # what was left unsent: bash is gone
            self.bash.stdin.close()
        self.bash.stdout.close()
        for name in os.listdir(self.cells):
            os.unlink(os.path.join(self.cells, name))
        os.rmdir(self.cells)

    def run(self, code: str, say: Any, setup: bool = False) -> int | None:
        token = "__sbx_" + secrets.token_hex(16)
        assert self.bash.stdin is not None and self.bash.stdout is not None
        if setup:
            line = code + f"__sbx_done {token}\n"
        else:
            path = os.path.join(self.cells, "cell")
            with open(path, "w", encoding="utf-8") as cell:
                cell.write(code.replace("\0", ""))
            line = CELL.format(path=path, err=self.err_fd, token=token)
        try:
            self.bash.stdin.write(line.encode())
            self.bash.stdin.flush()
        except BrokenPipeError:
            return None
        stdout = self.bash.stdout.fileno()
        streams = {
            stdout: Stream("stdout", f"{token} ", say, status=True),
            self.err_read: Stream("stderr", f"{token}\n", say),
        }
        with selectors.DefaultSelector() as selector:
            for fd in streams:
                selector.register(fd, selectors.EVENT_READ)
            if self.exited_fd is not None:
                selector.register(self.exited_fd, selectors.EVENT_READ)
            while not all(stream.ended for stream in streams.values()):
                ready = selector.select(None if self.exited_fd is not None else EXIT_POLL)
                closed = False
                for key, _ in ready:
                    if key.fd != self.exited_fd and not _take(selector, streams, key.fd, 65536):
                        closed = closed or key.fd == stdout  # bash exited (or closed it)
                if closed or self._exited(ready):
                    self._read_what_is_there(selector, streams)
                    return None
        return int(streams[stdout].rest.split("\n", 1)[0])

    def _exited(self, ready: list[tuple[selectors.SelectorKey, int]]) -> bool:
        """Whether bash has exited: its pidfd is among ``ready``, or else a look says so."""
        if self.exited_fd is None:
            return self.bash.poll() is not None
        return any(key.fd == self.exited_fd for key, _ in ready)

    def _read_what_is_there(
        self, selector: selectors.BaseSelector, streams: dict[int, Stream]
    ) -> None:
        """Say what the pipes hold now (up to :data:`AFTER_EXIT_MAX` bytes), waiting for no
        more: bash has exited, and what it left running may hold them open."""
        if self.exited_fd is not None:
            selector.unregister(self.exited_fd)
        budget = AFTER_EXIT_MAX
        while budget > 0:
            ready = selector.select(0)
            if not ready:
                return
            for key, _ in ready:
                budget -= _take(selector, streams, key.fd, budget)


def _take(selector: selectors.BaseSelector, streams: dict[int, Stream], fd: int, most: int) -> int:
    """Read up to ``most`` bytes of ``fd`` into its stream; stop watching it at its end or
    its token. The bytes read (0: its end)."""
    data = os.read(fd, most)
    streams[fd].take(data)
    if not data or streams[fd].ended:
        selector.unregister(fd)
    return len(data)


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (readable once it has exited); ``None`` where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Python before 3.9 (its module), Linux before 5.3
        return None


def _in_its_own_group() -> None:  # pragma: no cover - in the child, before its exec
    """In bash, before its exec: a process group of its own (``process_group=0`` wants Python
    3.11, a template's python may be older), ``SIGINT`` as by default (the kernel's app
    ignores it), and killed when the kernel dies (``PR_SET_PDEATHSIG``)."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _sentinel(group: int) -> subprocess.Popen[bytes] | None:
    """Start :data:`SENTINEL` in the process group ``group``; ``None`` where it cannot run."""
    kernel = os.getpid()

    def enter() -> None:  # pragma: no cover - in the child, before its exec
        os.setpgid(0, group)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGUSR1)
        if os.getppid() != kernel:  # the kernel died before the line above
            os.killpg(group, signal.SIGKILL)

    try:
        return subprocess.Popen(
            SENTINEL,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=enter,
        )
    except (OSError, subprocess.SubprocessError):  # no sh; bash's group gone meanwhile
        return None


class Stream:
    """One pipe's text up to its token (said as it comes, minus what could begin the token);
    :attr:`rest`: what followed the token (with ``status``, it has ended once that holds a
    whole line: the status)."""

    def __init__(self, name: str, token: str, say: Any, status: bool = False) -> None:
        self.name = name
        self.token = token
        self.say = say
        self.status = status
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.held = ""
        self.found = False
        self.ended = False
        self.rest = ""

    def take(self, data: bytes) -> None:
        if self.found:
            self.rest += self.decoder.decode(data)
            self.ended = "\n" in self.rest
            return
        self.held += self.decoder.decode(data)
        found = self.held.find(self.token)
        if found >= 0:
            self.found = True
            self.rest = self.held[found + len(self.token) :]
            self.ended = not self.status or "\n" in self.rest
            self._say(self.held[:found])
            return
        keep = len(self.token) - 1
        cut = max(0, len(self.held) - keep)
        while cut < len(self.held) and not self.token.startswith(self.held[cut:]):
            cut += 1
        self._say(self.held[:cut])
        self.held = self.held[cut:]

    def _say(self, text: str) -> None:
        if text:
            self.say(self.name, text)


class Cells:
    """The kernel's bash across cells: :meth:`execute` one, its error (``None``: none)."""

    def __init__(self) -> None:
        self.shell = Shell()
        self.interrupted = False

    def execute(self, code: str, say: Any) -> tuple[str, str] | None:
        """Run ``code``, interrupted by ``SIGINT`` meanwhile (this thread must be the main
        one); the error as ``(name, value)``: ``("", status)`` for a non-zero status,
        ``KeyboardInterrupt``, or ``ShellExited`` (a new bash is started)."""
        self.interrupted = False
        old_int = signal.signal(signal.SIGINT, self._interrupt)
        try:
            status = self.shell.run(code, say)
        finally:
            signal.signal(signal.SIGINT, old_int)
        if status is None:
            self.shell.close()
            self.shell = Shell()
            return ("ShellExited", "bash exited: a new one is started (its variables are gone)")
        if self.interrupted:
            return ("KeyboardInterrupt", "")
        return ("", str(status)) if status else None

    def _interrupt(self, signum: int, frame: Any) -> None:
        self.interrupted = True
        self.shell.interrupt()


def main() -> None:  # pragma: no cover - run in a sandbox by its python (tests/process: bash)
    """The kernel: ipykernel's app around :class:`Cells` (ipykernel is the sandbox's)."""
    from ipykernel.kernelapp import IPKernelApp
    from ipykernel.kernelbase import Kernel

    class BashKernel(Kernel):  # type: ignore[misc]
        implementation = "sandboxd-bash"
        implementation_version = "1"
        language_info = {
            "name": "bash",
            "codemirror_mode": "shell",
            "mimetype": "text/x-sh",
            "file_extension": ".sh",
        }
        banner = "bash, on pipes (sandboxd)"

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.cells = Cells()

        def do_execute(
            self,
            code: str,
            silent: bool,
            store_history: bool = True,
            user_expressions: Any = None,
            allow_stdin: bool = False,
        ) -> dict[str, Any]:
            def say(stream: str, text: str) -> None:
                if not silent:
                    content = {"name": stream, "text": text}
                    self.send_response(self.iopub_socket, "stream", content)

            error = self.cells.execute(code, say)
            if error is None:
                return {"status": "ok", "execution_count": self.execution_count, "payload": []}
            content = {"ename": error[0], "evalue": error[1], "traceback": []}
            if not silent:
                self.send_response(self.iopub_socket, "error", content)
            return {"status": "error", "execution_count": self.execution_count, **content}

        def do_shutdown(self, restart: bool) -> dict[str, Any]:
            self.cells.shell.close()
            return {"status": "ok", "restart": restart}

    IPKernelApp.launch_instance(kernel_class=BashKernel)


if __name__ == "__main__":  # pragma: no cover - as above
    main()
