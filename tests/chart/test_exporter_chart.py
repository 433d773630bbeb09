"""The exporter's part of the chart: a DaemonSet on GPU nodes with what NVML and the
kubelet need, and no more permission than it uses."""

from typing import Any

import kubernetes_validate

from exporter.cli import build_parser
from tests.chart.test_chart import KUBERNETES, NAMESPACE, of_kind, render


def daemonset(*values: str) -> dict[str, Any]:
    (found,) = of_kind(render(*values), "DaemonSet")
    assert found["metadata"]["name"] == "gpupack-exporter"
    return found


def test_the_exporter_runs_on_gpu_nodes_with_host_pids_and_the_kubelet_socket() -> None:
    spec = daemonset()["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = build_parser().parse_args(container["args"])  # every rendered flag exists
    assert container["command"] == ["gpupack-exporter"]
    assert str(args.pod_resources_socket) == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert spec["hostPID"] is True
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    (mount,) = container["volumeMounts"]
    assert mount["readOnly"] is True
    (volume,) = spec["volumes"]
    assert volume["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert mount["mountPath"] == volume["hostPath"]["path"]
    context = container["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert "privileged" not in context
    assert "runtimeClassName" not in spec


def test_runtime_class_and_scheduling_values_reach_the_daemonset() -> None:
    rendered = daemonset(
        "--set=exporter.runtimeClassName=nvidia",
        "--set=exporter.nodeSelector.pool=gpu",
        "--set=exporter.priorityClassName=system-node-critical",
        "--set=exporter.port=9500",
    )
    kubernetes_validate.validate(rendered, KUBERNETES, strict=True)
    spec = rendered["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"]["pool"] == "gpu"
    assert spec["priorityClassName"] == "system-node-critical"
    (container,) = spec["containers"]
    assert build_parser().parse_args(container["args"]).port == 9500
    assert container["ports"] == [{"name": "metrics", "containerPort": 9500}]


def test_the_exporter_may_read_pods_and_patch_only_gpupacks_own() -> None:
    docs = render()
    (cluster_role,) = [
        d for d in of_kind(docs, "ClusterRole") if d["metadata"]["name"] == "gpupack-exporter"
    ]
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    (role,) = [d for d in of_kind(docs, "Role") if d["metadata"]["name"] == "gpupack-exporter"]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    (service,) = [
        d for d in of_kind(docs, "Service") if d["metadata"]["name"] == "gpupack-exporter"
    ]
    assert service["spec"]["clusterIP"] == "None"  # every exporter is scraped, not one


def test_the_exporter_can_be_left_out() -> None:
    docs = render("--set=exporter.enabled=false")
    assert of_kind(docs, "DaemonSet") == []
    assert not [d for d in docs if d["metadata"]["name"] == "gpupack-exporter"]
