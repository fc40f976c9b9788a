"""The cgroup layer: one cgroup per sandbox, v2 (``cgroup2.py``) or v1 (``cgroup1.py``)."""
