"""One long-running ``sandboxd-exec namespace-server`` that makes each create's namespaces.

Starting a program from the daemon costs about a millisecond before it does anything; the
server (``sandboxd_exec_ns.h``) is started once, and each create sends it one line (the
``namespaces`` arguments, separated by tabs) and reads one answer (exit code, tab, message). It
starts on first use, and again after it died; it ends when the daemon closes its stdin. It
makes each new mount namespace as a copy of a template of its own (made at its first request:
a copy of the host's with ``{root}/.ns`` detached), not of the host's, which holds three pins
per live sandbox: so a create costs the same however many sandboxes live.
"""

import contextlib
import subprocess
from collections.abc import Sequence

from attrs import define, field

from sandboxd.isolation.base import PLAIN_ENV, RunProgram
from sandboxd.isolation.namespaces.pins import run_program


@define
class NamespaceServer:
    """A :data:`~sandboxd.isolation.base.RunProgram`: ``sandboxd-exec namespaces ...``
    goes to the server, any other argv runs as a program."""

    helper: str
    fallback: RunProgram = run_program
    _process: "subprocess.Popen[bytes] | None" = field(default=None, init=False)

    def __call__(self, argv: Sequence[str]) -> tuple[int, str]:
        if len(argv) < 2 or argv[0] != self.helper or argv[1] != "namespaces":
            return self.fallback(argv)
        fields = list(argv[2:])
        if any("\t" in text or "\n" in text for text in fields):
            return 125, "sandboxd-exec: a namespace argument holds a tab or a newline"
        process = self._started()
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(("\t".join(fields) + "\n").encode())
            process.stdin.flush()
            line = process.stdout.readline()
        except OSError:
            line = b""
        if not line.endswith(b"\n"):
            self.close()
            return 125, "sandboxd-exec: the namespace server ended"
        code, _, message = line.decode("utf-8", "replace").rstrip("\n").partition("\t")
        return int(code), message.strip()

    def _started(self) -> "subprocess.Popen[bytes]":
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [self.helper, "namespace-server"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=PLAIN_ENV,
            )
        return self._process

    def close(self) -> None:
        """End the server (it exits at the end of its stdin)."""
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None and process.stdout is not None
        with contextlib.suppress(OSError):  # its flush of a line never read may fail
            process.stdin.close()
        process.stdout.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover (it ends at EOF; a bound only)
            process.kill()
            process.wait()
