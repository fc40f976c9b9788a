"""The Kubernetes manifests run for real: the image built from packaging/Containerfile on a
base made here, two replicas started by ``podman kube play`` from
packaging/k8s/containerd/deployment.yaml, the client creating through a Service in front of
them and then talking to each pod directly, and a pod deleted under a live sandbox.

As root where Debian's podman (4.3), mmdebstrap and haproxy are installed (``tests/run``
installs them). No registry: the base is ``mmdebstrap --variant=minbase bookworm`` imported
with ``podman import``, passed as the Containerfile's ``BASE``; the build's RUN steps reach
the Debian and PyPI package registries only.

What podman 4.3 does with the YAML (see ``podman_kube.for_podman`` for each change):

- ``kind: Service`` is skipped ("Kube kind Service not supported"): podman gives no Service.
  A HAProxy on 127.0.0.1 (round robin, ``/readyz`` checks as a readiness probe) plays it, as
  in tests/scaleout.
- ``replicas`` > 1 binds every replica to the same host port (4.4 and later play one): two
  plays of the same Deployment under two names give the two pods, each published on a
  127.0.0.1 port of its own.
- ``status.podIP`` is refused. The pod's own IP is on the kube network's bridge, routed
  from the host (``ip route get`` names the bridge), but tests talk to 127.0.0.1 only, so
  each pod announces its published port (``SANDBOXD_POD_URL``).
- the Secret becomes a podman secret, and its volume a podman volume whose file podman writes
  still base64-encoded (a ``data`` value as it stands in the YAML; ``stringData`` gives an
  empty file) and mode 0644 whatever ``defaultMode`` says, which the daemon refuses. So the
  pods are played with ``--start=false``, the file is written as the kubelet would (the
  token, mode 0400), and then the pods start.
- in the privileged (containerd) variant the daemon finds this host's cgroup v1 writable and
  isolates each sandbox in a cgroup of its own (``isolation.cgroup1``).

Cost: about 90 s cold (mmdebstrap 25 s, the build and its save 50 s), about 20 s with a warm cache
(``/var/cache/sandboxd-test``: the base tar, and the image saved under a key of its base,
Containerfile, prestop hook and wheel content). Everything made is removed: pods, containers,
the secret and its volume, the images (the pause image and the kube network too when this
test made them).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
import yaml

from sandboxd_client import HttpSandbox, SandboxHandle, SandboxNotFound, decode_handle
from tests.support.daemon import REPO, free_port

from .podman_kube import (
    PAUSE_IMAGE,
    Podman,
    build_image,
    empty_dirs,
    for_podman,
    leftovers,
    secret_document,
)
from .test_build import clean_env, tree_copy

pytestmark = [pytest.mark.slow, pytest.mark.wide]

K8S = REPO / "packaging" / "k8s"
TOKEN = "kube-play-test-token"
NAMES = ("sandboxd-kt-0", "sandboxd-kt-1")
KUBE_NETWORK = "podman-default-kube-network"


def required() -> None:
    if os.geteuid() != 0:
        pytest.skip("podman kube play of the manifests needs root")
    missing = [t for t in ("podman", "mmdebstrap", "catatonit", "haproxy") if not find(t)]
    if missing:
        pytest.skip(f"not installed: {' '.join(missing)} (as root, tests/run installs them)")


def find(tool: str) -> str | None:
    for directory in ("/usr/sbin", "/usr/bin", "/usr/libexec/podman"):
        if os.access(f"{directory}/{tool}", os.X_OK):
            return f"{directory}/{tool}"
    return shutil.which(tool)


def wheel(directory: Path) -> Path:
    source = directory / "src"
    tree_copy(source)
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(directory / "dist"), "."],
        cwd=source,
        env=clean_env(),
        check=True,
        capture_output=True,
        timeout=600,
    )
    (built,) = (directory / "dist").glob("*.whl")
    return built


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False


def wait_until_ready(podman: Podman, url: str, pod: str, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not ready(url):
        if time.monotonic() > deadline:
            logs = podman.run("logs", "--tail", "20", f"{pod}-pod-0-sandboxd", check=False)
            raise AssertionError(f"{pod} not ready at {url}: {logs.stdout}{logs.stderr}")
        time.sleep(0.5)


def start_haproxy(directory: Path, ports: list[int]) -> tuple[subprocess.Popen[bytes], int]:
    """The Service: round robin over the pods' published ports, ``/readyz`` health checks."""
    port = free_port()
    servers = "\n".join(f"    server pod{i} 127.0.0.1:{p} check" for i, p in enumerate(ports))
    config = directory / "haproxy.cfg"
    config.write_text(
        f"""\
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
frontend service
    bind 127.0.0.1:{port}
    default_backend pods
backend pods
    balance roundrobin
    option httpchk GET /readyz
    default-server inter 200ms fall 2 rise 1
{servers}
"""
    )
    process = subprocess.Popen(
        [find("haproxy") or "haproxy", "-db", "-f", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return process, port


def pod_of(handle: SandboxHandle) -> str:
    return decode_handle(handle).pod_url.rstrip("/")


class Deployment:
    """The two plays, their YAML files and ports, and the Service in front of them."""

    def __init__(self, podman: Podman, files: list[Path], ports: list[int], service: int):
        self.podman = podman
        self.files = files
        self.ports = ports
        self.service_url = f"http://127.0.0.1:{service}"
        self.pod_urls = [f"http://127.0.0.1:{p}" for p in ports]
        self.plays: list[str] = []


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    required()
    directory = tmp_path_factory.mktemp("kube")
    podman = Podman(directory)
    pause_images_before = set(podman.images(PAUSE_IMAGE))
    kube_network_before = podman.exists("network", KUBE_NETWORK)
    assert not leftovers(podman, [("pod", f"{n}-pod-0") for n in NAMES])
    image = build_image(podman, REPO, wheel(directory), "localhost/sandboxd-kube-test")
    manifest = yaml.safe_load((K8S / "containerd" / "deployment.yaml").read_text())
    service = yaml.safe_load((K8S / "service.yaml").read_text())
    secret_name = manifest["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"]
    secret_file = directory / "secret.yaml"
    secret_file.write_text(yaml.safe_dump(secret_document(secret_name, TOKEN)))
    ports = [free_port(), free_port()]
    files, volumes = [], [secret_name]
    for name, port in zip(NAMES, ports, strict=True):
        path = directory / f"{name}.yaml"
        for_this_pod = for_podman(manifest, name, image, port)
        path.write_text(yaml.safe_dump_all([for_this_pod, service]))
        files.append(path)
        volumes += empty_dirs(for_this_pod)
    made = Deployment(podman, files, ports, free_port())
    balancer: subprocess.Popen[bytes] | None = None
    try:
        podman.run("kube", "play", str(secret_file))
        for path in files:
            played = podman.run("--log-level=info", "kube", "play", "--start=false", str(path))
            made.plays.append(played.stdout + played.stderr)
        mountpoint = podman.run("volume", "inspect", "--format", "{{.Mountpoint}}", secret_name)
        token = Path(mountpoint.stdout.strip()) / "token"
        token.write_text(TOKEN)
        token.chmod(0o400)
        for name in NAMES:
            podman.run("pod", "start", f"{name}-pod-0")
        for name, url in zip(NAMES, made.pod_urls, strict=True):
            wait_until_ready(podman, url, name)
        balancer, service_port = start_haproxy(directory, ports)
        made.service_url = f"http://127.0.0.1:{service_port}"
        deadline = time.monotonic() + 30
        while not ready(made.service_url) and time.monotonic() < deadline:
            time.sleep(0.2)
        yield made
    finally:
        if balancer is not None:
            balancer.send_signal(signal.SIGTERM)
            balancer.wait(10)
        for path in files:
            podman.run("kube", "down", str(path), seconds=60, check=False)
        for name in NAMES:
            podman.run("pod", "rm", "-f", "-t", "0", f"{name}-pod-0", check=False)
        podman.run("secret", "rm", secret_name, check=False)
        for volume in volumes:
            podman.run("volume", "rm", "-f", volume, check=False)
        podman.run("rmi", "-f", image, check=False)
        for pause in set(podman.images(PAUSE_IMAGE)) - pause_images_before:
            podman.run("rmi", "-f", pause, check=False)
        if not kube_network_before:
            podman.run("network", "rm", "-f", KUBE_NETWORK, check=False)
        left = leftovers(
            podman,
            [("image", image), ("secret", secret_name)]
            + [("volume", v) for v in volumes]
            + [("pod", f"{n}-pod-0") for n in NAMES],
        )
        assert not left, f"left behind: {left}"


def test_podman_plays_the_deployment_and_skips_the_service(deployment: Deployment) -> None:
    for played in deployment.plays:
        assert "Kube kind Service not supported" in played
        assert "Pod:" in played and "Container:" in played
    running = deployment.podman.run("pod", "ps", "--format", "{{.Name}} {{.Status}}").stdout
    for name in NAMES:
        assert f"{name}-pod-0 Running" in running


@pytest_twisted.ensureDeferred
async def test_creates_through_the_service_then_straight_to_each_pod(
    deployment: Deployment,
) -> None:
    client = HttpSandbox(deployment.service_url, token=TOKEN)
    try:
        handles = [await client.create() for _ in range(4)]
        owners = {pod_of(h) for h in handles}
        assert owners == set(deployment.pod_urls)  # round robin: both pods hold sandboxes
        for handle in handles:
            result = await client.exec(handle, ["sh", "-c", "id -u; cat /proc/self/cgroup"])
            assert result.exit_code == 0, result.stderr
            uid, *cgroups = result.stdout.decode().split()
            assert 200000 <= int(uid) <= 200063  # SANDBOXD_UID_MIN..MAX of the manifest
            rid = decode_handle(handle).remote_id
            assert any(rid in line for line in cgroups), cgroups  # a cgroup of its own
        for pod_url in deployment.pod_urls:  # each pod's own driver: v1 here, v2 elsewhere
            health = await client.health(pod_url)
            assert {"isolation.cgroup1", "isolation.cgroup2"} & set(health.capabilities)
    finally:
        await client.close()


@pytest_twisted.ensureDeferred
async def test_a_pod_deleted_under_a_live_sandbox(deployment: Deployment) -> None:
    client = HttpSandbox(deployment.service_url, token=TOKEN)
    try:
        handles: dict[str, SandboxHandle] = {}
        while len(handles) < 2:
            handle = await client.create()
            handles.setdefault(pod_of(handle), handle)
        doomed = handles[deployment.pod_urls[1]]
        survivor = handles[deployment.pod_urls[0]]
        assert (await client.exec(doomed, ["true"])).exit_code == 0
        deployment.podman.run("kube", "down", str(deployment.files[1]), seconds=60)
        with pytest.raises(SandboxNotFound):
            await client.exec(doomed, ["true"])
        result = await client.exec(survivor, ["echo", "alive"])
        assert (result.exit_code, result.stdout) == (0, b"alive\n")
    finally:
        await client.close()
