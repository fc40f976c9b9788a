"""packaging/k8s: the CRI-O and containerd Deployments are one pod but for the cgroup access,
the namespace admits them, they keep to a dedicated node pool one per node, and the HPA scales
down without a custom-metrics adapter."""

import copy
from typing import Any

from .test_manifests import K8S, VARIANTS, container, documents, env, kind

# What Pod Security "baseline" lets a container add (the Pod Security Standards, Capabilities).
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
CRIO_ANNOTATION = "io.kubernetes.cri-o.cgroup2-mount-hierarchy-rw"


def deployment(variant: str) -> dict[str, Any]:
    return copy.deepcopy(kind("Deployment", VARIANTS[variant]))


def test_the_variants_differ_only_in_cgroup_access() -> None:
    crio, containerd = deployment("cri-o"), deployment("containerd")
    assert crio["metadata"]["labels"].pop("sandboxd.io/variant") == "cri-o"
    assert containerd["metadata"]["labels"].pop("sandboxd.io/variant") == "containerd"
    annotations = crio["spec"]["template"]["metadata"]["annotations"]
    assert annotations.pop(CRIO_ANNOTATION) == "true"
    assert CRIO_ANNOTATION not in containerd["spec"]["template"]["metadata"]["annotations"]
    (crio_container,) = crio["spec"]["template"]["spec"]["containers"]
    (containerd_container,) = containerd["spec"]["template"]["spec"]["containers"]
    assert containerd_container["securityContext"] == {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "privileged": True,
        "readOnlyRootFilesystem": True,
    }
    crio_security = crio_container.pop("securityContext")
    assert (crio_security["privileged"], crio_security["allowPrivilegeEscalation"]) == (
        False,
        False,
    )
    del containerd_container["securityContext"]
    # Everything else, env, ports, probes, hooks, volumes, node pool, is the same.
    assert containerd == crio
    assert env("cri-o") == env("containerd")
    for part in ("ports", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle"):
        assert container("cri-o")[part] == container("containerd")[part], part


def test_kubectl_selects_one_deployment_per_variant() -> None:
    """The documented commands: ``kubectl apply -f packaging/k8s/`` (the top directory only)
    for CRI-O, and with ``-l 'sandboxd.io/variant!=cri-o' -f packaging/k8s/containerd/`` for
    containerd: every object once, and one Deployment each time."""
    top = [(f, d) for f, d in documents() if "/" not in f]
    with_containerd = top + [(f, d) for f, d in documents() if f.startswith("containerd/")]
    selected = [
        (f, d)
        for f, d in with_containerd
        if d["metadata"].get("labels", {}).get("sandboxd.io/variant") != "cri-o"
    ]
    for chosen, variant in ((top, "cri-o"), (selected, "containerd")):
        kinds = sorted(d["kind"] for _, d in chosen)
        assert kinds == sorted(
            [
                "Deployment",
                "HorizontalPodAutoscaler",
                "Namespace",
                "NetworkPolicy",
                "PodDisruptionBudget",
                "Service",
            ]
        )
        (name,) = [f for f, d in chosen if d["kind"] == "Deployment"]
        assert name == VARIANTS[variant]


def test_the_namespace_enforces_the_level_the_pods_need() -> None:
    namespace = kind("Namespace", "namespace.yaml")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    # Why not baseline: the CRI-O variant adds capabilities it refuses, the other is privileged.
    added = set(container("cri-o")["securityContext"]["capabilities"]["add"])
    assert added - BASELINE_CAPABILITIES == {"SYS_ADMIN", "NET_ADMIN", "SYS_RESOURCE"}
    assert container("containerd")["securityContext"]["privileged"] is True
    for variant in VARIANTS:
        text = (K8S / VARIANTS[variant]).read_text()
        assert 'Pod Security: "privileged" level' in text, variant
    assert "cgroup access on containerd" in (K8S / VARIANTS["containerd"]).read_text()


def test_a_dedicated_node_pool_one_replica_per_node() -> None:
    for variant in VARIANTS:
        template = kind("Deployment", VARIANTS[variant])["spec"]["template"]
        pod = template["spec"]
        assert pod["nodeSelector"] == {"sandboxd.io/dedicated": "true"}
        (toleration,) = pod["tolerations"]
        assert toleration == {
            "key": "sandboxd.io/dedicated",
            "operator": "Equal",
            "value": "true",
            "effect": "NoSchedule",
        }
        anti = pod["affinity"]["podAntiAffinity"]
        assert (
            "requiredDuringSchedulingIgnoredDuringExecution" not in anti
        )  # a small pool still fits
        (preferred,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        term = preferred["podAffinityTerm"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert (
            term["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        )


def test_the_hpa_scales_down_without_a_metrics_adapter() -> None:
    hpa = kind("HorizontalPodAutoscaler")
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["Resource"]
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    optional = kind("HorizontalPodAutoscaler", "optional/hpa-sandbox-count.yaml")
    assert optional["metadata"]["name"] == hpa["metadata"]["name"]  # it replaces the base one
    pods = [m for m in optional["spec"]["metrics"] if m["type"] == "Pods"]
    assert [m["pods"]["metric"]["name"] for m in pods] == ["sandboxd_sandboxes"]
    assert [m for m in optional["spec"]["metrics"] if m["type"] != "Pods"] == hpa["spec"]["metrics"]
    assert {k: v for k, v in optional["spec"].items() if k != "metrics"} == {
        k: v for k, v in hpa["spec"].items() if k != "metrics"
    }
    assert "prometheus-adapter" in (K8S / "optional" / "hpa-sandbox-count.yaml").read_text()
