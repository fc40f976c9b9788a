"""Many replicas behind a load balancer route and fail exactly as
docs/contract.rst, "Routing and handles", says.

Driven by the real client (``sandboxd_client.HttpSandbox``) against three real daemons behind a
real HAProxy (see conftest): creates spread over the replicas through the balancer, every later
call goes straight to the replica that holds the sandbox, a dead replica's handles raise
``SandboxNotFound`` while the others keep working, and a draining replica gets no new sandboxes.
"""

import json
import signal
import urllib.request
from collections import Counter
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from sandboxd_client import HttpSandbox, SandboxHandle, SandboxNotFound, decode_handle
from tests.scaleout.conftest import Cluster
from tests.support.daemon import Daemon

pytestmark = pytest.mark.slow


def execs(daemon: Daemon, token: str) -> dict[str, int]:
    """``{remote id: execs started}`` of a replica, from its own ``GET /sandboxes``."""
    request = urllib.request.Request(daemon.url + "/sandboxes")
    request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as response:
        body: Any = json.loads(response.read())
    return {entry["remote_id"]: entry["execs"] for entry in body["sandboxes"]}


def listing(daemon: Daemon, token: str) -> set[str]:
    """The remote ids a replica holds."""
    return set(execs(daemon, token))


async def sleep(seconds: float) -> None:
    await deferLater(reactor, seconds, lambda: None)


async def until(predicate: Any, seconds: float, what: str) -> None:
    """Poll ``predicate`` (cheap, synchronous) without blocking the reactor."""
    for _ in range(int(seconds / 0.05)):
        if predicate():
            return
        await sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def owner(cluster: Cluster, handle: SandboxHandle) -> int:
    return cluster.replica_of(decode_handle(handle).pod_url)


async def create_many(client: HttpSandbox, count: int) -> list[SandboxHandle]:
    return [await client.create() for _ in range(count)]


@pytest_twisted.ensureDeferred
async def test_creates_spread_and_later_calls_go_straight_to_the_owner(cluster: Cluster) -> None:
    client = HttpSandbox(cluster.balancer.url, token=cluster.token)
    try:
        handles = await create_many(client, 6)
        owners = [owner(cluster, h) for h in handles]
        # Round robin over three healthy replicas: two sandboxes each, in turn.
        assert Counter(owners) == {0: 2, 1: 2, 2: 2}, owners
        assert len(set(owners[:3])) == 3, owners
        through_balancer = cluster.balancer.frontend_requests()
        assert through_balancer == 6

        for i, handle in enumerate(handles):
            await client.upload(handle, "notes/who.txt", f"sandbox {i}".encode())
            result = await client.exec(handle, ["sh", "-c", "cat notes/who.txt"])
            assert (result.exit_code, result.stdout) == (0, f"sandbox {i}".encode())
            assert await client.download(handle, "/notes/who.txt") == f"sandbox {i}".encode()
            assert [e.path for e in await client.walk(handle)] == ["/notes/who.txt"]

        # Each replica lists exactly the sandboxes whose handles name it...
        for index, daemon in enumerate(cluster.replicas):
            expected = {
                decode_handle(h).remote_id
                for h, o in zip(handles, owners, strict=True)
                if o == index
            }
            assert listing(daemon, cluster.token) == expected
        # ...and none of those 24 calls went through the balancer.
        assert cluster.balancer.frontend_requests() == through_balancer
    finally:
        await client.close()


@pytest_twisted.ensureDeferred
async def test_a_dead_replica_loses_its_sandboxes_only(cluster: Cluster) -> None:
    client = HttpSandbox(cluster.balancer.url, token=cluster.token)
    try:
        handles = await create_many(client, 6)
        dead = cluster.replicas[1]
        dead.process.send_signal(signal.SIGKILL)
        dead.process.wait(30)

        for handle in handles:
            if owner(cluster, handle) == 1:
                with pytest.raises(SandboxNotFound):
                    await client.exec(handle, ["true"])
                with pytest.raises(SandboxNotFound):
                    await client.download(handle, "anything")
            else:
                result = await client.exec(handle, ["echo", "alive"])
                assert (result.exit_code, result.stdout) == (0, b"alive\n")

        # The balancer's health check takes the dead replica out; creates go to the others.
        await until(
            lambda: cluster.balancer.server_status()["r1"].startswith("DOWN"),
            10,
            "haproxy to mark r1 down",
        )
        again = await create_many(client, 4)
        assert Counter(owner(cluster, h) for h in again) == {0: 2, 2: 2}
    finally:
        await client.close()


@pytest_twisted.ensureDeferred
async def test_a_draining_replica_gets_no_new_sandboxes(cluster: Cluster) -> None:
    client = HttpSandbox(cluster.balancer.url, token=cluster.token)
    try:
        handles = await create_many(client, 3)
        draining = next(h for h in handles if owner(cluster, h) == 0)
        others = [h for h in handles if owner(cluster, h) != 0]

        # A command is running on replica 0 when it is told to drain (as a preStop hook would).
        running = client.exec(draining, ["sh", "-c", "sleep 3; echo finished"])
        rid = decode_handle(draining).remote_id
        await until(lambda: execs(cluster.replicas[0], cluster.token).get(rid, 0) >= 1, 10, "exec")
        request = urllib.request.Request(cluster.replicas[0].url + "/drain", method="POST")
        request.add_header("Authorization", f"Bearer {cluster.token}")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 204

        # /readyz answers 503, so the balancer's health check takes replica 0 out of rotation.
        await until(
            lambda: cluster.balancer.server_status()["r0"].startswith("DOWN"),
            10,
            "haproxy to mark r0 down",
        )
        fresh = await create_many(client, 6)
        assert Counter(owner(cluster, h) for h in fresh) == {1: 3, 2: 3}
        for handle in [*others, *fresh]:
            result = await client.exec(handle, ["echo", "ok"])
            assert result.exit_code == 0

        # The running command finishes; then replica 0 kills its sandboxes and exits cleanly.
        result = await running
        assert (result.exit_code, result.stdout) == (0, b"finished\n")
        process = cluster.replicas[0].process
        await until(lambda: process.poll() is not None, 30, "replica 0 to exit after its drain")
        assert process.returncode == 0
        with pytest.raises(SandboxNotFound):
            await client.exec(draining, ["true"])
    finally:
        await client.close()
