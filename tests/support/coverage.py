"""What a test passes on to a child process it starts with an environment of its own, so that
the child is measured too.

``coverage run`` (with ``patch = ["subprocess"]`` in pyproject.toml) marks the test process's
environment with ``COVERAGE_PROCESS_CONFIG``; a Python child that inherits it measures itself
and saves its data beside the parent's. A test that builds a clean environment for its child
(to keep the caller's ``SANDBOXD_*`` settings out, say) drops that mark unless it adds these.
"""

import os

PREFIX = "COVERAGE_"


def coverage_env() -> dict[str, str]:
    """The ``COVERAGE_*`` variables of this process (none when it is not measured)."""
    return {k: v for k, v in os.environ.items() if k.startswith(PREFIX)}
