"""Shared daemons of the real-kernel behaviour suite over HTTP (``test_isolation_http_*``).

Two daemons per test session, each with real isolation and a uid block of its own, each proven
to leave nothing behind when it stops:

``roomy``
    generous limits, for the isolation, file and environment tests; its own environment holds
    a canary that no command may ever see.
``tight``
    ``memory 64M``, ``pids 32``, ``cpu 0.2``: the limits the bombs and the hog run into.

Both start only when a test asks for them (the driver suites in this directory need neither).
"""

from collections.abc import Iterator

import pytest

from tests.kernel.kernel_http import KernelDaemon

CANARY_NAME = "SANDBOXD_TEST_CANARY"
CANARY_VALUE = "canary-7f3a9c1e-daemon-env-must-not-leak"
OTHER_CANARY_NAME = "KERNEL_HTTP_CANARY"

TIGHT_MEMORY = 64 << 20
TIGHT_PIDS = 32
TIGHT_CPU = 0.2


@pytest.fixture(scope="session")
def roomy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelDaemon]:
    kd = KernelDaemon.start(
        tmp_path_factory.mktemp("roomy"),
        "--memory-max=256M",
        "--pids-max=128",
        "--cpu-cores=1",
        env={CANARY_NAME: CANARY_VALUE, OTHER_CANARY_NAME: CANARY_VALUE},
    )
    try:
        yield kd
    finally:
        kd.stop()


@pytest.fixture(scope="session")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelDaemon]:
    kd = KernelDaemon.start(
        tmp_path_factory.mktemp("tight"),
        f"--memory-max={TIGHT_MEMORY}",
        f"--pids-max={TIGHT_PIDS}",
        f"--cpu-cores={TIGHT_CPU}",
    )
    try:
        yield kd
    finally:
        kd.stop()
