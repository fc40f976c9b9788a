"""The namespace layer: each sandbox's IPC, mount, network and PID namespaces, pinned at create
(``pins.py``), and what its mount namespace shows."""
