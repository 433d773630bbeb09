"""The node agent's part of the chart: the exporter's DaemonSet on GPU nodes with what NVML
and the kubelet need, the CSI drivers' beside it, each with no more permission than it
uses."""

from pathlib import Path
from typing import Any

import kubernetes_validate

from exporter.cli import build_parser
from node.cuda_csi import build_parser as cuda_csi_parser
from node.mps_csi import build_parser as mps_csi_parser
from tests.chart.test_certificates_chart import named
from tests.chart.test_chart import KUBERNETES, NAMESPACE, of_kind, render


def daemonset(*values: str) -> dict[str, Any]:
    return named(render(*values), "DaemonSet", "gpupack-exporter")


def csi_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The CSI drivers' DaemonSet's pod spec: a pod (and a ServiceAccount) of their own."""
    spec: dict[str, Any] = named(docs, "DaemonSet", "gpupack-csi")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "gpupack-csi"
    return spec


def container_named(spec: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in spec["containers"] if c["name"] == name]
    (container,) = found
    return container


def test_the_exporter_runs_on_gpu_nodes_with_host_pids_and_the_kubelet_socket() -> None:
    spec = daemonset()["spec"]["template"]["spec"]
    container = container_named(spec, "exporter")
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
    mount, sockets = container["volumeMounts"]
    assert mount["readOnly"] is True
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert mount["mountPath"] == volume["hostPath"]["path"]
    # Whether a pod's GPU process runs the memory shim: the cuda-csi container's roster
    # (in the CSI DaemonSet's pod), through a socket in a folder of the node both mount;
    # no capability, no host path of the kubelet's pods.
    (shared,) = [v for v in spec["volumes"] if v["name"] == sockets["name"]]
    assert shared["hostPath"]["path"] == "/run/gpupack/agent"
    assert args.shim_roster == Path(sockets["mountPath"]) / "shims.sock"
    drivers = csi_spec(render())
    driver = container_named(drivers, "cuda-csi")
    assert cuda_csi_parser().parse_args(driver["args"]).roster_socket == args.shim_roster
    assert sockets in driver["volumeMounts"]
    (theirs,) = [v for v in drivers["volumes"] if v["name"] == sockets["name"]]
    assert theirs == shared
    assert [c["name"] for c in spec["containers"]] == ["exporter"]  # the drivers elsewhere
    context = container["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    unshimmed = daemonset("--set=memoryEnforcement.enabled=false")["spec"]["template"]["spec"]
    exporter = container_named(unshimmed, "exporter")
    assert exporter["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert build_parser().parse_args(exporter["args"]).shim_roster is None
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
    container = container_named(spec, "exporter")
    assert build_parser().parse_args(container["args"]).port == 9500
    assert container["ports"] == [{"name": "metrics", "containerPort": 9500}]


def test_the_exporter_may_read_pods_and_patch_only_gpupacks_own() -> None:
    """And, for nodes NVIDIA's DRA driver manages, read the slices and gpupack's claims."""
    docs = render()
    (cluster_role,) = [
        d for d in of_kind(docs, "ClusterRole") if d["metadata"]["name"] == "gpupack-exporter"
    ]
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]},
    ]
    (role,) = [d for d in of_kind(docs, "Role") if d["metadata"]["name"] == "gpupack-exporter"]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    ]
    (service,) = [
        d for d in of_kind(docs, "Service") if d["metadata"]["name"] == "gpupack-exporter"
    ]
    assert service["spec"]["clusterIP"] == "None"  # every exporter is scraped, not one


def test_the_csi_drivers_may_only_read_pods() -> None:
    """The privileged mps-csi container's token: the pod a volume is for, nothing else."""
    docs = render()
    (cluster_role,) = [
        d for d in of_kind(docs, "ClusterRole") if d["metadata"]["name"] == "gpupack-csi"
    ]
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    assert not [d for d in of_kind(docs, "Role") if d["metadata"]["name"] == "gpupack-csi"]
    (binding,) = [
        d for d in of_kind(docs, "ClusterRoleBinding") if d["metadata"]["name"] == "gpupack-csi"
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpupack-csi", "namespace": NAMESPACE}
    ]
    for daemonset_name in ("gpupack-exporter", "gpupack-csi"):
        rendered = named(docs, "DaemonSet", daemonset_name)
        kubernetes_validate.validate(rendered, KUBERNETES, strict=True)
    off = render("--set=mps.enabled=false", "--set=memoryEnforcement.enabled=false")
    assert [d["metadata"]["name"] for d in of_kind(off, "DaemonSet")] == ["gpupack-exporter"]
    assert not [d for d in off if d["metadata"]["name"] == "gpupack-csi"]


def test_the_exporter_can_be_left_out() -> None:
    docs = render("--set=exporter.enabled=false")
    assert of_kind(docs, "DaemonSet") == []
    assert not [d for d in docs if d["metadata"]["name"] in ("gpupack-exporter", "gpupack-csi")]


def test_the_mps_csi_driver_runs_privileged_in_a_pod_of_its_own_with_the_kubelets_paths() -> None:
    docs = render("--set=mps.kubeletDir=/var/snap/microk8s/common/var/lib/kubelet/")
    spec = csi_spec(docs)
    driver = container_named(spec, "mps-csi")
    args = mps_csi_parser().parse_args(driver["args"])  # every rendered flag exists
    kubelet = "/var/snap/microk8s/common/var/lib/kubelet"
    assert args.kubelet_csi_socket == Path(f"{kubelet}/plugins/mps.gpupack.io/csi.sock")
    assert args.shm_size == "256Mi"
    assert driver["securityContext"]["privileged"] is True
    assert driver["securityContext"]["runAsUser"] == 0  # the image's user cannot mount
    mounts = {m["name"]: m for m in driver["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert mounts["mps-pods"]["mountPropagation"] == "Bidirectional"
    assert mounts["mps-pods"]["mountPath"] == volumes["mps-pods"] == f"{kubelet}/pods"
    assert mounts["mps-root"]["mountPropagation"] == "Bidirectional"
    assert volumes["mps-root"] == "/run/gpupack/mps"
    assert volumes["mps-registration"] == f"{kubelet}/plugins_registry"
    assert "privileged" not in container_named(spec, "cuda-csi")["securityContext"]
    exporter = container_named(daemonset()["spec"]["template"]["spec"], "exporter")
    assert "privileged" not in exporter["securityContext"]
    (driver_object,) = [d for d in of_kind(docs, "CSIDriver") if "mps" in d["metadata"]["name"]]
    assert driver_object["metadata"]["name"] == "mps.gpupack.io"
    assert driver_object["spec"]["podInfoOnMount"] is True
    assert driver_object["spec"]["volumeLifecycleModes"] == ["Ephemeral"]
    assert driver_object["spec"]["attachRequired"] is False
    kubernetes_validate.validate(driver_object, KUBERNETES, strict=True)


def test_with_mps_off_nothing_privileged_runs_and_the_webhook_keeps_mps_pods_whole() -> None:
    docs = render("--set=mps.enabled=false", "--set=memoryEnforcement.enabled=false")
    assert [d["metadata"]["name"] for d in of_kind(docs, "DaemonSet")] == ["gpupack-exporter"]
    assert of_kind(docs, "CSIDriver") == []
    webhook = named(docs, "Deployment", "gpupack-webhook")["spec"]["template"]["spec"]
    assert "--no-mps" in webhook["containers"][0]["args"]
    assert (
        "--no-mps"
        not in named(render(), "Deployment", "gpupack-webhook")["spec"]["template"]["spec"][
            "containers"
        ][0]["args"]
    )


def test_the_memory_shims_driver_runs_as_root_without_privilege_or_capabilities() -> None:
    docs = render("--set=mps.kubeletDir=/var/snap/microk8s/common/var/lib/kubelet/")
    spec = csi_spec(docs)
    driver = container_named(spec, "cuda-csi")
    args = cuda_csi_parser().parse_args(driver["args"])  # every rendered flag exists
    kubelet = "/var/snap/microk8s/common/var/lib/kubelet"
    assert args.kubelet_csi_socket == Path(f"{kubelet}/plugins/cuda.gpupack.io/csi.sock")
    assert str(args.library) == "/opt/gpupack/lib/libgpupack-cuda.so"  # the image's
    context = driver["securityContext"]
    assert "privileged" not in context
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert context["runAsUser"] == 0  # the kubelet's pod directories are root's
    mounts = {m["name"]: m for m in driver["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert "mountPropagation" not in mounts["cuda-pods"]  # it mounts nothing
    assert mounts["cuda-pods"]["mountPath"] == volumes["cuda-pods"] == f"{kubelet}/pods"
    assert args.pods_dir == Path(f"{kubelet}/pods")  # where the roster finds the budgets
    (driver_object,) = [d for d in of_kind(docs, "CSIDriver") if "cuda" in d["metadata"]["name"]]
    assert driver_object["metadata"]["name"] == "cuda.gpupack.io"
    assert driver_object["spec"]["podInfoOnMount"] is True
    assert driver_object["spec"]["volumeLifecycleModes"] == ["Ephemeral"]
    kubernetes_validate.validate(driver_object, KUBERNETES, strict=True)
    webhook = named(docs, "Deployment", "gpupack-webhook")["spec"]["template"]["spec"]
    assert "--memory-enforcement" in webhook["containers"][0]["args"]


def test_with_memory_enforcement_off_the_webhook_says_so_and_no_driver_runs() -> None:
    docs = render("--set=memoryEnforcement.enabled=false")
    spec = csi_spec(docs)
    assert [c["name"] for c in spec["containers"]] == ["mps-csi"]
    assert [d["metadata"]["name"] for d in of_kind(docs, "CSIDriver")] == ["mps.gpupack.io"]
    webhook = named(docs, "Deployment", "gpupack-webhook")["spec"]["template"]["spec"]
    assert "--no-memory-enforcement" in webhook["containers"][0]["args"]
    without_exporter = render("--set=exporter.enabled=false")
    webhook = named(without_exporter, "Deployment", "gpupack-webhook")["spec"]["template"]["spec"]
    assert "--no-memory-enforcement" in webhook["containers"][0]["args"]
