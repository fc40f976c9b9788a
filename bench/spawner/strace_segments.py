#!/usr/bin/env python3
"""Where one exec's time goes, from ``daemon_rows.py --strace FILE`` (docs/spawner-design.rst).

    python3 bench/spawner/strace_segments.py FILE

The daemon ran under ``strace -f --seccomp-bpf -ttt`` stopping only at ``recvfrom``, ``pipe2``,
``clone3``, ``execve``, ``exit_group``, ``wait4`` and ``sendto``: the code between two stops
runs at full speed, but every stop, and the tracer's attach to each new child, adds its own
delay (the segments with stops inside are upper bounds). Prints the p50, p10, p90 of each
segment over the execs whose eight marks were all found.
"""

import itertools
import re
import statistics
import sys

MARKS = ("body", "pipe", "clone", "helper", "true", "exit", "reap", "send")
NAMES = {
    "pipe": "request read -> first pipe2 (Python: parse, manager, launch)",
    "clone": "first pipe2 -> clone3 (Twisted spawnProcess preparation)",
    "helper": "clone3 -> helper execve (vfork child; + tracer attach)",
    "true": "helper execve -> execve true (helper; + 2 traced execs)",
    "exit": "execve true -> exit_group (true itself)",
    "reap": "exit_group -> wait4 reaped (SIGCHLD to the reactor)",
    "send": "reaped -> response sendto (processEnded, exit frame)",
}
STAMP = re.compile(r"^\d+\s+(\d+\.\d+)\s")


def mark_of(line: str, seen: dict[str, float]) -> str | None:
    """Which mark ``line`` is (the first of its kind after the request), if any."""
    checks = {
        "pipe": "pipe2(" in line,
        "clone": "clone3(" in line and "resumed" not in line,
        "helper": 'execve("' in line and "sandboxd-exec" in line,
        "true": 'execve("/usr/bin/true"' in line,
        "exit": "exit_group(" in line,
        "reap": "wait4(" in line and "WIFEXITED" in line,
        "send": 'sendto(15, "HTTP/1.1 200' in line,
    }
    for name, hit in checks.items():
        if hit and name not in seen:
            return name
    return None


def request_line(line: str) -> bool:
    """The read that completes an exec request (headers and body together, or the body)."""
    if "recvfrom(" not in line:
        return False
    whole = "POST /sandboxes/" in line and line.endswith("= 137")
    return whole or '"{\\"cmd' in line


def segments(lines: list[str]) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {name: [] for name in NAMES}
    for i, line in enumerate(lines):
        stamp = STAMP.match(line)
        if stamp is None or not request_line(line):
            continue
        seen = {"body": float(stamp.group(1))}
        for later in lines[i + 1 : i + 200]:
            later_stamp = STAMP.match(later)
            name = mark_of(later, seen)
            if later_stamp is None or name is None:
                continue
            seen[name] = float(later_stamp.group(1))
            if name == "send":
                break
        if all(mark in seen for mark in MARKS):
            for before, after in itertools.pairwise(MARKS):
                found[after].append((seen[after] - seen[before]) * 1e3)
    return found


def main() -> int:
    with open(sys.argv[1]) as f:
        found = segments(f.read().splitlines())
    for name, values in found.items():
        if not values:
            continue
        values.sort()
        p10, p90 = values[len(values) // 10], values[len(values) * 9 // 10]
        print(
            f"{NAMES[name]:<62} p50 {statistics.median(values):6.3f} ms"
            f"  p10 {p10:6.3f}  p90 {p90:6.3f}  n={len(values)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
