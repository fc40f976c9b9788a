"""The egress proxy of a daemon whose ``egress`` mode is offered (docs/isolation.rst, "Egress
by name"): its resolver (``SANDBOXD_EGRESS_DNS``, else the nameservers of
``SANDBOXD_RESOLV_CONF``), its deny list, the operator's SOCKS5 proxy
(``SANDBOXD_EGRESS_SOCKS5``, "Egress through a SOCKS5 proxy") and the daemon's CA for header
rules over HTTPS (:func:`rule_tls`, "Header rules over HTTPS"), given to the mode, which has it
listen while the layer is up."""

import os
import resource
import shutil
from collections.abc import Sequence
from typing import Any

from attrs import evolve
from twisted.logger import Logger
from twisted.names import client

from sandboxd.isolation.network.egress import EgressNetwork
from sandboxd.isolation.network.egress_ca import CA_DIR, EgressCA
from sandboxd.isolation.network.egress_judge import JUDGE_PROGRAM, EgressJudge
from sandboxd.isolation.network.egress_policy import is_host_address
from sandboxd.isolation.network.egress_proxy import ALL_INTERFACES, EgressProxy, total_for
from sandboxd.isolation.network.egress_socks import SocksUpstream
from sandboxd.isolation.network.egress_tls import RuleTLS, upstream_trust
from sandboxd.isolation.network.egress_verdict import operator_denied
from sandboxd.undo import StartupUndo

log = Logger()


def descriptor_limit() -> int:
    """The descriptors the daemon may open once started: it raises its soft limit to the hard
    one as it starts (``sandboxd.boot``), which is after the proxy is made."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if hard == resource.RLIM_INFINITY else hard


def socks_upstream(config: Any, password: bytes | None) -> SocksUpstream | None:
    """The operator's SOCKS5 proxy (``None``: not set) with ``SANDBOXD_EGRESS_SOCKS5_USER``
    and ``password`` (read from ``SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE``, both set or
    neither: :meth:`sandboxd.config.Config.check`); ``ValueError`` naming what cannot be
    sent (RFC 1929: 1 to 255 bytes each)."""
    if config.egress_socks5 is None:
        return None
    user = None if config.egress_socks5_user is None else config.egress_socks5_user.encode()
    try:
        return SocksUpstream(config.egress_socks5, user, password)
    except ValueError as e:
        raise ValueError(f"SANDBOXD_EGRESS_SOCKS5_USER or _PASSWORD_FILE: {e}") from None


def rule_tls(config: Any, reactor: Any, undo: StartupUndo) -> RuleTLS:
    """What header rules over HTTPS need: the state root's CA (made at the first start,
    :mod:`.egress_ca`; removed by ``undo`` when that start fails, as all it made) and the
    upstreams' trust (``SANDBOXD_EGRESS_UPSTREAM_CA``, else the host's trust store);
    ``OSError`` or ``ValueError`` when either cannot be read."""
    directory = os.path.join(config.root, CA_DIR)
    if not os.path.lexists(directory):
        undo.add("egress CA", lambda: shutil.rmtree(directory, ignore_errors=True))
    ca = EgressCA.of_root(config.root, reactor)
    trust = upstream_trust(config.egress_upstream_ca)
    log.info(
        "egress: header rules over HTTPS with the CA of {root}, upstreams verified against {trust}",
        root=config.root,
        trust=config.egress_upstream_ca or "the host's trust store",
    )
    return RuleTLS(ca, trust, reactor)


def egress_proxy(
    config: Any,
    reactor: Any,
    mode: object,
    interfaces: Sequence[str] = ALL_INTERFACES,
    socks: SocksUpstream | None = None,
    tls: RuleTLS | None = None,
) -> EgressProxy | None:
    """The proxy of ``mode`` when it is the egress mode (``None`` otherwise), given to it:
    the mode starts and stops its listening with the layer. With ``socks``, every sandbox's
    TCP goes through the proxy and out through that SOCKS5 proxy alone (the plan's
    ``proxy_all``). With ``tls`` (:func:`rule_tls`), header rules apply over TLS too. The
    caller sets ``on_refused`` and ``on_forget`` (the metrics) once it
    has them."""
    if not isinstance(mode, EgressNetwork):
        return None
    if socks is not None:  # before the layer's table is made: it redirects all TCP then
        mode.egress.plan = evolve(mode.egress.plan, proxy_all=True)
        log.info(
            "egress: every connection of egress sandboxes leaves through the SOCKS5 proxy"
            " {socks} (SANDBOXD_EGRESS_SOCKS5), never directly",
            socks=str(socks.address),
        )
    servers = config.egress_dns
    if servers:
        addresses = [(server.host, server.port) for server in servers]
        resolver = client.Resolver(servers=addresses, reactor=reactor)
    else:
        resolver = client.Resolver(resolv=config.resolv_conf, reactor=reactor)
    plan = mode.egress.plan
    if plan.pool6 is None:
        interfaces = [address for address in interfaces if ":" not in address]
    proxy = EgressProxy(
        reactor,
        mode,
        resolver,
        operator_denied(plan),
        is_host_address,
        total=total_for(descriptor_limit()),
        interfaces=interfaces,
        socks=socks,
        tls=tls,
    )
    if tls is not None:  # (sandboxes with a header rule trust it: egress.trust_bundle)
        mode.trusted = tls.ca.pem
    mode.on_detach = proxy.forget  # (a kill's detach runs on the reactor thread, as the proxy)
    mode.proxy = proxy
    mode.judge = egress_judge(config, reactor, proxy, plan.pool6 is not None)
    return proxy


def egress_judge(
    config: Any, reactor: Any, proxy: EgressProxy, ipv6: bool, program: str = str(JUDGE_PROGRAM)
) -> EgressJudge | None:
    """The egress judge (``SANDBOXD_EGRESS_JUDGE=on``: docs/isolation.rst, "The judged
    path"), answered by ``proxy``; ``None`` when off, or when the judge was not built (no C
    compiler where the daemon was installed: the proxy reads every name then)."""
    if config.egress_judge != "on":
        return None
    if not os.access(program, os.X_OK):
        log.warn(
            "egress: SANDBOXD_EGRESS_JUDGE=on, but {program} was not built: names go through"
            " the proxy",
            program=program,
        )
        return None
    return EgressJudge(reactor, proxy, program=program, ipv6=ipv6)
