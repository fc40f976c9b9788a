"""Ports: the daemon's proxy to a server listening inside a sandbox (docs/extensions.rst,
"Ports").

The daemon is the one process that can reach a port inside a sandbox's network namespace: it
opens each upstream socket in that namespace (:mod:`sandboxd.ports.dial`: a short-lived thread
enters the sandbox's pinned network namespace, connects to ``127.0.0.1:PORT`` there, and hands
the connected socket to the reactor). It never connects anywhere else. HTTP requests are
forwarded with flow control both ways (:mod:`sandboxd.ports.forward`); a WebSocket upgrade
becomes a byte tunnel (:mod:`sandboxd.ports.tunnel`). :class:`sandboxd.ports.table.PortTable`
holds what is per sandbox: its open proxied connections (capped) and its public ports.
"""
