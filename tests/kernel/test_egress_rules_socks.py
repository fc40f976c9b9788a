"""Header rules with an operator's SOCKS5 proxy (docs/isolation.rst, "Header rules", "Egress
through a SOCKS5 proxy"): a real daemon sending egress through ``pproxy`` in the "internet"
of ``test_egress_rules``; a rule's requests are rewritten on the connection the SOCKS5 proxy
made, which the upstream sees come from the SOCKS5 server's address, never the host's.
"""

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from subprocess import run

import pytest
from attrs import frozen

from tests.kernel.test_egress_names import created
from tests.kernel.test_egress_rules import (
    API,
    DNS4,
    SECRET,
    HeaderRecorder,
    Ruled,
    auth_of,
    rules_internet,
    talk,
)
from tests.kernel.test_egress_socks import PASSWORD, SOCKS4, SOCKS_PORT, USER, Socks
from tests.support.daemon import start_daemon, stop_daemon

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and nftables need root"),
]


@frozen
class Proxied:
    ruled: Ruled
    socks: Socks


@pytest.fixture
def proxied() -> Iterator[Proxied]:
    work = Path(tempfile.mkdtemp(prefix="egress-rules-socks-"))
    try:
        with rules_internet(SOCKS4) as (recorder, inet):
            socks = Socks(inet, work / "pproxy.log")
            socks.start()
            password = work / "password"
            password.write_text(PASSWORD + "\n")
            password.chmod(0o600)
            base = 493000 + os.getpid() % 1000 * 20
            daemon = start_daemon(
                work,
                f"--uid-min={base}",
                f"--uid-max={base + 1}",
                "--network-allow=egress",
                env={
                    "SANDBOXD_EGRESS_DNS": DNS4,
                    "SANDBOXD_EGRESS_SOCKS5": f"{SOCKS4}:{SOCKS_PORT}",
                    "SANDBOXD_EGRESS_SOCKS5_USER": USER,
                    "SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE": str(password),
                },
            )
            try:
                network = {
                    "allow_out": [API],
                    "rules": {API: [{"headers": {"Authorization": SECRET}}]},
                }
                yield Proxied(Ruled(daemon, recorder, created(daemon, network)), socks)
            finally:
                stop_daemon(daemon)
                socks.stop()
    finally:
        run(["rm", "-rf", str(work)], check=False)


def test_a_rules_requests_are_rewritten_on_the_socks5_proxys_connection(
    proxied: Proxied,
) -> None:
    recorder: HeaderRecorder = proxied.ruled.recorder
    answers = talk(proxied.ruled, [{"host": API}, {"host": API, "headers": {"Authorization": "x"}}])
    assert [answer["n"] for answer in answers] == [1, 2]
    assert [auth_of(seen) for seen in recorder.seen] == [[SECRET]] * 2
    assert {seen["peer"] for seen in recorder.seen} == {SOCKS4}
    assert proxied.socks.connects()[-1].startswith("203.0.113.1:80")
