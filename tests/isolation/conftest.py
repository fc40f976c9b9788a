"""Unit tests of ``sandboxd.isolation``: no root, no real cgroup, a fake kernel per test."""
