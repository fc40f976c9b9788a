"""sandboxd's benchmark: every figure of issues 9 and 20 beside its references, in one run.

    python bench/run.py            # the issue's sizes (a few minutes; as root for isolated rows)
    python bench/run.py --quick    # tiny sizes, well under a minute (CI: the harness works)

References, measured in the same run: the floor (spawning ``/bin/true`` directly, and through
the daemon's own cgroup-join + setpriv wrapper; HTTP round trips; pipe and copy throughput;
walking the tree in-process); the peer SWE-ReX's ``swerex-remote`` (installed on first use
into ``bench/.venv-swerex``); and Docker (the ``docker`` section, ``sbench.versus``): a dockerd
of the bench's own from Debian's ``docker.io`` and an image imported from a debootstrap rootfs,
installed and cached by a full run, used by a quick run only when cached; where Docker cannot
run, one note says why and its rows are skipped. sandboxd runs as ``twistd -n sandboxd`` on
loopback, isolated (root, cgroups; skipped when not root) and ``--isolation=none``, driven by
its own client ``HttpSandbox`` ("client" rows) and by the plain ``http.client`` connection that
also drives the peers ("raw" rows). Where a mirror of e2b-dev/E2B is given (``--e2b-mirror`` or
``E2B_MIRROR``), a full run also runs E2B's own SDK suite against the E2B front, once per SDK
release (``e2b_suite``: ``bench/e2b_suite.py``; tests passed per release).

Prints a table and writes ``bench/results/<time>.json`` (and ``latest.json``; a ``--quick`` run:
``<time>-quick.json`` and ``latest-quick.json``, with no target judged; an ``--only`` run:
``<time>-partial.json`` alone). Exits 0 when every section ran, whatever the figures; 1 when a
section could not run.
"""

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from twisted.internet.defer import Deferred  # noqa: E402
from twisted.internet.task import react  # noqa: E402

from bench.sbench import dockerd, figures, floor, procs, report  # noqa: E402
from bench.sbench.rawhttp import RawHTTP  # noqa: E402

SECTIONS = (
    "latency",
    "idle",
    "streaming",
    "transfers",
    "walk",
    "concurrent",
    "docker",
    "neighbours",
    "terminals",
    "density",
    "bursts",
    "templates",
    "e2b_suite",
    "contexts",
    "egress",
)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI)")
    parser.add_argument("--no-peer", action="store_true", help="skip SWE-ReX")
    parser.add_argument("--no-docker", action="store_true", help="skip Docker's rows")
    parser.add_argument("--no-isolated", action="store_true", help="skip the isolated daemon")
    parser.add_argument(
        "--only", action="append", choices=SECTIONS, help="run only this section (repeatable)"
    )
    parser.add_argument(
        "--spawner",
        choices=("zygote", "server", "helper"),
        default="zygote",
        help="how the isolated daemon starts execs (SANDBOXD_SPAWNER; default zygote, the"
        " daemon's own default)",
    )
    parser.add_argument(
        "--e2b-mirror",
        default=os.environ.get("E2B_MIRROR"),
        help="git directory of a mirror of e2b-dev/E2B: E2B's own suite runs (E2B_MIRROR)",
    )
    parser.add_argument("--out", type=Path, default=BENCH / "results", help="JSON directory")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override one size (see sbench.figures.Sizes), e.g. --set stream_bytes=67108864",
    )
    return parser.parse_args(argv)


def git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(BENCH.parent), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def start_docker(
    args: argparse.Namespace, workdir: Path, notes: list[str], meta: dict[str, Any]
) -> dockerd.Dockerd | None:
    """The bench's own dockerd with the image (a full run installs and imports them first);
    ``None``, with one note saying why, where Docker cannot run."""
    why = "--no-docker" if args.no_docker else dockerd.unavailable(setup=not args.quick)
    daemon = None
    if why is None:
        daemon = dockerd.Dockerd(workdir)
        try:
            daemon.start()
            daemon.ensure_image(setup=not args.quick)
            daemon.remove_all()
        except Exception as e:
            stop_docker(daemon)
            daemon = None
            why = f"dockerd could not run: {str(e).strip().splitlines()[0][:300]}"
    if daemon is None:
        line = f"Docker rows skipped: {why}"
        print(f"bench: {line}", file=sys.stderr, flush=True)
        notes.append(line)
        return None
    meta["docker"] = f"docker {daemon.version} (dockerd, Engine API {daemon.api}), {dockerd.IMAGE}"
    return daemon


def stop_docker(daemon: dockerd.Dockerd) -> None:
    """Remove the bench's containers and stop its dockerd (by pid)."""
    if daemon.process is not None and daemon.process.poll() is None:
        try:
            daemon.remove_all()
        except Exception:
            traceback.print_exc()
    daemon.stop()


async def run(reactor: Any, args: argparse.Namespace) -> int:
    sizes = figures.Sizes(args.quick)
    for setting in args.set:
        name, _, value = setting.partition("=")
        if not hasattr(sizes, name):
            raise SystemExit(f"bench: --set {setting}: no size named {name!r}")
        setattr(sizes, name, type(getattr(sizes, name))(value))
    root = os.geteuid() == 0
    isolated = root and not args.no_isolated
    meta: dict[str, Any] = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "revision": git_revision(),
        "host": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "root": root,
        "loadavg_start": procs.loadavg(),
        "sizes": dict(vars(sizes)),
        "sections": args.only or [],
        "spawner": args.spawner,
    }
    workdir = Path(tempfile.mkdtemp(prefix="sandboxd-bench-"))
    os.chmod(workdir, 0o755)
    bench = figures.Bench(reactor, sizes, workdir)
    bench.e2b_mirror = args.e2b_mirror
    servers: list[procs.Server] = []
    failed: list[str] = []
    started = time.monotonic()
    try:
        bench.floors = floor.Floors(reactor, isolated, procs.FLOOR_UID)
        if not isolated:
            why = "--no-isolated" if root else "not root"
            bench.notes.append(f"isolated rows and the wrapper floor skipped ({why})")
        labels = (["isolated"] if isolated else []) + ["none"]
        for label in labels:
            settings = {"SANDBOXD_SPAWNER": args.spawner} if label == "isolated" else None
            server = procs.start_sandboxd(label, label == "isolated", workdir, settings)
            servers.append(server)
            bench.daemons[label] = figures.Sandboxd(label, server, reactor)
            await bench.daemons[label].open()
        if not args.no_peer:
            program = procs.swerex_program(setup=True)
            if program is None:
                bench.notes.append("peer skipped: SWE-ReX could not be installed")
            else:
                peer = procs.start_swerex(program, workdir)
                servers.append(peer)
                bench.peer_server = peer
                bench.peer = RawHTTP(peer.port, peer.headers)
                meta["peer"] = f"swe-rex {procs.swerex_version()} (swerex-remote, uvicorn)"
        if "docker" in (args.only or SECTIONS):
            bench.dockerd = start_docker(args, workdir, bench.notes, meta)
        meta["servers"] = [procs.describe(s) for s in servers]
        for section in args.only or SECTIONS:
            print(f"bench: {section} ...", file=sys.stderr, flush=True)
            began = time.monotonic()
            try:
                # The set-up above (daemons, SWE-ReX's venv) blocks the reactor for long enough
                # that the server closes the client's idle pooled connection (after 60 s); the
                # pool must see that before the section's first call reuses it.
                await bench.settle()
                await getattr(bench, section)()
            except Exception:
                traceback.print_exc()
                if section == "docker" and args.quick:
                    # The peer, not sandboxd: a quick run (CI) notes it and goes on.
                    bench.notes.append(f"Docker rows failed: {traceback.format_exc(limit=1)}")
                else:
                    failed.append(section)
                    bench.notes.append(f"section {section} failed: {traceback.format_exc(limit=3)}")
            meta.setdefault("section_seconds", {})[section] = round(time.monotonic() - began, 1)
    finally:
        for d in bench.daemons.values():
            try:
                await d.close()
            except Exception:
                traceback.print_exc()
        if bench.peer is not None:
            bench.peer.close()
        for server in servers:
            server.stop()
        if bench.dockerd is not None:
            stop_docker(bench.dockerd)
        if bench.floors is not None:
            await bench.floors.close()
        if failed:
            print(f"bench: logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    meta["loadavg_end"] = procs.loadavg()
    meta["seconds"] = round(time.monotonic() - started, 1)
    result = {"meta": meta, "rows": bench.rows, "notes": bench.notes}
    print(report.table(result))
    path = report.write(result, args.out)
    print(f"\nwritten: {path}")
    return 1 if failed else 0


def main() -> None:
    args = parse(sys.argv[1:])
    code: list[int] = []

    async def body(reactor: Any) -> None:
        code.append(await run(reactor, args))

    try:
        react(lambda reactor: Deferred.fromCoroutine(body(reactor)))
    except SystemExit as e:
        if e.code not in (0, None) or not code:
            raise
    sys.exit(code[0] if code else 1)


if __name__ == "__main__":
    main()
