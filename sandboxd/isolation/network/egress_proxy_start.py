"""The egress proxy of a daemon whose ``egress`` mode is offered (docs/isolation.rst, "Egress
by name"): its resolver (``SANDBOXD_EGRESS_DNS``, else the nameservers of
``SANDBOXD_RESOLV_CONF``) and its deny list, given to the mode, which has it listen while
the layer is up."""

import resource
from collections.abc import Sequence
from typing import Any

from twisted.names import client

from sandboxd.isolation.network.egress import EgressNetwork
from sandboxd.isolation.network.egress_policy import is_host_address
from sandboxd.isolation.network.egress_proxy import ALL_INTERFACES, EgressProxy, total_for
from sandboxd.isolation.network.egress_verdict import operator_denied


def descriptor_limit() -> int:
    """The descriptors the daemon may open once started: it raises its soft limit to the hard
    one as it starts (``sandboxd.boot``), which is after the proxy is made."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if hard == resource.RLIM_INFINITY else hard


def egress_proxy(
    config: Any,
    reactor: Any,
    mode: object,
    interfaces: Sequence[str] = ALL_INTERFACES,
) -> EgressProxy | None:
    """The proxy of ``mode`` when it is the egress mode (``None`` otherwise), given to it:
    the mode starts and stops its listening with the layer. The caller sets ``on_refused``
    and ``on_forget`` (the metrics) once it has them."""
    if not isinstance(mode, EgressNetwork):
        return None
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
    )
    mode.on_detach = proxy.forget  # (a kill's detach runs on the reactor thread, as the proxy)
    mode.proxy = proxy
    return proxy
