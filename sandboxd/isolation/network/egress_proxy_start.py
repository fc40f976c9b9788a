"""Starting the egress proxy of a daemon whose ``egress`` mode is offered (docs/isolation.rst,
"Egress by name"): its resolver (``SANDBOXD_EGRESS_DNS``, else the nameservers of
``SANDBOXD_RESOLV_CONF``), its listener, and the mode told the port its policies by name
redirect to."""

from collections.abc import Callable, Sequence
from typing import Any

from twisted.names import client

from sandboxd.isolation.network.egress import EgressNetwork
from sandboxd.isolation.network.egress_policy import is_host_address
from sandboxd.isolation.network.egress_proxy import ALL_INTERFACES, EgressProxy
from sandboxd.isolation.network.egress_verdict import operator_denied


def start_egress_proxy(
    config: Any,
    reactor: Any,
    mode: object,
    on_refused: Callable[[str, str], None],
    on_forget: Callable[[str, str], None] = lambda rid, reason: None,
    interfaces: Sequence[str] = ALL_INTERFACES,
) -> EgressProxy | None:
    """The proxy of ``mode`` when it is the egress mode (``None`` otherwise), listening;
    ``on_refused`` is told each refusal, ``on_forget`` each count dropped when its sandbox
    goes."""
    if not isinstance(mode, EgressNetwork):
        return None
    servers = config.egress_dns
    if servers:
        addresses = [(server.host, server.port) for server in servers]
        resolver = client.Resolver(servers=addresses, reactor=reactor)
    else:
        resolver = client.Resolver(resolv=config.resolv_conf, reactor=reactor)
    plan = mode.egress.plan
    proxy = EgressProxy(
        reactor,
        mode,
        resolver,
        operator_denied(plan),
        is_host_address,
        on_refused=on_refused,
        on_forget=on_forget,
    )
    # detach runs in a worker thread; the proxy's counts are the reactor thread's
    mode.on_detach = lambda rid: reactor.callFromThread(proxy.forget, rid)
    if plan.pool6 is None:
        interfaces = [address for address in interfaces if ":" not in address]
    mode.proxy_port = proxy.listen(interfaces)
    return proxy
