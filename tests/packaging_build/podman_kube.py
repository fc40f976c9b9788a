"""Podman for tests/packaging_build/test_kube_play.py: a base image made here, the image built
from packaging/Containerfile on it, cached by content, and the Kubernetes YAML as podman
4.3's ``kube play`` takes it.

What podman 4.3.1 (Debian 12) needs on this kind of host, found by trying:

- ``nofile``/``nproc`` limits no higher than the caller's: podman asks for nofile 1048576 by
  default and runc/crun cannot raise it without CAP_SYS_RESOURCE ("setrlimit RLIMIT_NOFILE:
  Operation not permitted"); podman lowers its own nproc to 32768. A containers.conf of the
  test's own (``CONTAINERS_CONF``) sets ``default_ulimits``.
- runc where cgroup v1 and a cgroup2 hierarchy with a controller are mounted side by side
  (hybrid): crun refuses ("cgroups in hybrid mode not supported, drop all controllers from
  cgroupv2").
- catatonit: a pod's infra container is the ``localhost/podman-pause`` image podman builds
  from it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import resource
import shutil
import subprocess
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CACHE = Path("/var/cache/sandboxd-test")
# The Containerfile's packages, preinstalled so its apt-get step has nothing to fetch but the
# index; minbase alone is Debian's smallest (no docker.io here: no registry is reachable).
BASE_PACKAGES = (
    "python3,python3-venv,util-linux,rsync,iproute2,nftables,btrfs-progs,ca-certificates,tini"
)
MIRROR = "http://deb.debian.org/debian"
PAUSE_IMAGE = "localhost/podman-pause"


class Podman:
    """``podman`` with the test's containers.conf, each call bounded by ``timeout -s KILL``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        conf = directory / "containers.conf"
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
        nproc_hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        nproc = 32768 if nproc_hard == resource.RLIM_INFINITY else min(nproc_hard, 32768)
        lines = [
            "[containers]",
            f'default_ulimits = ["nofile={nofile[0]}:{nofile[1]}", "nproc={nproc}:{nproc}"]',
        ]
        if shutil.which("runc"):
            lines += ["[engine]", 'runtime = "runc"']
        conf.write_text("\n".join(lines) + "\n")
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def run(
        self, *args: str, seconds: int = 120, check: bool = True, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["timeout", "-s", "KILL", str(seconds), "podman", *args],
            env=self.env,
            input=None if stdin is None else stdin.decode(),
            capture_output=True,
            text=True,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: {done.returncode}\n{done.stderr}")
        return done

    def exists(self, what: str, name: str) -> bool:
        """Whether the image/volume/secret/network/pod ``name`` exists."""
        if what == "image":
            return self.run("image", "exists", name, check=False).returncode == 0
        if what == "secret":  # podman 4.3 has no ``secret exists``
            return name in self.run("secret", "ls", "--format", "{{.Name}}").stdout.split()
        return self.run(what, "exists", name, check=False).returncode == 0

    def images(self, repository: str) -> list[str]:
        listed = self.run("images", "--format", "{{.Repository}}:{{.Tag}}", repository)
        return listed.stdout.split()


def digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def base_tar() -> tuple[Path, str]:
    """A Debian 12 minbase root with the image's packages as a tar, made once by mmdebstrap
    (about 25 s) and kept in the cache under a key of what it is made from."""
    args = ["--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm"]
    key = digest(*args, MIRROR)
    tar = CACHE / f"kube-base-{key}.tar"
    if not tar.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = tar.with_suffix(".partial.tar")  # mmdebstrap writes a tar for a .tar name
        subprocess.run(
            ["timeout", "-s", "KILL", "600", "mmdebstrap", "-q", *args, str(partial), MIRROR],
            check=True,
            capture_output=True,
        )
        partial.rename(tar)
    return tar, key


def wheel_key(wheel: Path) -> str:
    """The wheel's content (its RECORD: every file's hash), not its bytes: zip timestamps
    change from build to build of the same tree."""
    with zipfile.ZipFile(wheel) as z:
        (record,) = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")]
        return digest(z.read(record))


def build_image(podman: Podman, repo: Path, wheel: Path, tag_prefix: str) -> str:
    """The image of packaging/Containerfile on the local base, loaded from the cache when the
    same base, Containerfile, prestop hook and wheel content made it before, else built
    (``podman build``, its RUN steps reaching the Debian and PyPI registries) and saved."""
    tar, base_key = base_tar()
    containerfile = repo / "packaging" / "Containerfile"
    prestop = repo / "packaging" / "sandboxd-prestop"
    key = digest(base_key, containerfile.read_bytes(), prestop.read_bytes(), wheel_key(wheel))
    image = f"{tag_prefix}:{key}"
    saved = CACHE / f"kube-image-{key}.tar"
    if saved.exists():
        podman.run("load", "-q", "-i", str(saved), seconds=300)
        return image
    base = f"{tag_prefix}-base:{base_key}"
    podman.run("import", "-q", str(tar), base, seconds=300)
    context = podman.directory / "context"
    (context / "dist").mkdir(parents=True)
    (context / "packaging").mkdir()
    shutil.copy2(wheel, context / "dist" / wheel.name)
    shutil.copy2(prestop, context / "packaging" / prestop.name)
    try:
        podman.run(
            "build",
            "-q",
            # The machine's CA bundle: the way to PyPI may pass a TLS-inspecting proxy.
            "-v",
            "/etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro",
            "--build-arg",
            f"BASE={base}",
            "-f",
            str(containerfile),
            "-t",
            image,
            str(context),
            seconds=900,
        )
    finally:
        podman.run("rmi", base, check=False)
    partial = saved.with_suffix(".partial")
    podman.run("save", "-q", "-o", str(partial), image, seconds=300)
    partial.rename(saved)
    for old in CACHE.glob("kube-image-*.tar"):  # one image kept: each is ~420 MB
        if old != saved:
            old.unlink()
    return image


def secret_document(name: str, token: str) -> dict[str, Any]:
    """The token Secret, as ``kubectl create secret generic NAME --from-file=token=FILE``
    makes it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "Opaque",
        "data": {"token": base64.b64encode(token.encode()).decode()},
    }


def for_podman(deployment: dict[str, Any], name: str, image: str, port: int) -> dict[str, Any]:
    """The Deployment as podman 4.3 can play it, one replica on ``127.0.0.1:port``:

    - ``replicas: 1``: podman 4.3 makes every replica of a Deployment bind the same host port
      and the second fails ("bind: address already in use"; podman issue 16765), 4.4 and
      later play one; two plays under two names give two pods.
    - ``hostPort``/``hostIP``: published on the loopback only.
    - ``POD_IP`` from ``status.podIP`` is refused ("fieldPath status.podIP is either not valid
      or not supported"), and the pod's bridge address is not one the tests may reach: the pod
      says its address with ``SANDBOXD_POD_URL``, as a replica on a host does.
    - ``SANDBOXD_ISOLATION=auto``: the manifest's cgroup2 is what a node of today has; this
      host has cgroup v1, which the privileged container makes writable.
    - the token volume's ``optional: false`` (Kubernetes' default) written out: podman 4.3
      dereferences it unset (a nil-pointer panic in VolumeFromSecret).
    - each ``emptyDir`` renamed after the play: podman 4.3 makes it a named volume of the
      volume's name, which the second play would share with the first (its daemon then stops
      at "another sandboxd is using /var/lib/sandboxd/sandboxes"), where Kubernetes gives each
      pod its own.
    """
    d = json.loads(json.dumps(deployment))
    d["metadata"]["name"] = name
    d["spec"]["replicas"] = 1
    pod = d["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    container["image"] = image
    container["imagePullPolicy"] = "Never"
    (http,) = container["ports"]
    http.update(hostPort=port, hostIP="127.0.0.1")
    env = [e for e in container["env"] if e["name"] not in ("POD_IP", "SANDBOXD_ISOLATION")]
    env += [
        {"name": "SANDBOXD_POD_URL", "value": f"http://127.0.0.1:{port}"},
        {"name": "SANDBOXD_ISOLATION", "value": "auto"},
    ]
    container["env"] = env
    renamed = {v["name"]: f"{name}-{v['name']}" for v in pod["volumes"] if "emptyDir" in v}
    for volume in pod["volumes"]:
        volume["name"] = renamed.get(volume["name"], volume["name"])
        if "secret" in volume:
            volume["secret"]["optional"] = False
    for mount in container["volumeMounts"]:
        mount["name"] = renamed.get(mount["name"], mount["name"])
    return d


def empty_dirs(deployment: dict[str, Any]) -> list[str]:
    """The podman volumes a play of ``deployment`` (``for_podman``'s) makes for its emptyDirs."""
    return [v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "emptyDir" in v]


def leftovers(podman: Podman, names: Sequence[tuple[str, str]]) -> list[str]:
    """Which of ``(kind, name)`` still exist."""
    return [f"{what} {name}" for what, name in names if podman.exists(what, name)]
