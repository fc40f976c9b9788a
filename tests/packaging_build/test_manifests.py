"""packaging/k8s validates offline against pinned Kubernetes schemas, and says what it promises.

``kubernetes-validate`` ships the OpenAPI schemas of each Kubernetes release inside the wheel;
the validation runs with every outgoing connection refused, so it cannot have fetched one.
"""

import socket
from pathlib import Path
from typing import Any

import pytest

from sandboxd.config import Config
from sandboxd.units import parse_duration

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (pip install '.[test]')"
)
yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "packaging" / "k8s"
# The oldest and the newest release the manifests are meant for.
KUBERNETES_VERSIONS = ("1.30.0", "1.34.0")
# The Deployment of each container runtime (docs/operating.rst, "Deploy on Kubernetes").
VARIANTS = {"cri-o": "deployment.yaml", "containerd": "containerd/deployment.yaml"}


def documents() -> list[tuple[str, dict[str, Any]]]:
    """Every document of every file under packaging/k8s, with its path relative to it."""
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                found.append((str(path.relative_to(K8S)), document))
    return found


def kind(name: str, filename: str | None = None) -> dict[str, Any]:
    """The one document of kind ``name`` that ``kubectl apply -f packaging/k8s/`` applies (the
    top directory, not its subdirectories), or the one in ``filename``."""
    (document,) = [
        d
        for f, d in documents()
        if d["kind"] == name and (f == filename if filename else "/" not in f)
    ]
    return document


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_strictly(version: str, offline: None) -> None:
    names = {d["kind"] for _, d in documents()}
    assert {
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
        "PodDisruptionBudget",
    } <= names
    assert {f for f, _ in documents()} >= {*VARIANTS.values(), "namespace.yaml"}
    for filename, document in documents():
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{filename} ({document['kind']}) on Kubernetes {version}: {e.message}")


def test_validation_rejects_a_broken_manifest(offline: None) -> None:
    broken = kind("Deployment")
    broken["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "ninety"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


def container(variant: str = "cri-o") -> dict[str, Any]:
    (only,) = kind("Deployment", VARIANTS[variant])["spec"]["template"]["spec"]["containers"]
    return dict(only)


def env(variant: str = "cri-o") -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(variant)["env"]}


def test_pod_ip_from_the_downward_api() -> None:
    assert env()["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_probes_and_drain_fit_the_grace_period() -> None:
    c = container()
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pod = kind("Deployment")["spec"]["template"]["spec"]
    deadline = parse_duration(env().get("SANDBOXD_DRAIN_DEADLINE") or "60s")
    assert pod["terminationGracePeriodSeconds"] > deadline
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "/usr/local/bin/sandboxd-prestop"
    wait = float(command[command.index("--wait") + 1])
    assert deadline < wait < pod["terminationGracePeriodSeconds"]


def test_token_comes_from_a_root_only_secret_file() -> None:
    token_file = env()["SANDBOXD_TOKEN_FILE"]
    mounts = {m["name"]: m for m in container()["volumeMounts"]}
    volumes = {v["name"]: v for v in kind("Deployment")["spec"]["template"]["spec"]["volumes"]}
    (name,) = [n for n, m in mounts.items() if token_file.startswith(m["mountPath"] + "/")]
    assert mounts[name]["readOnly"] is True
    secret = volumes[name]["secret"]
    assert secret["defaultMode"] == 0o400
    # Never as a value in the environment, which every exec'd process could otherwise see.
    assert [name for name in env() if "TOKEN" in name] == ["SANDBOXD_TOKEN_FILE"]


def test_least_privilege() -> None:
    security = container()["securityContext"]
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(security["capabilities"]["add"]) == {
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "KILL",
        "SETUID",
        "SETGID",
        "SYS_RESOURCE",
        "SYS_ADMIN",
        "NET_ADMIN",
    }
    pod = kind("Deployment")["spec"]["template"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert (
        pod["metadata"]["annotations"]["io.kubernetes.cri-o.cgroup2-mount-hierarchy-rw"] == "true"
    )


def test_every_setting_is_a_known_variable() -> None:
    known = set(Config.load({}).redacted())
    for name in env():
        assert name == "POD_IP" or name in known, name


def test_service_hpa_policy_and_budget_select_the_deployment() -> None:
    deployment = kind("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    port = container()["ports"][0]
    service = kind("Service")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    hpa = kind("HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2
    policy = kind("NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    for rule in policy["spec"]["ingress"]:
        assert rule["from"], "an ingress rule without from admits everyone"
        assert [p["port"] for p in rule["ports"]] == [port["containerPort"]]
    budget = kind("PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
