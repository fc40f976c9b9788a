"""The network layer: a sandbox's network mode (``modes.py``) and the ``egress`` mode's veths,
routes and nftables (``egress*.py``, ``rtnl.py``)."""
