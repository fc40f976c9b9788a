"""Header rules over HTTPS through the daemon (docs/isolation.rst, "Header rules over HTTPS"):
a real ``twistd sandboxd`` as root, its upstreams verified against the test CA
(``SANDBOXD_EGRESS_UPSTREAM_CA``), HTTPS servers that record each request's headers in an
"internet" of the test's own (a namespace behind a veth, a DNS server the proxy resolves with).

A sandbox with a rule reaches its name over HTTPS with curl and with Python's default trust,
the upstream seeing the rule's header; the value is in none of its environment, files or
memory. Only that sandbox trusts the daemon's CA: a sandbox without a rule refuses a server
showing one of its leaves (a MITM); one given a rule live trusts it from then on (its bundle
rewritten in place). An upstream whose certificate does not verify is refused;
a name without a rule is still spliced (its certificate the upstream's own).
"""

import hashlib
import json
import os
import signal
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from attrs import frozen
from cryptography.hazmat.primitives import serialization
from twisted.internet.task import Clock

from sandboxd.isolation.network.egress_ca import EgressCA
from sandboxd.isolation.network.egress_policy import TRUST_ENV
from tests.kernel.names_internet import NamesCA, NameServer
from tests.kernel.netns_helpers import EGRESS_MARKS, in_netns, scene
from tests.kernel.test_egress_daemon import exec_out
from tests.kernel.test_egress_names import created, refused_counts
from tests.kernel.test_egress_rules import HeaderRecorder, memory_holds
from tests.support.daemon import Daemon, start_daemon, stop_daemon
from tests.templates.archives import file
from tests.templates.rootfs import rootfs

pytestmark = EGRESS_MARKS

A4, B4, C4, DNS4, HOST4 = (
    "203.0.113.1",
    "203.0.113.2",
    "203.0.113.3",
    "203.0.113.53",
    "203.0.113.254",
)
API, PLAIN, OTHER, MITM = (
    "api.tls.example",
    "plain.tls.example",
    "other.tls.example",
    "mitm.tls.example",
)
ZONE = {API: [A4], PLAIN: [A4], OTHER: [B4], MITM: [C4]}
SECRET = "Bearer tls33-" + hashlib.sha256(str(os.getpid()).encode()).hexdigest()[:24]
TEMPLATE_BUNDLE = "etc/ssl/certs/ca-certificates.crt"
BASE = 493000 + os.getpid() % 1000 * 20


class TLSRecorder(HeaderRecorder):
    """:class:`HeaderRecorder` over TLS on ``address:443`` with ``context``."""

    def __init__(self, netns: str, address: str, context: ssl.SSLContext) -> None:
        def make() -> socket.socket:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, 443))
            s.listen(16)
            return s

        self.context = context
        self.sock = in_netns(netns, make)
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _answer(self, conn: socket.socket, peer: str) -> None:
        conn.settimeout(10)
        try:
            tls = self.context.wrap_socket(conn, server_side=True)
        except OSError:
            conn.close()
            return
        super()._answer(tls, peer)


CLIENT = r"""
import hashlib, json, os, signal, socket, ssl, sys
address, name, trust = sys.argv[1:4]
canary = ("canary-" + str(12345 * 7)).encode()  # made here: only this process's memory has it
try:
    context = ssl.create_default_context()  # the system's bundle, as the sandbox sees it
    context.set_alpn_protocols(["h2", "http/1.1"])
    if trust == "none":
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    s = socket.create_connection((address, 443), timeout=5)
    s = context.wrap_socket(s, server_hostname=name)
    der = s.getpeercert(binary_form=True)
    s.sendall(f"GET /0 HTTP/1.1\r\nHost: {name}\r\nAuthorization: mine\r\n\r\n".encode())
    status = s.recv(65536).split(b" ")[1].decode()
    out = {"status": status, "cert": hashlib.sha256(der).hexdigest()}
    out["alpn"] = s.selected_alpn_protocol()
except Exception as e:
    out = {"error": type(e).__name__ + ": " + str(e)[:300]}
print(json.dumps(out), flush=True)
if sys.argv[4:] == ["stop"]:  # held still while the host reads this process's memory
    os.kill(os.getpid(), signal.SIGSTOP)
"""


@frozen
class World:
    daemon: Daemon
    ca: NamesCA
    recorders: dict[str, TLSRecorder]
    ruled: str
    plain: str
    late: str
    """A sandbox created without a rule, given one live (test_a_rule_given_live_...)."""


def daemon_leaf(daemon: Daemon, name: str, directory: Path) -> ssl.SSLContext:
    """A server context showing a leaf for ``name`` of the daemon's own CA (a MITM's)."""
    clock = Clock()
    clock.advance(time.time())
    ca = EgressCA.of_root(str(daemon.root), clock)
    (directory / "leaf.pem").write_bytes(
        ca.leaf(name, clock.seconds()).public_bytes(serialization.Encoding.PEM)
    )
    (directory / "leaf.key").write_bytes(
        ca.leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "leaf.pem", directory / "leaf.key")
    return context


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One daemon, one "internet" (A4 and B4: the test CA's certificate for API and PLAIN; C4:
    a leaf of the daemon's CA for MITM), a sandbox with rules, one without."""
    tmp = tmp_path_factory.mktemp("rules-tls")
    ca = NamesCA([API, PLAIN])
    (tmp / "upstream-ca.pem").write_text(ca.pem)
    servers: list[Any] = []
    with scene() as s:
        inet = s.netns("inet")
        s.wire("r", inet, [f"{HOST4}/24"], [f"{a}/24" for a in (A4, B4, C4, DNS4)])
        env = {
            "SANDBOXD_EGRESS_DNS": DNS4,
            "SANDBOXD_EGRESS_UPSTREAM_CA": str(tmp / "upstream-ca.pem"),
        }
        daemon = start_daemon(
            tmp,
            f"--uid-min={BASE}",
            f"--uid-max={BASE + 3}",
            "--network-allow=egress",
            "--template-max=64M",
            env=env,
        )
        try:
            recorders = {
                A4: TLSRecorder(inet, A4, ca.server_context()),
                B4: TLSRecorder(inet, B4, ca.server_context()),
                C4: TLSRecorder(inet, C4, daemon_leaf(daemon, MITM, tmp)),
            }
            servers += [*recorders.values(), NameServer(inet, DNS4, ZONE)]
            rules = {
                API: [{"headers": {"Authorization": SECRET}}],
                OTHER: [{"headers": {"X": "1"}}],
            }
            ruled = created(
                daemon, {"mode": "egress", "allow_out": [API, PLAIN, OTHER, MITM], "rules": rules}
            )
            plain = created(daemon, {"mode": "egress", "allow_out": [API, PLAIN, MITM]})
            late = created(daemon, {"mode": "egress", "allow_out": [API]})
            own = file(TEMPLATE_BUNDLE, ca.pem.encode())  # (the template trusts the test CA)
            template = rootfs("/usr/bin/curl", extra=[own])
            assert daemon.call("PUT", "/templates/curl", raw=template)[0] == 201
            yield World(daemon, ca, recorders, ruled, plain, late)
        finally:
            stop_daemon(daemon)
            for server in servers:
                server.close()
            ca.close()


def fetch(world: World, rid: str, address: str, name: str, trust: str = "system") -> Any:
    return json.loads(exec_out(world.daemon, rid, "python3", "-c", CLIENT, address, name, trust))


def auths(recorder: TLSRecorder) -> list[list[str]]:
    return [[v for n, v in seen["headers"] if n == "authorization"] for seen in recorder.seen]


def test_https_to_a_ruled_name_reaches_the_upstream_with_the_header(world: World) -> None:
    recorder = world.recorders[A4]
    recorder.seen.clear()
    got = fetch(world, world.ruled, A4, API)
    assert (got.get("status"), got.get("alpn")) == ("200", "http/1.1"), got
    url = f"https://{API}/curl"
    code = exec_out(
        world.daemon, world.ruled, "curl", "-sS", "--resolve", f"{API}:443:{A4}",
        "-H", "Authorization: Bearer mine", "-o", "/dev/null", "-w", "%{http_code}", url,
    )  # fmt: skip
    assert code == "200"
    assert auths(recorder) == [[SECRET]] * 2  # (the sandbox's own value replaced)
    env = exec_out(world.daemon, world.ruled, "env")
    assert all(f"{k}={v}" in env for k, v in TRUST_ENV.items())
    env = exec_out(world.daemon, world.plain, "env")  # (the host's bundle, at that path)
    assert all(f"{k}={v}" in env for k, v in TRUST_ENV.items())


def test_a_rule_given_live_is_trusted_over_https(world: World) -> None:
    before = fetch(world, world.late, A4, API)  # spliced: the test CA's, trusted by no one
    assert "CERTIFICATE_VERIFY_FAILED" in before.get("error", ""), before
    world.recorders[A4].seen.clear()
    rules = {API: [{"headers": {"Authorization": SECRET}}]}
    update = {"allow_out": [API], "rules": rules}
    assert world.daemon.call("PUT", f"/sandboxes/{world.late}/network", update)[0] == 200
    got = fetch(world, world.late, A4, API)  # its bundle, rewritten in place, has the CA
    assert got.get("status") == "200", got
    assert auths(world.recorders[A4]) == [[SECRET]]


READ = "import sys\ntry: open(sys.argv[1]).read(); print('read')\nexcept OSError as e: print(e)"


def test_the_sandbox_never_holds_the_value_nor_the_cas_key(world: World) -> None:
    assert SECRET not in exec_out(world.daemon, world.ruled, "env")
    key = world.daemon.root / ".egress-ca" / "key.pem"
    assert key.exists()
    tried = exec_out(world.daemon, world.ruled, "python3", "-c", READ, str(key))
    assert "Permission denied" in tried or "No such file" in tried, tried
    argv = ["python3", "-c", CLIENT, A4, API, "system", "stop"]
    result: list[str] = []
    client = threading.Thread(
        target=lambda: result.append(exec_out(world.daemon, world.ruled, *argv))
    )
    client.start()
    stopped: list[int] = []
    try:
        for _ in range(200):
            stopped = [pid for pid in sandbox_pids() if "\nState:\tT" in status_of(pid)]
            if stopped:
                break
            time.sleep(0.05)
        assert stopped, "the sandbox's client never stopped"
        canary, secret = ("canary-" + str(12345 * 7)).encode(), SECRET.encode()
        assert memory_holds(stopped[0], [canary, secret]) == {canary}  # the scan sees memory
        for pid in sandbox_pids():
            assert secret not in memory_holds(pid, [secret]), pid
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        client.join(30)
    assert json.loads(result[0])["status"] == "200"
    for path in world.daemon.root.rglob("*"):  # the sandbox's files, the daemon's state
        if path.is_file() and not path.is_symlink():
            try:
                held = path.read_bytes()
            except OSError:  # (a namespace's pin)
                continue
            assert SECRET.encode() not in held, path
    assert SECRET not in world.daemon.log.read_text()


def status_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""


def sandbox_pids() -> list[int]:
    """The host's processes running as one of the daemon's sandbox uids."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        status = status_of(int(entry))
        if status and BASE <= int(status.split("\nUid:")[1].split()[0]) <= BASE + 3:
            found.append(int(entry))
    return found


def test_only_a_sandbox_with_a_rule_trusts_the_daemons_ca(world: World) -> None:
    assert fetch(world, world.ruled, C4, MITM)["status"] == "200"  # (its CA: trusted)
    mitm = fetch(world, world.plain, C4, MITM)
    assert "CERTIFICATE_VERIFY_FAILED" in mitm.get("error", ""), mitm


def test_an_upstream_that_does_not_verify_is_refused(world: World) -> None:
    before = refused_counts(world.daemon, world.ruled).get("upstream_tls", 0)
    assert "error" in fetch(world, world.ruled, B4, OTHER)  # (its certificate: API's, PLAIN's)
    assert refused_counts(world.daemon, world.ruled)["upstream_tls"] == before + 1
    assert not world.recorders[B4].seen


def test_a_name_without_a_rule_is_still_spliced(world: World) -> None:
    der = ssl.PEM_cert_to_DER_cert(Path(world.ca.cert_file).read_text())
    for rid in (world.ruled, world.plain):
        got = fetch(world, rid, A4, PLAIN, trust="none")
        assert got["cert"] == hashlib.sha256(der).hexdigest(), got  # the upstream's own


def test_a_templated_sandbox_trusts_its_templates_bundle_and_the_ca(world: World) -> None:
    network = {"mode": "egress", "allow_out": [API, PLAIN]}
    body = {"template": "curl", "network": network}
    status, answer = world.daemon.call("POST", "/sandboxes", body)
    assert status == 200, answer
    rid = json.loads(answer)["remote_id"]
    seen = exec_out(world.daemon, rid, "cat", "/" + TEMPLATE_BUNDLE)
    assert seen == world.ca.pem  # (its template's own, not the host's)
    curl = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}"]
    plain = [*curl, "--resolve", f"{PLAIN}:443:{A4}", f"https://{PLAIN}/t"]
    assert exec_out(world.daemon, rid, *plain) == "200"  # spliced, its template's trust
    rules = {API: [{"headers": {"Authorization": SECRET}}]}
    update = {"allow_out": [API, PLAIN], "rules": rules}
    assert world.daemon.call("PUT", f"/sandboxes/{rid}/network", update)[0] == 200
    world.recorders[A4].seen.clear()
    ruled = [*curl, "--resolve", f"{API}:443:{A4}", f"https://{API}/t"]
    assert exec_out(world.daemon, rid, *ruled) == "200"
    assert auths(world.recorders[A4]) == [[SECRET]]
    assert exec_out(world.daemon, rid, *plain) == "200"  # (the template's CA still trusted)
