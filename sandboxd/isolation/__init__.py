"""Everything that touches the kernel for a sandbox, one sub-package per layer.

The seam the core holds is :class:`~sandboxd.isolation.base.Isolation` (``base.py``), built at
start-up by ``select.py``, whose ``create`` gives each sandbox its
:class:`~sandboxd.isolation.sandbox.SandboxIsolation` (``sandbox.py``); ``none.py`` is the
development bundle, ``uids.py`` the uid pool, ``fscreds.py`` file work as a sandbox, ``layers.py``
the capability names, ``naming.py`` the sandbox ids. The layers (docs/architecture.rst, "The
isolation package"):

- ``cgroups/``: the cgroup v1 and v2 drivers, their control files and the hierarchies;
- ``namespaces/``: the per-sandbox IPC, mount, network and PID namespaces, and what the mount
  namespace shows (the private places, ``/etc/passwd``): a sandbox's own root filesystem would
  go here, in its mount namespace (``namespaces/pins.py`` and the helper's
  ``exec/sandboxd_exec_ns.h``);
- ``network/``: the network modes (``none``, ``host``, ``egress``) and the egress layer;
- ``exec/``: the privilege-drop chain every process of a sandbox starts through: the C exec
  helper ``sandboxd-exec`` (its sources, seccomp filter included, and its build), the shell
  fallback, the spawn server;
- ``disk/``: the per-sandbox disk limits.
"""
