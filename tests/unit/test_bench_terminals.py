"""bench: the terminals rows (bench/sbench/terminals.py): the section is registered, and its
bare WebSocket client frames as RFC 6455 says (a masked frame out, the short and 16-bit
length forms in).

Shape only: no figure is asserted (``bench/run.py --quick`` runs the section against real
daemons in CI; the figures are a full run's, docs/performance.rst).
"""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH)]

from bench import run as bench_run  # noqa: E402
from bench.sbench import figures, terminals  # noqa: E402


def test_the_section_is_one_of_the_bench() -> None:
    assert "terminals" in bench_run.SECTIONS
    assert bench_run.parse(["--only", "terminals"]).only == ["terminals"]
    assert callable(figures.Bench.terminals)


def test_a_frame_sent_is_a_masked_binary_frame() -> None:
    import socket

    ours, theirs = socket.socketpair()
    try:
        client = object.__new__(terminals.TerminalSocket)
        client.sock, client.buffer = ours, b""
        client.send(b"k")
        frame = theirs.recv(64)
        assert frame[0] == 0x82 and frame[1] == 0x81 and len(frame) == 7
        mask = frame[2:6]
        assert bytes([frame[6] ^ mask[0]]) == b"k"
        # A server's frames: unmasked, with the 16-bit length form too.
        theirs.sendall(bytes([0x82, 5]) + b"hello" + bytes([0x82, 126, 0, 200]) + b"x" * 200)
        assert client.receive() == (2, b"hello")
        assert client.receive() == (2, b"x" * 200)
    finally:
        ours.close()
        theirs.close()
