"""Unit tests of ``sandboxd.isolation``: no root, no real cgroup, a fake kernel per test."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
