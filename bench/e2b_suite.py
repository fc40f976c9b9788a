"""E2B's own SDK test suite (``packages/python-sdk/tests`` of e2b-dev/E2B) against the front.

Nothing of E2B's is kept in this tree: the suite is taken at run time from a local git
mirror of e2b-dev/E2B (its git directory: ``--mirror`` or ``E2B_MIRROR``) into a cache
directory (at the tag of the release under test, ``@e2b/python-sdk@<version>``, when the
mirror has it, else its HEAD; ``--ref`` chooses), with a virtualenv of that ``e2b`` release
and the suite's test dependencies (pytest, pytest-asyncio, pytest-timeout, python-dotenv;
from PyPI, once per version). A daemon is started with the E2B front on a free loopback
port, the suite runs with ``E2B_API_URL``/``E2B_SANDBOX_URL``/``E2B_API_KEY`` pointed at
it, and each failing test is printed with the first line of its error (the JUnit report
stays in the cache).

    python bench/e2b_suite.py --mirror /path/to/E2B.git                    # e2b 2.63.0
    python bench/e2b_suite.py --mirror ... --e2b 2.45.1 -- tests/sync -k files  # pytest's
    sudo .venv/bin/python bench/e2b_suite.py --mirror ... --isolated       # the real isolation

The list of what still fails, and why, is in docs/e2b.rst (*E2B's own test suite*).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import venv
import xml.etree.ElementTree as ET
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent)]

from tests.support.daemon import free_port, start_daemon, stop_daemon  # noqa: E402

SUITE = "packages/python-sdk/tests"
PYTEST_INI = "packages/python-sdk/pytest.ini"
TEST_DEPENDENCIES = ("pytest>=9,<10", "pytest-asyncio>=1.3,<2", "pytest-timeout", "python-dotenv")
# e2b 2.45 refuses, before sending it, a key not of the form E2B issues: "e2b_" and hex digits.
TOKEN = "e2b_" + "5eed" * 10


def release_ref(mirror: str, version: str) -> str:
    """The mirror's tag of the Python SDK's ``version`` (``@e2b/python-sdk@2.45.1``), or HEAD.

    E2B tags each release of the SDK with the commit its suite was written for; a release newer
    than the mirror has no tag there, and the newest suite is the closest.
    """
    tag = f"@e2b/python-sdk@{version}"
    found = subprocess.run(
        ["git", "--git-dir", mirror, "rev-parse", "--verify", "-q", f"refs/tags/{tag}"],
        capture_output=True,
        check=False,
    )
    return tag if found.returncode == 0 else "HEAD"


def checkout(mirror: str, ref: str, cache: Path) -> Path:
    """The suite (and its pytest.ini) at ``ref`` of the mirror, extracted once per commit."""
    commit = subprocess.run(
        ["git", "--git-dir", mirror, "rev-parse", f"{ref}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    target = cache / f"suite-{commit[:12]}"
    if not (target / SUITE).is_dir():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.Popen(
            ["git", "--git-dir", mirror, "archive", commit, SUITE, PYTEST_INI],
            stdout=subprocess.PIPE,
        )
        subprocess.run(["tar", "-x", "-C", str(target)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"git archive of {commit} failed")
    return target / "packages/python-sdk"


def environment(cache: Path, version: str) -> Path:
    """A virtualenv with ``e2b==version`` and the suite's test dependencies (made once)."""
    home = cache / f"venv-e2b-{version}"
    python = home / "bin/python"
    if not python.exists():
        venv.create(home, with_pip=True)
        packages = [f"e2b=={version}", *TEST_DEPENDENCIES]
        subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)
    return python


def failures(report: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Counts by outcome, and each failing test with the first line of its error."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failed = []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            counts["failed"] += 1
            message = (problem.get("message") or problem.text or "").strip().splitlines()
            failed.append((name, message[0][:200] if message else ""))
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", default=os.environ.get("E2B_MIRROR"), help="E2B's git dir")
    parser.add_argument(
        "--ref", help="the suite's commit (default: the release's tag if mirrored, else HEAD)"
    )
    parser.add_argument("--e2b", default="2.63.0", help="the e2b release to test")
    parser.add_argument(
        "--cache", default=os.path.expanduser("~/.cache/sandboxd-e2b-suite"), type=Path
    )
    parser.add_argument("--isolated", action="store_true", help="the real isolation (root)")
    parser.add_argument("--timeout", default="120", help="pytest-timeout per test (s)")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's (default: tests)")
    args = parser.parse_args()
    if not args.mirror:
        parser.error("--mirror (or E2B_MIRROR): the git directory of a mirror of e2b-dev/E2B")
    args.cache.mkdir(parents=True, exist_ok=True)
    ref = args.ref or release_ref(args.mirror, args.e2b)
    print(f"e2b {args.e2b}, suite at {ref}", flush=True)
    suite = checkout(args.mirror, ref, args.cache)
    python = environment(args.cache, args.e2b)
    with tempfile.TemporaryDirectory(prefix="e2b-suite-") as scratch:
        tmp = Path(scratch)
        token = tmp / "token"
        token.write_text(TOKEN)
        token.chmod(0o600)
        port = free_port()
        options = [f"--e2b-listen=tcp:{port}:interface=127.0.0.1", f"--token-file={token}"]
        if not args.isolated:
            options.append("--isolation=none")
        daemon = start_daemon(tmp, *options)
        url = f"http://127.0.0.1:{port}"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("E2B_")},
            "E2B_API_URL": url,
            "E2B_SANDBOX_URL": url,
            "E2B_API_KEY": TOKEN,
            "NO_PROXY": "127.0.0.1,localhost",
        }
        isolation = "isolated" if args.isolated else "none"
        report = args.cache / f"junit-e2b-{args.e2b}-{isolation}.xml"
        command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        # A module of a suite not the release's own may import what the release lacks (2.63.0
        # and E2B's HEAD): it counts as one failure, and the rest of the suite still runs.
        command += ["--continue-on-collection-errors"]
        command += [f"--timeout={args.timeout}", f"--junitxml={report}"]
        command += args.pytest_args or ["tests"]
        try:
            subprocess.run(command, cwd=suite, env=env, check=False)
        finally:
            stop_daemon(daemon)
    counts, failed = failures(report)
    for name, message in failed:
        print(f"FAILED {name}: {message}")
    print(json.dumps({"e2b": args.e2b, "suite": ref, **counts, "report": str(report)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
