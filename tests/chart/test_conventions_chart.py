"""The conventions users of NVIDIA's, HAMi's, KAI's and kube-prometheus-stack's charts
expect: overridable names, priority classes, per-component pod settings, hook
scheduling, CRDs upgraded, a PodDisruptionBudget only where it cannot block a drain,
and only GPU pods sent to the webhook."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cli import build_parser as exporter_parser
from ops.crds import build_parser as crds_parser
from recommender.cli import build_parser as recommender_parser
from scheduler.cli import build_parser as scheduler_parser
from tests.chart.test_chart import CHART, NAMESPACE, of_kind, render
from webhook.cli import build_parser as webhook_parser

JSON = dict[str, Any]
COMPONENTS = {  # values key -> (workload kind, name suffix, container)
    "webhook": ("Deployment", "webhook", "webhook"),
    "scheduler": ("Deployment", "scheduler", "extender"),
    "exporter": ("DaemonSet", "exporter", "exporter"),
    "recommender": ("Deployment", "recommender", "recommender"),
}


def workload(docs: list[JSON], component: str, prefix: str = "gpupack") -> JSON:
    kind, suffix, _ = COMPONENTS[component]
    (found,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == f"{prefix}-{suffix}"]
    return found


def container(docs: list[JSON], component: str) -> JSON:
    pod = workload(docs, component)["spec"]["template"]["spec"]
    (found,) = [c for c in pod["containers"] if c["name"] == COMPONENTS[component][2]]
    result: JSON = found
    return result


@pytest.mark.parametrize(
    ("replicas", "budgets"),
    [pytest.param(1, [], id="one"), pytest.param(2, ["gpupack-webhook"], id="two")],
)
def test_the_webhook_has_a_disruption_budget_only_with_more_than_one_replica(
    replicas: int, budgets: list[str]
) -> None:
    docs = render(f"--set=webhook.replicas={replicas}")
    names = [d["metadata"]["name"] for d in of_kind(docs, "PodDisruptionBudget")]
    assert [n for n in names if n != "gpupack-held-gpus"] == budgets


def test_priority_classes_by_default_and_overridable() -> None:
    docs = render()
    classes = {
        c: workload(docs, c)["spec"]["template"]["spec"].get("priorityClassName")
        for c in COMPONENTS
    }
    assert classes == {
        "webhook": "system-cluster-critical",
        "scheduler": "system-cluster-critical",
        "exporter": "system-node-critical",
        "recommender": None,
    }
    overridden = render(
        "--set=webhook.priorityClassName=platform", "--set=exporter.priorityClassName="
    )
    assert (
        workload(overridden, "webhook")["spec"]["template"]["spec"]["priorityClassName"]
        == "platform"
    )
    assert "priorityClassName" not in workload(overridden, "exporter")["spec"]["template"]["spec"]


def test_global_values_of_an_umbrella_chart_are_accepted() -> None:
    assert render("--set=global.imageRegistry=registry.example", "--set=global.anything.deep=1")


PARSERS = {
    "webhook": lambda args: webhook_parser().parse_args(["serve", *args]),
    "scheduler": lambda args: scheduler_parser().parse_args(args),
    "exporter": lambda args: exporter_parser().parse_args(args),
    "recommender": lambda args: recommender_parser().parse_args(args),
}


@pytest.mark.parametrize("component", list(COMPONENTS))
def test_per_component_pod_settings_reach_the_pods(component: str) -> None:
    c = component
    docs = render(
        f"--set={c}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=zone",
        f"--set={c}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        f"--set={c}.podAnnotations.team=ml-platform",
        f"--set={c}.podLabels.cost-center=gpu",
        f"--set={c}.extraArgs[0]=--log-format=text",
        f"--set={c}.extraEnv[0].name=GPUPACK_LOG_LEVEL",
        f"--set={c}.extraEnv[0].value=debug",
        f"--set={c}.securityContext.runAsUser=1234",
    )  # fmt: skip
    template = workload(docs, c)["spec"]["template"]
    assert template["metadata"]["annotations"]["team"] == "ml-platform"
    assert template["metadata"]["labels"]["cost-center"] == "gpu"
    assert template["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpupack"
    assert "nodeAffinity" in template["spec"]["affinity"]
    main = container(docs, c)
    assert main["args"][-1] == "--log-format=text"
    parsed = PARSERS[c]([a.replace("$(POD_NAME)", "pod") for a in main["args"]])
    assert parsed.log_format == "text"  # an extra flag the binary accepts
    assert {"name": "GPUPACK_LOG_LEVEL", "value": "debug"} in main["env"]
    assert main["securityContext"] == {"runAsUser": 1234}
    default = container(render(), c)["securityContext"]
    assert default.get("allowPrivilegeEscalation") is False


def test_hook_jobs_and_the_renewal_cronjob_follow_the_hook_scheduling_values() -> None:
    docs = render(
        "--set=hooks.nodeSelector.pool=system",
        "--set=hooks.tolerations[0].key=dedicated",
        "--set=hooks.tolerations[0].operator=Exists",
        "--set=hooks.priorityClassName=platform",
    )
    pods = [j["spec"]["template"]["spec"] for j in of_kind(docs, "Job")]
    pods += [c["spec"]["jobTemplate"]["spec"]["template"]["spec"] for c in of_kind(docs, "CronJob")]
    assert len(pods) == 4  # certificates, CRDs, uninstall; the renewal CronJob
    for pod in pods:
        assert pod["nodeSelector"] == {"pool": "system"}
        assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
        assert pod["priorityClassName"] == "platform"


@pytest.mark.parametrize(
    ("values", "prefix"),
    [
        pytest.param(["--set=fullnameOverride=acme"], "acme", id="fullname"),
        pytest.param(["--set=nameOverride=gpu-share"], "gpupack-gpu-share", id="name"),
    ],
)
def test_every_object_is_named_after_the_overrides(values: list[str], prefix: str) -> None:
    docs = render(*values)
    # A CSIDriver's name is the driver's, which the kubelet and the pods' volumes use.
    fixed = ("GPUPolicy", "Secret", "Service", "CSIDriver")
    named = [d for d in docs if d["kind"] not in fixed]
    for doc in named:
        name = doc["metadata"]["name"]
        assert name.startswith(prefix), f"{doc['kind']} {name}"
    for component in COMPONENTS:
        assert workload(docs, component, prefix)
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    for name in ("pods", "immutable-allocations"):
        fence = next(p for p in policies if p["metadata"]["name"] == f"{prefix}-{name}")
        assert f"system:serviceaccount:{NAMESPACE}:{prefix}-webhook" in yaml.safe_dump(fence)


def test_the_crds_are_applied_before_every_upgrade_by_a_hook_with_only_that_right() -> None:
    docs = render()
    (job,) = [j for j in of_kind(docs, "Job") if j["metadata"]["name"] == "gpupack-crds"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    (main,) = job["spec"]["template"]["spec"]["containers"]
    assert main["command"] == ["gpupack-crds"]
    crds_parser().parse_args(main["args"])
    (config_map,) = [
        c for c in of_kind(docs, "ConfigMap") if c["metadata"]["name"] == "gpupack-crds"
    ]
    for path in sorted((CHART / "crds").glob("*.yaml")):
        assert config_map["data"][path.name] == path.read_text()
    (role,) = [
        r for r in of_kind(docs, "ClusterRole") if r["metadata"]["name"].startswith("gpupack-crds")
    ]
    assert role["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "resourceNames": ["gpupolicies.gpupack.io", "gpurecommendations.gpupack.io"],
            "verbs": ["get", "patch"],
        }
    ]
    assert not [
        j
        for j in of_kind(render("--set=crds.upgrade=false"), "Job")
        if "crds" in j["metadata"]["name"]
    ]


def test_only_pods_that_ask_for_a_gpu_or_name_gpupack_are_sent_to_the_webhook() -> None:
    (config,) = of_kind(render(), "MutatingWebhookConfiguration")
    for entry in config["webhooks"]:
        if entry["name"] == "devices.gpupack.io":  # every pod with an unguarded container
            continue
        (condition,) = entry["matchConditions"]
        expression = condition["expression"]
        assert "'nvidia.com/gpu' in c.resources.limits" in expression
        assert "initContainers" in expression
        assert "object.spec.schedulerName == 'gpupack-scheduler'" in expression


def test_the_crd_files_are_what_gpupack_crds_loads() -> None:
    from ops.crds import load

    names = [crd["metadata"]["name"] for crd in load([str(Path(CHART) / "crds")])]  # type: ignore[index]
    assert names == ["gpupolicies.gpupack.io", "gpurecommendations.gpupack.io"]
