"""Every place the daemon starts a process, found in its code, and each held to the one chain
(issue 29; docs/isolation.rst, "The privilege-drop chain").

The daemon's sources are parsed (``ast``) for every call that starts a process (``spawnProcess``,
``subprocess``, ``Popen``, ``fork``, ``exec*``, ``posix_spawn``, ``system``...). Each such place
must be listed in :data:`SITES`: either it starts a process **as a sandbox**, and its argv comes
from :meth:`~sandboxd.isolation.sandbox.SandboxIsolation.start_argv` (the one chain: namespaces,
cgroup, uid/gid, ``no_new_privs``, seccomp), or it runs as the daemon (root), never as a
sandbox's uid, for the reason given. A new place fails this test until it is listed, and so
is judged. Then: ``start_argv`` is the only caller of ``wrap`` and ``Namespaces.enter``; no
other module drops privilege itself; and in the helper the filter follows the one privilege
drop. The kernel runs of each place that starts a sandbox's process are in
``tests/kernel/test_privdrop_chain.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sandboxd"

STARTS = re.compile(
    r"^(spawnProcess|_?popen|Popen|fork|forkpty|exec[lv]p?e?|posix_spawnp?|system)$"
)
"""Names of calls that start a process whatever they are called on."""
SUBPROCESS = re.compile(r"^(run|call|check_call|check_output|create_subprocess_\w+)$")
"""Names that start one when called on ``subprocess`` or ``asyncio``."""

AS_SANDBOX = "as a sandbox, argv from SandboxIsolation.start_argv"
SITES = {
    ("sandboxd/core/exec/run.py", "ExecRun.start"): AS_SANDBOX + " (commands: Commands._launch)",
    ("sandboxd/core/processes/terminal.py", "TerminalRun.start_terminal"): AS_SANDBOX
    + " (terminals: Commands._launch, with the helper's --ctty)",
    ("sandboxd/isolation/exec/spawn_server.py", "Spawner.spawnProcess"): AS_SANDBOX
    + " (the same argv, handed to the spawn server, which runs the helper's main path on it)",
    ("sandboxd/core/archive/rsync.py", "Rsync._spawn"): "root: the archive end; the workspace end"
    " is started by its remote shell, " + AS_SANDBOX + " (SandboxManager._workspace_end)",
    ("sandboxd/isolation/exec/spawn_server.py", "SpawnServer._running"): "root: the spawn server",
    ("sandboxd/isolation/namespaces/server.py", "NamespaceServer._started"): "root: makes"
    " namespaces, runs nothing of a sandbox's",
    ("sandboxd/core/fork.py", "copy_tree"): "root: cp -a of a sandbox's tree (frozen, links"
    " copied as links, never followed) into its fork's, which runs nothing yet",
    ("sandboxd/http/routes/sandboxes.py", "fork"): "none: the manager's fork of a sandbox's files"
    " (SandboxManager.fork), no process (the finder sees the name)",
    ("sandboxd/isolation/namespaces/pins.py", "run_program"): "root: makes namespaces (the shell"
    " chain's unshare), runs nothing of a sandbox's",
    ("sandboxd/isolation/network/egress_host.py", "run_program"): "root: ip and nft on the"
    " host side",
    ("sandboxd/isolation/network/egress_judge.py", "EgressJudge._spawn"): "root: the egress"
    " judge (sandboxd-judge), which reads queued packets; runs nothing of a sandbox's",
    ("sandboxd/isolation/exec/helper.py", "run_program"): "root: the helper's seccomp-check at"
    " start-up",
    ("sandboxd/isolation/exec/helper_build.py", "_run"): "the build: the C compiler",
    ("sandboxd/core/archive/store.py", "rsync_version"): "root: rsync --version at start-up",
    ("sandboxd/core/templates/sources.py", "_zstd"): "nobody under a root daemon: zstd -dc of"
    " an imported template archive (a decompressor on descriptors; nothing of the archive runs)",
    ("sandboxd/core/contexts/languages.py", "probe_kernels"): "the daemon's user:"
    " SANDBOXD_KERNEL_PYTHON asked, once, which kernels' modules it has (none imported)",
    ("sandboxd/core/contexts/shell_kernel.py", "Shell.__init__"): "the sandbox: the bash"
    " kernel's bash, started by the kernel inside the sandbox (never run by the daemon)",
    ("sandboxd/core/contexts/shell_kernel.py", "_sentinel"): "the sandbox: the bash kernel's"
    " sentinel sh in its bash's group, started by the kernel inside the sandbox (never run by"
    " the daemon)",
    ("sandboxd/core/templates/builder.py", "Build._spawn"): "root: a template build's RUN"
    " runner (build_runner.py), never a sandbox's uid: uid 0 of a user namespace of its own"
    ' in the template being built (docs/extensions.rst, "Building a template"), or the'
    " runner's --host mode for FROM debian's mmdebstrap",
    ("sandboxd/core/templates/build_runner.py", "command"): "root of the build's user"
    " namespace: the RUN command, in the template's root (pivot_root), no sandbox's uid",
    ("sandboxd/core/templates/build_runner.py", "main"): "root: the RUN runner forks the"
    " namespaces' maker (and exits with the command's status)",
    ("sandboxd/core/templates/build_runner.py", "on_the_host"): "root: FROM debian's"
    " mmdebstrap (the daemon's own argv, never a sandbox's), in the build's cgroup and a mount"
    " namespace of its own",
    ("sandboxd/core/templates/build_files.py", "copy_base"): "root: cp -a of a template's"
    " files (FROM) into the build's directory; runs nothing of the template's",
}
"""Every place that starts a process: what it starts, and as whom."""

START_ARGV_CALLERS = {
    ("sandboxd/core/commands.py", "Commands._launch"),
    ("sandboxd/core/manager.py", "SandboxManager._workspace_end.start"),
    ("sandboxd/isolation/sandbox.py", "SandboxIsolation.zygote"),
}
"""Where an argv to run as a sandbox is made: commands, the archive's rsync end, and the
sandbox's zygote (its execs' chain, which it takes once for them)."""


def _calls(path: Path) -> list[tuple[str, ast.Call]]:
    """Every call in ``path``, with the qualified name of the function around it."""
    found: list[tuple[str, ast.Call]] = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, (*scope, child.name))
                continue
            if isinstance(child, ast.Call):
                found.append((".".join(scope), child))
            visit(child, scope)

    visit(ast.parse(path.read_text()), ())
    return found


def _name(call: ast.Call) -> tuple[str, str]:
    """``(what it is called on, the name called)`` (``""`` on a bare name)."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return ast.unparse(func.value), func.attr
    if isinstance(func, ast.Name):
        return "", func.id
    return "", ""


def _starts_a_process(call: ast.Call) -> bool:
    base, name = _name(call)
    if base in ("subprocess", "asyncio") and SUBPROCESS.match(name):
        return True
    return bool(STARTS.match(name)) and base not in ("re", "self.process", "self._process")


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _where(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_every_place_that_starts_a_process_is_listed_and_judged() -> None:
    found = {
        (_where(path), scope)
        for path in _modules()
        for scope, call in _calls(path)
        if _starts_a_process(call)
    }
    assert found == set(SITES), "a place that starts a process, not judged in SITES"


def test_the_finder_sees_every_way_of_starting_a_process(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os, subprocess\n"
        "def a(reactor, p):\n"
        "    reactor.spawnProcess(p, 'x', ['x'])\n"
        "    subprocess.run(['x']); subprocess.check_output(['x']); subprocess.Popen(['x'])\n"
        "    os.fork(); os.execvpe('x', ['x'], {}); os.posix_spawn('x', ['x'], {})\n"
        "    os.system('x'); self._popen(['x'])\n"
        "    re.fork(); other.run(); self.process.fork()\n"
    )
    names = [_name(call)[1] for _, call in _calls(sample) if _starts_a_process(call)]
    assert names == [
        *("spawnProcess", "run", "check_output", "Popen"),
        *("fork", "execvpe", "posix_spawn", "system", "_popen"),
    ]


def _calls_named(name: str, on: str | None = None) -> set[tuple[str, str]]:
    places = set()
    for path in _modules():
        for scope, call in _calls(path):
            base, called = _name(call)
            if called == name and (on is None or base.endswith(on)):
                places.add((_where(path), scope))
    return places


def test_argvs_to_run_as_a_sandbox_are_made_by_the_one_chain_alone() -> None:
    assert _calls_named("start_argv") == START_ARGV_CALLERS
    only_the_chain = {("sandboxd/isolation/sandbox.py", "SandboxIsolation.start_argv")}
    assert _calls_named("wrap", on="isolation") == set()
    assert {p for p in _calls_named("wrap") if "namespaces" not in p[0]} == only_the_chain
    assert _calls_named("enter", on="namespaces") == only_the_chain


DROPS = re.compile(r"setpriv|nsenter|setres[ug]id|\bset[ug]id\(|--reuid|no.new.privs", re.I)
DROPPING_MODULES = {
    "sandboxd/isolation/exec/wrapper.py",  # the shell chain (where the helper was not built)
    "sandboxd/isolation/exec/privdrop.py",  # its steps, specified once
    "sandboxd/isolation/namespaces/shell.py",  # the shell chain's nsenter
    "sandboxd/isolation/select.py",  # finds the programs; no drop of its own
    # A thread of the daemon takes a sandbox's effective uid for one inotify_init1, so that the
    # sandbox's uid pays for its watches; no process starts, real and saved uids stay root's.
    "sandboxd/core/watch/charge.py",
    # A template build's RUN takes uid 0 of the user namespace it made (the host's ids mapped
    # to themselves): the build runs as root by design, never as a sandbox's uid.
    "sandboxd/core/templates/build_runner.py",
}


@pytest.mark.parametrize("path", _modules(), ids=_where)
def test_no_other_module_drops_privilege_itself(path: Path) -> None:
    code = "\n".join(
        line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
    )
    if _where(path) in DROPPING_MODULES:
        return
    words = {match.group(0) for match in DROPS.finditer(_code_only(code))}
    assert not words, f"{_where(path)} drops privilege outside the chain: {sorted(words)}"


def _code_only(text: str) -> str:
    """``text`` without its docstrings and comments (what runs, not what is said)."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                body[0] = ast.Pass()
    return ast.unparse(tree)


HELPER_SOURCES = sorted((PACKAGE / "isolation" / "exec").glob("sandboxd_*.[ch]"))


def test_the_helper_drops_privilege_once_and_filters_right_after() -> None:
    text = {path.name: path.read_text() for path in HELPER_SOURCES}
    uses = {name: re.findall(r"\bset(?:res|re|e)?[ug]id\s*\(", body) for name, body in text.items()}
    assert {name: n for name, n in uses.items() if n} == {
        "sandboxd_exec.c": ["setresgid(", "setresuid("]
    }
    main = text["sandboxd_exec.c"]
    assert main.count("drop_privilege(uid, gid);") == 1
    assert re.search(
        r"drop_privilege\(uid, gid\);\s*if \(options\.seccomp\)\s*apply_seccomp\(\);\s*"
        r"if \(zygote_mode\)\s*return serve_zygote\(\);\s*"  # the same steps, then a fork each
        r"return run\(cwd, argv \+ 6 \+ procs, 1, options\.umask, options\.no_ptrace\);",
        main,
    )
