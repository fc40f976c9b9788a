"""``sandboxctl``: in-process through ``cli.run``, and as a real process through ``main``."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue

from sandboxd_client import HttpSandbox, Socks5, Socks5TLS, encode_handle
from sandboxd_client.cli import Console, main_async, parse_args, run
from sandboxd_client.cli._progress import MIB
from sandboxd_client.cli._rules import rules_of
from sandboxd_client.cli._socks5 import socks5_of
from tests.support.coverage import coverage_env

from .servers import Served

REPO = str(Path(__file__).resolve().parents[2])


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


async def ctl(client: HttpSandbox, *argv: str, tty: bool = False) -> tuple[int, bytes, str]:
    out, err = io.BytesIO(), FakeTTY() if tty else io.StringIO()
    code = await run(client, parse_args(list(argv)), Console(out, err))
    return code, out.getvalue(), err.getvalue()


def test_parser_keeps_the_command_after_the_separator() -> None:
    args = parse_args(["exec", "H", "--env", "A=1", "--", "ls", "-l", "--", "--json"])
    assert args.cmd == ["ls", "-l", "--", "--json"] and args.env == [("A", "1")]
    assert args.json is False
    assert parse_args(["exec", "H", "echo", "hi"]).cmd == ["echo", "hi"]
    # In another command, -- is argparse's own: what follows is positional, options or not.
    removed = parse_args(["rm", "H", "--", "-rf"])
    assert (removed.path, removed.recursive) == ("-rf", False)
    put = parse_args(["--url", "http://h:1", "put", "H", "--", "-local-", "-remote-"])
    assert (put.url, put.local, put.remote) == ("http://h:1", "-local-", "-remote-")
    assert parse_args(["--json", "ls", "H", "--", "-d"]).root == "-d"
    assert parse_args(["--url", "u", "exec", "H", "--", "-x"]).cmd == ["-x"]
    with pytest.raises(SystemExit):
        parse_args(["--json", "--"])  # no command at all: usage
    assert parse_args(["ls", "H", "--json"]).json is True
    assert parse_args(["--json", "ls", "H"]).json is True
    with pytest.raises(SystemExit):
        parse_args(["create", "--env", "novalue"])


@pytest_twisted.ensureDeferred
async def test_commands_in_process(client: HttpSandbox, fake: Served, tmp_path: Path) -> None:
    code, out, _ = await ctl(client, "create", "--image", "py", "--env", "A=1")
    handle = out.decode().strip()
    assert code == 0 and json.loads(fake.state.seen[-1].body) == {"image": "py", "env": {"A": "1"}}
    code, other, _ = await ctl(client, "create", "--network", "none")
    assert code == 0 and json.loads(fake.state.seen[-1].body) == {"network": "none"}
    code, policed, _ = await ctl(client, "create", "--allow", "192.0.2.0/24", "--deny", "192.0.2.9")
    assert code == 0 and json.loads(fake.state.seen[-1].body) == {
        "network": {"mode": "egress", "allow_out": ["192.0.2.0/24"], "deny_out": ["192.0.2.9"]}
    }
    assert (await ctl(client, "kill", policed.decode().strip()))[0] == 0
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps({"b.example": {"X-Key": "from-file"}}))
    os.environ["SANDBOXD_TEST_RULE"] = "from-env"
    try:
        code, ruled, _ = await ctl(
            client,
            "create",
            "--rule",
            "a.example:X-Plain=literal=1",
            "--rule-env",
            "a.example:Authorization=SANDBOXD_TEST_RULE",
            "--rules-file",
            str(rules_file),
        )
    finally:
        del os.environ["SANDBOXD_TEST_RULE"]
    assert code == 0 and json.loads(fake.state.seen[-1].body)["network"]["rules"] == {
        "a.example": [{"headers": {"X-Plain": "literal=1", "Authorization": "from-env"}}],
        "b.example": [{"headers": {"X-Key": "from-file"}}],
    }
    assert (await ctl(client, "kill", ruled.decode().strip()))[0] == 0
    assert (await ctl(client, "kill", other.decode().strip()))[0] == 0
    code, out, _ = await ctl(client, "exec", handle, "--", "both")
    assert code == 3 and out == b"to stdout\nto stderr\n"
    code, out, _ = await ctl(client, "--json", "exec", handle, "--", "echo", "hi")
    assert code == 0
    assert json.loads(out) == {"exit_code": 0, "stdout": "hi\n", "stderr": "", "truncated": False}

    big = tmp_path / "big"
    big.write_bytes(os.urandom(2 * MIB + 3))
    code, _, err = await ctl(client, "put", handle, str(big), "dir/big", tty=True)
    assert code == 0 and "100%" in err and "\n" in err
    assert "2.0/2.0 MiB" in err and "/s" in err  # bytes and rate (and an ETA column)
    code, _, err = await ctl(client, "get", handle, "dir/big", str(tmp_path / "back"), tty=True)
    assert "100%" in err and (tmp_path / "back").read_bytes() == big.read_bytes()
    small = tmp_path / "small"
    small.write_bytes(b"tiny")
    _, _, err = await ctl(client, "put", handle, str(small), "small", tty=True)
    assert err == ""  # no bar for small files
    _, _, err = await ctl(client, "get", handle, "dir/big", str(tmp_path / "quiet"))
    assert err == ""  # no bar off a terminal

    _, out, _ = await ctl(client, "ls", handle)
    assert out.decode().split() == [str(2 * MIB + 3), "dir/big", "4", "small"]
    _, out, _ = await ctl(client, "ls", handle, "dir", "--json")
    assert [e["path"] for e in json.loads(out)] == ["dir/big"]
    assert (await ctl(client, "rm", handle, "small"))[0] == 0
    assert (await ctl(client, "rm", "-r", handle, "dir", "--json"))[1] == b'{"ok": true}\n'
    assert await client.walk(handle) == []
    assert (await ctl(client, "ls", handle))[1:] == (b"", "no files under /\n")
    _, out, _ = await ctl(client, "list", "--json")
    assert [s["remote_id"] for s in json.loads(out)] == ["sb-1"]
    _, out, _ = await ctl(client, "health")
    assert out.decode().split() == ["ok", "fake-1", "auth"]
    assert (await ctl(client, "kill", handle))[0] == 0
    assert (await ctl(client, "list"))[1] == b""


async def ctl_main(*argv: str, env: dict[str, str] | None = None) -> tuple[int, bytes, str]:
    """``main_async`` in this process: argument parsing, defaults, error lines, exit codes."""
    out, err = io.BytesIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in ("SANDBOXD_URL", "SANDBOXD_TOKEN_FILE")}
    os.environ.update(env or {})
    try:
        code = await main_async(reactor, list(argv), Console(out, err))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return code, out.getvalue(), err.getvalue()


@pytest_twisted.ensureDeferred
async def test_errors_are_one_line_with_an_exit_code(fake: Served, tmp_path: Path) -> None:
    code, out, err = await ctl_main("create", env={"SANDBOXD_URL": fake.lb_url})
    assert (code, err) == (0, "")
    handle = out.decode().strip()
    code, out, err = await ctl_main("exec", "not/a-handle", "--", "true")
    assert code == 125 and out == b""
    assert err.startswith("sandboxctl: ValueError: malformed sandbox handle or id")
    assert err.count("\n") == 1
    for blank in ("", "   ", "a b"):  # an unset $H, a pasted blank: never sent as an id
        code, out, err = await ctl_main("--url", fake.lb_url, "exec", blank, "--", "true")
        assert (code, out) == (125, b"")
        assert err == (
            f"sandboxctl: ValueError: malformed sandbox handle or id {blank!r}: give what create"
            " prints, or an id as list prints it\n"
        )
    code, _, err = await ctl_main("--url", fake.lb_url, "exec", handle)
    assert code == 125 and err.startswith("sandboxctl: ValueError: exec needs a command")
    code, _, err = await ctl_main("kill", encode_handle(fake.pod_url, "nope").id)
    assert code == 1 and err.startswith("sandboxctl: SandboxNotFound: ")
    code, _, err = await ctl_main("get", handle, "missing", str(tmp_path / "x"))
    assert code == 1 and err.startswith("sandboxctl: FileNotFoundError: ")
    code, _, err = await ctl_main("--url", "ftp://x", "health")
    assert code == 1 and err.startswith("sandboxctl: ValueError: URL 'ftp://x' must be")


@pytest_twisted.ensureDeferred
async def test_token_file_and_unreachable_service(
    fake: Served, tmp_path: Path, closed_port: int
) -> None:
    fake.state.token = "t0k"
    token = tmp_path / "token"
    token.write_text("t0k\n")
    code, _, err = await ctl_main("--url", fake.lb_url, "create")
    assert code == 1 and err.startswith("sandboxctl: PermissionError: ")
    code, out, _ = await ctl_main("--url", fake.lb_url, "--token-file", str(token), "create")
    assert code == 0
    env = {"SANDBOXD_URL": fake.lb_url, "SANDBOXD_TOKEN_FILE": str(token)}
    code, out, _ = await ctl_main("--json", "list", env=env)
    assert code == 0 and len(json.loads(out)) == 1
    code, _, err = await ctl_main("--url", f"http://127.0.0.1:{closed_port}", "health")
    assert code == 1 and err.startswith("sandboxctl: SandboxUnavailable: ")
    code, _, err = await ctl_main("--token-file", str(tmp_path / "none"), "health")
    assert code == 1 and err.startswith("sandboxctl: FileNotFoundError: ")


async def sandboxctl(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``python -m sandboxd_client.cli`` as its own process."""
    full_env = {
        **coverage_env(),
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": REPO,
        **(env or {}),
    }
    # stdin from /dev/null: a pipe (getProcessOutputAndValue's, never closed) is stdin that
    # exec would stream to the command, waiting for its EOF (as docker exec -i would).
    script = 'exec "$@" </dev/null'
    out, err, code = await getProcessOutputAndValue(
        "/bin/sh",
        ["-c", script, "sh", sys.executable, "-m", "sandboxd_client.cli", *argv],
        env=full_env,
        path=REPO,
    )
    return code, out.decode(), err.decode()


@pytest_twisted.ensureDeferred
async def test_the_real_command_exits_like_the_command(client: HttpSandbox, fake: Served) -> None:
    handle = (await client.create()).id
    code, out, err = await sandboxctl("--url", fake.lb_url, "exec", handle, "--", "both")
    assert (code, out, err) == (3, "to stdout\nto stderr\n", "")


def test_mcp_without_the_extra_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxd_client.cli import _commands

    for name in list(sys.modules):  # as if the SDK had never been installed nor imported
        if name.startswith("sandboxd_client.mcp_server"):
            monkeypatch.delitem(sys.modules, name)
        elif name.split(".")[0] in ("mcp", "mcp_types"):
            monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "mcp", None)  # type: ignore[arg-type]
    err = io.StringIO()
    assert _commands.mcp(parse_args(["mcp"]), err) == 1
    assert "pip install 'sandboxd-client[mcp]'" in err.getvalue()


def test_mcp_other_import_failures_are_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxd_client.cli import _commands

    monkeypatch.setitem(sys.modules, "sandboxd_client.mcp_server", None)
    with pytest.raises(ImportError):
        _commands.mcp(parse_args(["mcp"]), io.StringIO())


def test_help_imports_neither_twisted_nor_the_client() -> None:
    """``sandboxctl --help`` is cheap: the client's modules load only for a real command."""
    probe = (
        "import sys\n"
        "from sandboxd_client.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('twisted', 'treq', 'attr')\n"
        "               or m.startswith('sandboxd_client._'))\n"
        "print(heavy, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": REPO, "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        check=True,
        timeout=60,
    )
    assert b"usage: sandboxctl" in done.stdout
    assert done.stderr == b"[]\n"
    from sandboxd_client import HttpSandbox as Again  # the lazy names still resolve

    assert Again is HttpSandbox
    with pytest.raises(AttributeError):
        import sandboxd_client

        _ = sandboxd_client.NoSuchName  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        import sandboxd_client.cli

        _ = sandboxd_client.cli.NoSuchName  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("argv", "cmd", "options"),
    [
        (["exec", "H", "ls", "-la"], ["ls", "-la"], {}),
        (["exec", "H", "sh", "-c", "echo --cwd"], ["sh", "-c", "echo --cwd"], {"cwd": None}),
        (["--json", "exec", "--cwd", "d", "H", "ls"], ["ls"], {"cwd": "d", "json": True}),
        (["exec", "H", "--cwd=d", "--env", "A=1", "ls"], ["ls"], {"cwd": "d", "env": [("A", "1")]}),
        (["exec", "H", "-i", "cat", "-"], ["cat", "-"], {"stdin": True}),
        (["exec", "H", "-"], ["-"], {}),
        (["--url", "http://h:1", "exec", "H", "x"], ["x"], {"url": "http://h:1"}),
        (["exec", "H"], [], {}),
        (["run", "-d", "H", "--tag", "t", "sleep", "1"], ["sleep", "1"], {"tag": "t"}),
        (["exec", "H", "--", "-x", "--", "y"], ["-x", "--", "y"], {}),
    ],
)
def test_the_command_starts_at_the_first_word_after_the_handle(
    argv: list[str], cmd: list[str], options: dict[str, object]
) -> None:
    args = parse_args(argv)
    assert args.handle == "H" and args.cmd == cmd
    for name, value in options.items():
        assert getattr(args, name) == value


def test_list_shows_human_times() -> None:
    from sandboxd_client.cli._commands import ago

    now = 1_000_000.0
    assert [ago(now, now - s) for s in (0, 59, 61, 7200, 3 * 86400)] == [
        "0s ago",
        "59s ago",
        "1m ago",
        "2h ago",
        "3d ago",
    ]
    assert ago(now, now + 5) == "0s ago"  # a clock a little ahead
    assert ago(now, None) == ago(now, "2026-12-01") == ago(now, True) == "-"


def test_rule_options_say_what_is_wrong_never_the_value(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_args(["create", "--rule", "a.example=X"])  # no header
    assert rules_of([], [], None, {}) == {}
    with pytest.raises(ValueError, match=r"--rule-env a\.example:X: the environment has no V"):
        rules_of([], [("a.example", "X", "V")], None, {})
    bad = tmp_path / "rules.json"
    for text in ("not json s3cret", '{"a.example": {"X": 1}}', '{"a.example": "s3cret"}', "[]"):
        bad.write_text(text)
        with pytest.raises(ValueError, match="expected a JSON object") as caught:
            rules_of([], [], str(bad), {})
        assert "s3cret" not in str(caught.value)


@pytest_twisted.ensureDeferred
async def test_create_sends_a_socks5_proxy_whose_password_is_not_on_the_command_line(
    client: HttpSandbox, fake: Served, tmp_path: Path
) -> None:
    secret = tmp_path / "password"
    secret.write_text("pw-from-file\n")
    code, out, _ = await ctl(
        client,
        "create",
        "--socks5",
        "203.0.113.80:1080",
        "--socks5-user",
        "me",
        "--socks5-password-file",
        str(secret),
    )
    assert code == 0 and json.loads(fake.state.seen[-1].body)["network"] == {
        "mode": "egress",
        "deny_out": [],
        "socks5": {"address": "203.0.113.80:1080", "username": "me", "password": "pw-from-file"},
    }
    assert (await ctl(client, "kill", out.decode().strip()))[0] == 0
    os.environ["SANDBOXD_TEST_SOCKS5"] = "pw-from-env"
    try:
        argv = ["create", "--socks5", "203.0.113.80:1", "--socks5-user", "me", "--socks5-tls"]
        code, out, _ = await ctl(client, *argv, "--socks5-password-env", "SANDBOXD_TEST_SOCKS5")
    finally:
        del os.environ["SANDBOXD_TEST_SOCKS5"]
    assert code == 0 and json.loads(fake.state.seen[-1].body)["network"]["socks5"] == {
        "address": "203.0.113.80:1",
        "username": "me",
        "password": "pw-from-env",
        "tls": True,
    }
    assert (await ctl(client, "kill", out.decode().strip()))[0] == 0
    seen = len(fake.state.seen)
    with pytest.raises(ValueError, match="need --socks5"):
        await ctl(client, "create", "--socks5-user", "me")
    assert len(fake.state.seen) == seen  # nothing sent


PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest_twisted.ensureDeferred
async def test_create_sends_the_socks5_proxys_tls_server_name_and_ca_file(
    client: HttpSandbox, fake: Served, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text(PEM)
    argv = ["create", "--socks5", "203.0.113.80:1", "--socks5-tls-server-name", "proxy.example"]
    code, out, _ = await ctl(client, *argv, "--socks5-ca-file", str(ca))
    assert code == 0 and json.loads(fake.state.seen[-1].body)["network"]["socks5"] == {
        "address": "203.0.113.80:1",
        "tls": {"enabled": True, "server_name": "proxy.example", "ca_cert": PEM},
    }
    assert (await ctl(client, "kill", out.decode().strip()))[0] == 0
    seen = len(fake.state.seen)
    with pytest.raises(ValueError, match=r"--socks5-ca-file .*missing\.pem: cannot read it"):
        await ctl(client, *argv, "--socks5-ca-file", str(tmp_path / "missing.pem"))
    assert len(fake.state.seen) == seen  # nothing sent


def test_socks5_tls_options_imply_tls_and_check_the_ca_file(tmp_path: Path) -> None:
    ca, not_pem, binary = tmp_path / "ca.pem", tmp_path / "key.txt", tmp_path / "ca.der"
    ca.write_text(PEM)
    not_pem.write_text("not a certificate")
    binary.write_bytes(b"\x30\x82\xff\xfe")
    named = socks5_of("192.0.2.1:1", None, None, None, False, {}, "proxy.example")
    assert named == Socks5("192.0.2.1:1", tls=Socks5TLS("proxy.example"))
    own_ca = socks5_of("192.0.2.1:1", None, None, None, True, {}, None, str(ca))
    assert own_ca == Socks5("192.0.2.1:1", tls=Socks5TLS(ca_cert=PEM))
    with pytest.raises(ValueError, match="need --socks5"):
        socks5_of(None, None, None, None, False, {}, "proxy.example")
    with pytest.raises(ValueError, match="need --socks5"):
        socks5_of(None, None, None, None, False, {}, None, str(ca))
    with pytest.raises(ValueError, match="holds no PEM certificate"):
        socks5_of("192.0.2.1:1", None, None, None, False, {}, None, str(not_pem))
    for unreadable in (binary, tmp_path / "missing.pem"):
        with pytest.raises(
            ValueError, match=re.escape(f"--socks5-ca-file {unreadable}: cannot read it")
        ):
            socks5_of("192.0.2.1:1", None, None, None, False, {}, None, str(unreadable))


def test_socks5_options_say_what_is_wrong_never_the_password(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):  # one source of the password
        parse_args(["create", "--socks5-password-env", "A", "--socks5-password-file", "f"])
    assert socks5_of(None, None, None, None, False, {}) is None
    assert socks5_of("192.0.2.1:1", None, None, None, False, {}) == Socks5("192.0.2.1:1")
    with pytest.raises(ValueError, match="need --socks5"):
        socks5_of(None, "u", None, None, False, {})
    with pytest.raises(ValueError, match="need --socks5"):
        socks5_of(None, None, "V", None, False, {})
    with pytest.raises(ValueError, match="need --socks5"):
        socks5_of(None, None, None, "f", False, {})
    with pytest.raises(ValueError, match="need --socks5"):
        socks5_of(None, None, None, None, True, {})
    with pytest.raises(ValueError, match="--socks5-password-env: the environment has no V"):
        socks5_of("192.0.2.1:1", "u", "V", None, False, {})
    empty = tmp_path / "empty"
    empty.write_text("\ns3cret on the second line\n")
    with pytest.raises(ValueError, match="its first line is empty") as caught:
        socks5_of("192.0.2.1:1", "u", None, str(empty), False, {})
    assert "s3cret" not in str(caught.value)
