"""The Helm chart, rendered by the pinned helm and validated against the Kubernetes
schemas of the pinned release (kubernetes-validate)."""

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from certs.cli import build_parser
from gpupack.policy import BUILTIN, policy_from_object
from gpupack.quantity import parse_compute, parse_memory

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpupack"
KUBERNETES = "1.35"
NAMESPACE = "gpupack-system"
CUSTOM = [
    "--set=webhook.replicas=3",
    "--set=webhook.failurePolicy=Fail",
    "--set=webhook.timeoutSeconds=10",
    "--set=webhook.nodeSelector.pool=system",
    "--set=webhook.tolerations[0].key=dedicated",
    "--set=webhook.tolerations[0].operator=Exists",
    "--set=webhook.priorityClassName=system-cluster-critical",
    "--set=imagePullSecrets[0].name=registry",
    "--set=image.tag=0.2.0",
    "--set=certificates.extraDnsNames[0]=webhook.example.internal",
    "--set=certificates.keyAlgorithm=rsa-3072",
    "--set=excludedNamespaces[0]=monitoring",
    "--set=policies.install=false",
    "--set=metrics.serviceMonitor.enabled=true",
    "--set=metrics.grafanaDashboard.enabled=true",
]


def helm() -> str:
    path = Path(os.environ.get("GPUPACK_BIN_DIR", ""), "helm")
    assert path.is_file(), "helm is built by hack/lib/binaries.sh: run the tests through hack/test"
    return str(path)


def render(*args: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [
            helm(),
            "template",
            "gpupack",
            str(CHART),
            f"--namespace={NAMESPACE}",
            f"--kube-version={KUBERNETES}.0",
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_in(namespace: str, *args: str) -> list[dict[str, Any]]:
    return render(f"--namespace={namespace}", *args)  # the last --namespace wins


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_lint_passes() -> None:
    result = subprocess.run(
        [helm(), "lint", "--strict", str(CHART)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([], id="defaults"),
        pytest.param(CUSTOM, id="custom"),
        pytest.param(["--set=certificates.provider=cert-manager"], id="cert-manager"),
    ],
)
def test_rendered_objects_are_valid_kubernetes(values: list[str]) -> None:
    docs = render(*values)
    for doc in docs:
        if doc["apiVersion"].startswith(
            ("gpupack.io/", "monitoring.coreos.com/", "cert-manager.io/")
        ):
            continue  # custom kinds: validated by their CRDs' schemas on the API server
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    assert {d["kind"] for d in docs} >= {
        "Deployment",
        "Service",
        "MutatingWebhookConfiguration",
        "PodDisruptionBudget",
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("webhook.failurePolicy=Maybe", "/webhook/failurePolicy", id="failure-policy"),
        pytest.param("webhook.replicas=0", "/webhook/replicas", id="no-replicas"),
        pytest.param(
            "certificates.keyAlgorithm=dsa", "/certificates/keyAlgorithm", id="key-algorithm"
        ),
        pytest.param("webhook.unknown=1", "unknown", id="unknown-key"),
    ],
)
def test_the_schema_rejects_bad_values_naming_them(value: str, message: str) -> None:
    result = subprocess.run(
        [
            helm(),
            "template",
            "gpupack",
            str(CHART),
            f"--kube-version={KUBERNETES}.0",
            f"--set={value}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert message in result.stderr


RULES = [
    {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE"],
        "resources": ["pods"],
        "scope": "Namespaced",
    }
]
SETTINGS = {
    "admissionReviewVersions": ["v1"],
    "sideEffects": "NoneOnDryRun",
    "reinvocationPolicy": "IfNeeded",
    "failurePolicy": "Ignore",
    "timeoutSeconds": 5,
    "matchPolicy": "Equivalent",
    "rules": RULES,
}
SYSTEM = {
    "key": "kubernetes.io/metadata.name",
    "operator": "NotIn",
    "values": ["kube-system", NAMESPACE],
}
EXPECTED_ENTRIES = [
    {  # namespaces labelled enabled, minus pods labelled disabled
        "name": "namespaces.gpupack.io",
        "namespaceSelector": {
            "matchLabels": {"gpupack.io/optimize": "enabled"},
            "matchExpressions": [SYSTEM],
        },
        "objectSelector": {
            "matchExpressions": [
                {"key": "gpupack.io/optimize", "operator": "NotIn", "values": ["disabled"]}
            ]
        },
        **SETTINGS,
    },
    {  # pods labelled enabled in namespaces that are not: the two entries never overlap
        "name": "workloads.gpupack.io",
        "namespaceSelector": {
            "matchExpressions": [
                SYSTEM,
                {"key": "gpupack.io/optimize", "operator": "NotIn", "values": ["enabled"]},
            ]
        },
        "objectSelector": {"matchLabels": {"gpupack.io/optimize": "enabled"}},
        **SETTINGS,
    },
]


def test_the_chart_registers_the_webhook_as_specified() -> None:
    """The entries the issue asks for; the integration tier registers this very rendering."""
    (config,) = of_kind(render(), "MutatingWebhookConfiguration")
    entries = [
        {k: v for k, v in e.items() if k not in ("clientConfig", "matchConditions")}
        for e in config["webhooks"]
    ]
    assert entries[:2] == EXPECTED_ENTRIES
    assert [e["name"] for e in entries[2:]] == ["devices.gpupack.io"]  # below
    for entry in config["webhooks"][:2]:
        assert entry["clientConfig"]["service"] == {
            "name": "gpupack-webhook",
            "namespace": NAMESPACE,
            "path": "/mutate",
            "port": 443,
        }


def test_excluded_namespaces_join_the_system_ones() -> None:
    (config,) = of_kind(
        render("--set=excludedNamespaces[0]=monitoring"), "MutatingWebhookConfiguration"
    )
    for entry in config["webhooks"][:2]:
        names = next(
            e
            for e in entry["namespaceSelector"]["matchExpressions"]
            if e["key"] == "kubernetes.io/metadata.name"
        )
        assert names["values"] == ["kube-system", NAMESPACE, "monitoring"]


MAP_SERVED = "--api-versions=admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


def device_env_mutations(*args: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the webhook's devices.gpupack.io entries, the MutatingAdmissionPolicies)."""
    docs = render(*args)
    (config,) = of_kind(docs, "MutatingWebhookConfiguration")
    entries = [e for e in config["webhooks"] if e["name"] == "devices.gpupack.io"]
    return entries, of_kind(docs, "MutatingAdmissionPolicy")


def test_no_image_chooses_its_gpus_the_api_server_or_the_webhook_says_void() -> None:
    """Where the API server serves MutatingAdmissionPolicy it sets NVIDIA_VISIBLE_DEVICES
    itself; elsewhere the webhook's /devices does, for every namespace but the exempt ones;
    the validating policy refuses what neither guarded either way."""
    exempt: dict[str, Any] = {"key": "kubernetes.io/metadata.name", "operator": "NotIn"}
    exempt["values"] = [NAMESPACE, "kube-system", "gpu-operator", "nvidia-gpu-operator"]
    (entry,), policies = device_env_mutations()
    assert policies == []
    assert entry["clientConfig"]["service"]["path"] == "/devices"
    assert entry["failurePolicy"] == "Ignore"  # the validating policy fails closed
    assert entry["reinvocationPolicy"] == "IfNeeded"  # sidecars injected after us
    assert entry["namespaceSelector"] == {"matchExpressions": [exempt]}
    assert "objectSelector" not in entry
    assert {r["resources"][0] for r in entry["rules"]} == {"pods", "pods/ephemeralcontainers"}

    entries, (policy,) = device_env_mutations(MAP_SERVED)
    assert entries == []
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["failurePolicy"] == "Fail"
    (binding,) = of_kind(render(MAP_SERVED), "MutatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchExpressions": [exempt]}
    assert device_env_mutations(MAP_SERVED, "--set=security.deviceEnv.mutation=webhook")[1] == []

    for scope in (MAP_SERVED, ""):
        off = device_env_mutations(*filter(None, [scope, "--set=security.deviceEnv.scope=optedIn"]))
        assert off == ([], [])
    (validating,) = [
        p
        for p in of_kind(render(), "ValidatingAdmissionPolicy")
        if p["metadata"]["name"].endswith("-pods")
    ]
    assert any(
        "NVIDIA_VISIBLE_DEVICES=void" in v.get("messageExpression", "")
        for v in validating["spec"]["validations"]
    )


def test_the_policy_mutation_is_refused_where_the_api_server_cannot_serve_it() -> None:
    failed = subprocess.run(
        [helm(), "template", "gpupack", str(CHART), f"--kube-version={KUBERNETES}.0",
         "--set=security.deviceEnv.mutation=policy"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert failed.returncode != 0
    assert "serves no MutatingAdmissionPolicy" in failed.stderr


def test_the_default_policies_are_the_builtins() -> None:
    policies = {p["metadata"]["name"]: p["spec"] for p in of_kind(render(), "GPUPolicy")}
    assert set(policies) == set(BUILTIN)
    for name, builtin in BUILTIN.items():
        spec = policies[name]
        assert spec["historyWindowSeconds"] == builtin.history_window_seconds
        assert (spec["percentile"], spec["computeHeadroom"], spec["memoryHeadroom"]) == (
            builtin.percentile,
            builtin.compute_headroom,
            builtin.memory_headroom,
        )
        assert parse_compute(spec["minCompute"], name) == builtin.min_compute
        assert parse_compute(spec["maxCompute"], name) == builtin.max_compute
        assert parse_compute(spec["initialCompute"], name) == builtin.initial_compute
        assert parse_memory(spec["minMemory"], name) == builtin.min_memory
        assert parse_memory(spec["initialMemory"], name) == builtin.initial_memory
        assert (
            parse_memory(spec["maxMemory"], name) if "maxMemory" in spec else None
        ) == builtin.max_memory
        assert spec["sharing"] == builtin.sharing.value
        assert policy_from_object({"metadata": {"name": name}, "spec": spec}) == builtin
    assert of_kind(render("--set=policies.install=false"), "GPUPolicy") == []


def test_the_hook_job_runs_gpupack_certs_with_arguments_it_accepts() -> None:
    (job,) = [
        j for j in of_kind(render(*CUSTOM), "Job") if j["metadata"]["name"] == "gpupack-certs"
    ]
    assert (
        job["metadata"]["annotations"]["helm.sh/hook"]
        == "pre-install,pre-upgrade,post-install,post-upgrade"
    )
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["gpupack-certs"]
    args = build_parser().parse_args(container["args"])
    assert (args.namespace, args.secret_name, args.service_name) == (
        NAMESPACE,
        "gpupack-webhook-tls",
        "gpupack-webhook",
    )
    assert args.dns_name == ["webhook.example.internal"]
    assert args.key_algorithm == "rsa-3072"


def test_workloads_run_unprivileged_and_read_only() -> None:
    docs = render()
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "Job")]
    for spec in pods:
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
    deployment = next(
        d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "gpupack-webhook"
    )
    tls = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert {i["key"] for i in tls["secret"]["items"]} == {
        "tls.crt",
        "tls.key",
    }  # never the CA's key


def test_the_dashboard_queries_only_metrics_gpupack_exports() -> None:
    from prometheus_client import CollectorRegistry

    from exporter.collector import ExporterCollector, Scrape
    from exporter.readings import Readings
    from scheduler.metrics import Metrics, Usage
    from webhook.metrics import WebhookMetrics

    registry = CollectorRegistry()
    WebhookMetrics(registry)
    Metrics(registry, lambda: Usage(0, 0, 0, 0, 0, leader=False))
    registry.register(ExporterCollector(lambda: Scrape(Readings())))
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    exported = {
        family.name + suffix
        for family in registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }
    (config_map,) = [
        d
        for d in of_kind(render("--set=metrics.grafanaDashboard.enabled=true"), "ConfigMap")
        if d["metadata"]["name"] == "gpupack-dashboard"
    ]
    dashboard = json.loads(config_map["data"]["gpupack.json"])
    panels = {panel["title"]: panel for panel in dashboard["panels"]}
    assert len(panels) == len(dashboard["panels"])  # titles name panels
    assert len({panel["id"] for panel in panels.values()}) == len(panels)
    cells = [
        (x, y)
        for panel in panels.values()
        for pos in [panel["gridPos"]]
        for x in range(pos["x"], pos["x"] + pos["w"])
        for y in range(pos["y"], pos["y"] + pos["h"])
    ]
    assert len(cells) == len(set(cells))  # no panel hides another
    assert all(0 <= x < 24 for x, _ in cells)  # Grafana's grid is 24 columns wide
    exprs = {
        title: [target["expr"] for target in panel.get("targets", ())]
        for title, panel in panels.items()
    }
    variables = [
        str(variable.get("definition", "")) for variable in dashboard["templating"]["list"]
    ]
    queried = {
        name
        for expr in [*(e for es in exprs.values() for e in es), *variables]
        for name in re.findall(r"gpupack_[a-z_]+", expr)
    }
    assert queried <= exported

    def panels_querying(*fragments: str) -> list[str]:
        """Titles of the panels whose queries, together, hold every fragment."""
        return [t for t, es in exprs.items() if all(any(f in e for e in es) for f in fragments)]

    # What the issue asks for: per-pod use against allocation, GPUs held against GPUs
    # used, and the packing ratio.
    for used, allocated in (
        ("gpupack_pod_gpu_compute_ratio", "gpupack_pod_gpu_compute_allocated_ratio"),
        ("gpupack_pod_gpu_memory_used_bytes", "gpupack_pod_gpu_memory_allocated_bytes"),
    ):
        assert panels_querying(
            f"sum by (namespace, pod) ({used}", f"sum by (namespace, pod) ({allocated}"
        )
    assert panels_querying("count(gpupack_gpu_capacity_pod)", "gpupack_scheduler_gpus_in_use")
    packing = panels_querying(
        "count(gpupack_pod_gpu_compute_allocated_ratio) / count(gpupack_gpu_capacity_pod)"
    )
    assert any("packing" in title.lower() for title in packing)
    assert any(panels[title]["type"] == "stat" for title in packing)
    assert panels_querying("gpupack_scheduler_allocated_compute_ratio")


def rule_verbs(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> every verb the role's rules grant on it."""
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault((group, resource), set()).update(rule["verbs"])
    return verbs


def test_the_scheduler_renders_its_flags_and_least_privilege_rbac() -> None:
    from scheduler.cli import build_parser

    docs = render()
    deployment = next(
        d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "gpupack-scheduler"
    )
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    extender = containers["extender"]
    parsed = build_parser().parse_args(extender["args"])  # every rendered flag exists
    assert extender["command"] == ["gpupack-scheduler"]
    assert parsed.address == "127.0.0.1"  # the verbs are for the kube-scheduler beside it
    (role,) = [
        d for d in of_kind(docs, "ClusterRole") if d["metadata"]["name"] == "gpupack-scheduler"
    ]
    verbs = rule_verbs(role)
    # Cluster-wide, a pod's pod-deletion-cost only: the admission policy fences the patch.
    assert verbs[("", "pods")] == {"get", "list", "watch", "patch"}
    (fence,) = [
        p
        for p in of_kind(docs, "ValidatingAdmissionPolicy")
        if p["metadata"]["name"] == "gpupack-immutable-allocations"
    ]
    outside = "request.namespace != 'gpupack-system'"
    assert outside in fence["spec"]["matchConditions"][0]["expression"]
    assert "system:serviceaccount:gpupack-system:gpupack-scheduler" in str(fence)
    assert "the scheduler may only change the pod-deletion-cost" in str(fence)
    without = render("--set=scheduler.deletionCost.enabled=false")
    (role_without,) = [
        d for d in of_kind(without, "ClusterRole") if d["metadata"]["name"] == "gpupack-scheduler"
    ]
    assert rule_verbs(role_without)[("", "pods")] == {"get", "list", "watch"}  # no write
    policies = str(of_kind(without, "ValidatingAdmissionPolicy"))
    assert "pod-deletion-cost" not in policies
    assert "request.namespace != 'gpupack-system'" not in policies
    assert verbs[("", "pods/binding")] == {"create"}
    assert verbs[("", "pods/status")] == {"patch"}  # the condition that requeues a pod
    assert ("", "secrets") not in verbs
    (local,) = [d for d in of_kind(docs, "Role") if d["metadata"]["name"] == "gpupack-scheduler"]
    lease_updates = [r for r in local["rules"] if "update" in r["verbs"]]
    # Its two kube-schedulers' own Leases only.
    expected = ["gpupack-scheduler", "gpupack-scheduler-capacity"]
    assert all(r.get("resourceNames") == expected for r in lease_updates)


@pytest.mark.parametrize(
    ("sets", "image"),
    [
        pytest.param((), "registry.k8s.io/pause:3.10", id="default"),
        pytest.param(("scheduler.capacityImage=my/pause:1",), "my/pause:1", id="scheduler"),
        # Values files written before the value moved keep working.
        pytest.param(("webhook.capacityImage=old/pause:1",), "old/pause:1", id="deprecated"),
    ],
)
def test_the_capacity_image_reaches_the_scheduler(sets: tuple[str, ...], image: str) -> None:
    from scheduler.cli import build_parser

    docs = render(*(f"--set={s}" for s in sets))
    deployment = next(
        d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "gpupack-scheduler"
    )
    (extender,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"
    ]
    assert build_parser().parse_args(extender["args"]).capacity_image == image


@pytest.mark.parametrize(
    ("autoscaler", "writes_nodes"),
    [
        pytest.param("auto", True, id="auto"),
        pytest.param("karpenter", True, id="karpenter"),
        pytest.param("cluster-autoscaler", False, id="cluster-autoscaler"),
        pytest.param("none", False, id="none"),
    ],
)
def test_the_scheduler_may_label_nodes_only_where_karpenter_may_run_and_only_so(
    autoscaler: str, writes_nodes: bool
) -> None:
    """Where Karpenter may run, the extender adds gpupack.io/node to GPU nodes (capacity
    pods name avoided nodes by it): patch on nodes, fenced by an admission policy to
    that one label. Elsewhere it writes no node and has no such permission."""
    from scheduler.cli import build_parser

    docs = render(f"--set=scheduler.autoscaler={autoscaler}")
    deployment = next(
        d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "gpupack-scheduler"
    )
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert build_parser().parse_args(containers["extender"]["args"]).autoscaler == autoscaler
    (role,) = [
        d for d in of_kind(docs, "ClusterRole") if d["metadata"]["name"] == "gpupack-scheduler"
    ]
    expected = {"get", "list", "watch", "patch"} if writes_nodes else {"get", "list", "watch"}
    assert rule_verbs(role)[("", "nodes")] == expected
    fences = [
        p
        for p in of_kind(docs, "ValidatingAdmissionPolicy")
        if p["metadata"]["name"] == "gpupack-scheduler-node-writes"
    ]
    assert len(fences) == (1 if writes_nodes else 0)
    bindings = [
        b
        for b in of_kind(docs, "ValidatingAdmissionPolicyBinding")
        if b["spec"]["policyName"] == "gpupack-scheduler-node-writes"
    ]
    assert [b["spec"]["validationActions"] for b in bindings] == (
        [["Deny"]] if writes_nodes else []
    )


def test_an_autoscaler_the_chart_does_not_know_is_refused_by_its_schema() -> None:
    with pytest.raises(subprocess.CalledProcessError) as error:
        render("--set=scheduler.autoscaler=keda")
    assert "autoscaler" in error.value.stderr


def test_the_gpupack_kube_schedulers_run_shares_with_the_extender_and_capacity_apart() -> None:
    docs = render()
    (config_map,) = [
        d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"] == "gpupack-scheduler-config"
    ]
    shares = yaml.safe_load(config_map["data"]["config.yaml"])
    capacity = yaml.safe_load(config_map["data"]["capacity.yaml"])
    for config in (shares, capacity):
        assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
        assert config["percentageOfNodesToScore"] == 100
        assert config["leaderElection"]["resourceNamespace"] == NAMESPACE
    assert [p["schedulerName"] for p in shares["profiles"]] == ["gpupack-scheduler"]
    (extender,) = shares["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:8888"
    assert (extender["filterVerb"], extender["bindVerb"]) == ("filter", "bind")
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False
    # Capacity pods have a queue of their own: one kube-scheduler's queue would put them
    # behind every share queued before them.
    (packing,) = capacity["profiles"]
    assert packing["schedulerName"] == "gpupack-capacity"
    assert "extenders" not in capacity
    assert packing["plugins"]["score"]["enabled"] == [{"name": "NodeResourcesFit", "weight": 5}]
    (fit,) = packing["pluginConfig"]
    assert fit["args"]["scoringStrategy"] == {
        "type": "MostAllocated",
        "resources": [{"name": "nvidia.com/gpu", "weight": 1}],
    }
    leases = [c["leaderElection"]["resourceName"] for c in (shares, capacity)]
    assert leases == ["gpupack-scheduler", "gpupack-scheduler-capacity"]
    (role,) = [d for d in of_kind(docs, "Role") if d["metadata"]["name"] == "gpupack-scheduler"]
    lease_rules = [r for r in role["rules"] if r["resources"] == ["leases"]]
    assert {tuple(r.get("resourceNames", ())) for r in lease_rules} == {(), tuple(leases)}
    deployment = next(
        d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "gpupack-scheduler"
    )
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert containers["kube-scheduler"]["args"][0] == "--config=/etc/gpupack-scheduler/config.yaml"
    second = containers["capacity-scheduler"]
    assert second["image"] == containers["kube-scheduler"]["image"]
    assert second["args"][:2] == [
        "--config=/etc/gpupack-scheduler/capacity.yaml",
        "--secure-port=10260",  # the pod's network is shared: 10259 is the other one's
    ]
    bindings = {
        d["roleRef"]["name"]
        for d in of_kind(docs, "ClusterRoleBinding")
        if d["metadata"]["name"].startswith("gpupack-scheduler")
    }
    assert {"system:kube-scheduler", "system:volume-scheduler"} <= bindings


@pytest.mark.parametrize(
    ("version", "image"),
    [
        pytest.param("1.35.4", "registry.k8s.io/kube-scheduler:v1.35.4", id="upstream"),
        pytest.param("v1.33.2+k3s1", "registry.k8s.io/kube-scheduler:v1.33.2", id="k3s"),
        pytest.param("v1.32.4-eks-a737599", "registry.k8s.io/kube-scheduler:v1.32.4", id="eks"),
    ],
)
def test_the_kube_scheduler_image_follows_the_cluster_version(version: str, image: str) -> None:
    docs = render(f"--kube-version={version}")
    deployment = next(
        d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "gpupack-scheduler"
    )
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert containers["kube-scheduler"]["image"] == image


@pytest.mark.parametrize("version", ["1.31.9", "v1.31.2+k3s1", "v1.30.4-eks-a737599"])
def test_a_cluster_older_than_the_floor_is_refused_before_anything_is_installed(
    version: str,
) -> None:
    """Before 1.32 kube-scheduler requeues no pod on a status-only update, so a pod
    gpupack refused waits minutes for room it has (docs/install.md, "Kubernetes
    versions"): Helm refuses the release instead."""
    with pytest.raises(subprocess.CalledProcessError) as refused:
        render(f"--kube-version={version}")
    assert "kubeVersion: >=1.32.0-0" in refused.value.stderr, refused.value.stderr


def test_a_pinned_kube_scheduler_tag_wins() -> None:
    docs = render("--set=scheduler.kubeScheduler.image.tag=v1.34.1")
    deployment = next(
        d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "gpupack-scheduler"
    )
    images = [c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert "registry.k8s.io/kube-scheduler:v1.34.1" in images


def test_the_webhook_reads_policies_in_its_namespace_and_recommendations_everywhere() -> None:
    """Least privilege: GPURecommendations live in the workloads' namespaces, GPUPolicy
    objects only in the release namespace, and the webhook writes nothing; the local
    cluster binds exactly these rules."""
    from hack.localcluster import chart_rbac

    docs = render()

    def rules(kind: str) -> list[dict[str, Any]]:
        (role,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == "gpupack-webhook"]
        assert kind == "ClusterRole" or role["metadata"]["namespace"] == NAMESPACE
        found: list[dict[str, Any]] = role["rules"]
        return found

    cluster_wide, namespaced = rules("ClusterRole"), rules("Role")
    read = ["get", "list", "watch"]
    gpupack_io = [r for r in cluster_wide if r["apiGroups"] == ["gpupack.io"]]
    assert gpupack_io == [
        {"apiGroups": ["gpupack.io"], "resources": ["gpurecommendations"], "verbs": read}
    ]
    assert namespaced == [
        {"apiGroups": ["gpupack.io"], "resources": ["gpupolicies"], "verbs": read}
    ]
    # It writes nothing: capacity pods are gpupack-scheduler's to create.
    assert all(set(rule["verbs"]) <= set(read) for rule in cluster_wide + namespaced)
    local = chart_rbac(Path(helm()), "templates/webhook.yaml")
    assert {obj["kind"]: obj["rules"] for obj in local if "rules" in obj} == {
        "ClusterRole": cluster_wide,
        "Role": namespaced,
    }
    bindings = [obj for obj in local if obj["kind"].endswith("Binding")]
    assert [b["subjects"] for b in bindings] == [
        [{"kind": "ServiceAccount", "name": "gpupack-webhook", "namespace": NAMESPACE}]
    ] * 2


def test_the_uninstall_hook_runs_as_the_scheduler_with_the_release_namespace() -> None:
    (job,) = [j for j in of_kind(render(), "Job") if j["metadata"]["name"] == "gpupack-uninstall"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpupack-scheduler"  # exempt from the held-GPU policy
    assert pod["containers"][0]["command"] == ["gpupack-scheduler-uninstall"]
    assert pod["containers"][0]["args"] == [f"--namespace={NAMESPACE}"]


def test_every_binary_takes_gpupack_namespace_from_the_release() -> None:
    docs = render_in("gpu-sharing")
    for doc in docs:
        if doc["kind"] in ("Deployment", "DaemonSet"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container["image"].startswith("registry.k8s.io/kube-scheduler"):
                    continue
                assert "--namespace=gpu-sharing" in container["args"], doc["metadata"]["name"]
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    text = json.dumps(policies)
    assert "system:serviceaccount:gpu-sharing:gpupack-scheduler" in text
    assert "gpupack-system" not in text


def test_every_gpupack_container_is_probed_for_liveness_and_readiness() -> None:
    docs = render("--set=webhook.replicas=2")
    probed = {}
    for doc in docs:
        if doc["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            probed[f"{doc['metadata']['name']}/{container['name']}"] = (
                container.get("livenessProbe", {}).get("httpGet", {}).get("path"),
                container.get("readinessProbe", {}).get("httpGet", {}).get("path"),
            )
    assert probed["gpupack-scheduler/extender"] == ("/healthz", "/readyz")
    assert probed["gpupack-recommender/recommender"] == ("/healthz", "/readyz")
    assert probed["gpupack-webhook/webhook"][1] == "/readyz"
    assert all(live for live, _ in probed.values()), probed


def test_network_policies_leave_only_the_webhook_and_the_chosen_scrapers_in() -> None:
    assert of_kind(render(), "NetworkPolicy") == []  # off: it needs an enforcing CNI
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
    docs = render(
        "--set=networkPolicy.enabled=true",
        "--set=networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=mon",
    )
    policies = {p["metadata"]["name"]: p["spec"] for p in of_kind(docs, "NetworkPolicy")}
    for policy in of_kind(docs, "NetworkPolicy"):
        kubernetes_validate.validate(policy, KUBERNETES, strict=True)
    assert policies["gpupack-default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    webhook = policies["gpupack-webhook"]["ingress"]
    assert webhook[0] == {"ports": [{"port": 8443, "protocol": "TCP"}]}  # the API server
    assert webhook[1] == {"from": [monitoring], "ports": [{"port": 9090, "protocol": "TCP"}]}
    exporter = policies["gpupack-exporter"]["ingress"]
    assert exporter[0]["from"] == [monitoring]
    assert exporter[1]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "recommender"
    )
    closed = render("--set=networkPolicy.enabled=true")
    scheduler = next(
        p for p in of_kind(closed, "NetworkPolicy") if p["metadata"]["name"] == "gpupack-scheduler"
    )
    assert scheduler["spec"].get("ingress") is None  # nobody scrapes unless chosen
