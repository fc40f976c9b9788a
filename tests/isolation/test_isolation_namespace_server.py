"""The namespace server's line protocol, against a stand-in server script (no root)."""

from pathlib import Path

from sandboxd.isolation.namespaces.server import NamespaceServer

SERVER = """#!/bin/sh
[ "$1" = namespace-server ] || exit 3
while IFS= read -r line; do
  case $line in
    *die*) exit 0 ;;
    *deaf*) exec 0<&-; printf '0\\tdeaf\\n'; exec cat /dev/zero ;;
    *) printf '0\\tgot %s\\n' "$line" ;;
  esac
done
"""


def server(tmp_path: Path) -> NamespaceServer:
    helper = tmp_path / "sandboxd-exec"
    helper.write_text(SERVER)
    helper.chmod(0o755)
    return NamespaceServer(str(helper), fallback=lambda argv: (7, " ".join(argv)))


def test_one_line_each_way_and_a_restart_after_it_died(tmp_path: Path) -> None:
    ns = server(tmp_path)
    helper = ns.helper
    assert ns([helper, "namespaces", "/r/.ns", "abc", "imn"]) == (0, "got /r/.ns\tabc\timn")
    assert ns([helper, "namespaces", "again"]) == (0, "got again")
    assert ns([helper, "namespaces", "die"]) == (125, "sandboxd-exec: the namespace server ended")
    assert ns([helper, "namespaces", "back"]) == (0, "got back")
    ns.close()
    ns.close()


def test_fields_that_would_break_the_line_are_refused(tmp_path: Path) -> None:
    ns = server(tmp_path)
    code, message = ns([ns.helper, "namespaces", "/a\tb"])
    assert code == 125 and "tab or a newline" in message


def test_anything_else_runs_as_a_program(tmp_path: Path) -> None:
    ns = server(tmp_path)
    assert ns(["/bin/other", "x"]) == (7, "/bin/other x")
    assert ns([ns.helper, "enter"]) == (7, f"{ns.helper} enter")


def test_a_server_that_stopped_reading_is_restarted(tmp_path: Path) -> None:
    """A server alive but no longer reading its stdin: the next line cannot be written."""
    ns = server(tmp_path)
    helper = ns.helper
    assert ns([helper, "namespaces", "deaf"]) == (0, "deaf")
    assert ns([helper, "namespaces", "x"]) == (125, "sandboxd-exec: the namespace server ended")
    assert ns([helper, "namespaces", "back"]) == (0, "got back")
    ns.close()
