"""`helm install` of the chart, unchanged, the way users install it: onto a cluster with a
real kubelet node (containerd, runc, CNI, kube-proxy) that runs gpupack's image as hack/test
builds it from the Dockerfile, beside kwok's simulated GPU nodes.

Everything the chart makes runs as containers on that node: the certificate hook Jobs
with their ServiceAccounts, the webhook, the scheduler (kube-scheduler + extender) and
the recommender passing their probes, the API server calling the webhook through its
Service. GPUs stay simulated: the GPU nodes are kwok's (tainted, so gpupack's own pods
land on the real node), the exporter DaemonSet runs there only as kwok plays it, and the
simulated node agent names each capacity pod's GPU (docs/local-cluster.md).
"""

import base64
import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupack import keys
from hack.localcluster import (
    ApiError,
    ClusterError,
    ControlPlane,
    Kube,
    LocalCluster,
    NodePool,
    SimulatedGpuAssigner,
    log,
    realnode,
)
from tests.integration.tools import REPO, cluster_of_its_own
from tests.integration.workloads import RESTRICTED, TOLERATE_GPUS, deployment

pytestmark = pytest.mark.integration
NS = "gpupack-system"
GPU_NODES = (NodePool("gpu-a100", 2, 8, "NVIDIA-A100-SXM4-80GB", 81920, "64", "512Gi"),)


@pytest.fixture(scope="module")
def node_cluster(
    tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster | None
) -> Iterator[LocalCluster]:
    images = os.environ.get("GPUPACK_NODE_IMAGES", "")
    assert images, "GPUPACK_NODE_IMAGES is set by hack/lib/node.sh: run through hack/test"
    # What a node of a run that died left behind goes first (as the node's own start
    # would do it), so `before` is this machine as a node finds it.
    realnode.clean_dead_node()
    before = host_state()
    with cluster_of_its_own(
        tmp_path_factory,
        cluster,
        "realnode",
        real_node=True,
        node_images=[Path(p) for p in images.split(":")],
        node_pools=GPU_NODES,
        gpu_taint=True,
    ) as local:
        yield local
    # The node stopped: the host is as it was (the kubelet changes sysctls, iptables,
    # cgroups and mounts; the rest of the suite and the next run need them back).
    assert host_state() == before


def host_state() -> dict[str, Any]:
    """What a kubelet node changes on this machine, as far as it can be read back."""

    def sysctl(name: str) -> str:
        return Path("/proc/sys", *name.split(".")).read_text().strip()

    def chains(table: str) -> list[str]:
        rules = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True,
                               check=True, timeout=30).stdout.splitlines()  # fmt: skip
        return [rule for rule in rules if "KUBE-" in rule or "GPUPACK-" in rule]

    return {
        "sysctls": {n: sysctl(n) for n in realnode.RESTORED_SYSCTLS},
        "iptables": {table: chains(table) for table in ("filter", "nat", "mangle")},
        "cgroups": sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods*")),
        "bridge": Path("/sys/class/net", realnode.BRIDGE).exists(),
        "mounts": [
            m for m in Path("/proc/self/mounts").read_text().splitlines() if "realnode" in m
        ],
        "var-lib-kubelet": realnode.VAR_LIB_KUBELET.exists(),
    }


def image_tag() -> str:
    image = os.environ.get("GPUPACK_IMAGE", "")
    assert ":" in image, "GPUPACK_IMAGE is set by hack/lib/image.sh: run through hack/test"
    return image.rsplit(":", 1)[1]


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def pods(kube: Kube, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = kube.get(
        f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector
    )["items"]
    return found


def https_status(address: str, port: int, ca: bytes, server_name: str) -> int:
    """GET /healthz over TLS at address:port, checking the certificate for `server_name`."""
    context = ssl.create_default_context(cadata=ca.decode())
    with (
        socket.create_connection((address, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        tls.sendall(
            f"GET /healthz HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n".encode()
        )
        return int(tls.recv(64).split()[1])


@pytest.mark.smoke
def test_helm_install_runs_gpupack_on_a_real_node_and_uninstall_leaves_nothing(
    node_cluster: LocalCluster,
) -> None:
    cluster, kube = node_cluster, node_cluster.kube()
    node = cluster.node
    assert node is not None
    chart = str(REPO / "charts" / "gpupack")
    values = [f"--set=image.tag={image_tag()}"]

    # One helm install: the CRDs, the certificate hook Jobs (containers, with their
    # ServiceAccounts), every Deployment ready by its probes.
    started = time.monotonic()
    cluster.tool("helm", "install", "gpupack", chart, f"--namespace={NS}", "--create-namespace",
                 "--wait", "--timeout=5m", *values)  # fmt: skip
    installed = time.monotonic() - started
    for component, replicas in (("webhook", 2), ("scheduler", 2), ("recommender", 1)):
        running = pods(kube, NS, f"app.kubernetes.io/component={component}")
        assert len(running) == replicas, component
        for pod in running:
            assert pod["spec"]["nodeName"] == node.name, pod["metadata"]["name"]
            assert ready(pod), f"{pod['metadata']['name']} is not Ready"
            statuses = pod["status"]["containerStatuses"]
            assert all(s["ready"] and s["restartCount"] == 0 for s in statuses), statuses
    secret = kube.get(f"/api/v1/namespaces/{NS}/secrets/gpupack-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"

    # The webhook through its Service over IPv4: the ClusterIP, which kube-proxy turns
    # into a pod's address on the node, with the certificate the hook issued.
    service = kube.get(f"/api/v1/namespaces/{NS}/services/gpupack-webhook")
    ca = secret["data"]["ca.crt"]
    name = f"gpupack-webhook.{NS}.svc"
    cluster_ip = service["spec"]["clusterIP"]
    assert https_status(cluster_ip, 443, base64.b64decode(ca), name) == 200

    # An opted-in Deployment: the API server calls the webhook through the Service, the
    # pods are rewritten and placed on a shared GPU of a (simulated) GPU node. Like the
    # public inference charts it carries no toleration of the GPU nodes' taint: the API
    # server's ExtendedResourceToleration gives it one, before the webhook runs.
    with SimulatedGpuAssigner(kube, agent=cluster.node_agent):
        ns = kube.create_namespace("it-real", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
        infer = deployment(ns, "infer", 3, memory="8Gi")
        kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", infer)

        def placed() -> list[dict[str, Any]]:
            found = [
                p for p in pods(kube, ns)
                if p["spec"].get("nodeName") and (p.get("status") or {}).get("phase") == "Running"
            ]  # fmt: skip
            return found if len(found) == 3 else []

        shares = kube.wait_for("3 rewritten pods placed", placed, timeout=120)
        first_placed = time.monotonic() - started
        for pod in shares:
            assert pod["spec"]["schedulerName"] == keys.SCHEDULER_NAME
            [added] = TOLERATE_GPUS  # what ExtendedResourceToleration writes
            assert added in pod["spec"]["tolerations"], pod["spec"]["tolerations"]
            assert keys.GPU_UUID in pod["metadata"]["annotations"]
            assert "nvidia.com/gpu" not in json.dumps(pod["spec"]["containers"][0]["resources"])
        uuids = {p["metadata"]["annotations"][keys.GPU_UUID] for p in shares}
        assert len(uuids) == 1, "three 300m shares fit one GPU"
        log(f"real node: helm install {installed:.1f} s; first rewritten pods placed "
            f"{first_placed:.1f} s after helm install began")  # fmt: skip

        # The renewal CronJob, run now as an operator would.
        cluster.tool("kubectl", "create", "job", "--from=cronjob/gpupack-certs-renewal",
                     "renew-now", f"--namespace={NS}")  # fmt: skip
        cluster.tool("kubectl", "wait", "--for=condition=complete", "job/renew-now",
                     f"--namespace={NS}", "--timeout=120s")  # fmt: skip
        assert "caBundle" in cluster.tool("kubectl", "logs", "job/renew-now", f"--namespace={NS}")

        # helm upgrade runs the CRD hook Job as a container.
        cluster.tool("helm", "upgrade", "gpupack", chart, f"--namespace={NS}", "--wait",
                     "--timeout=5m", *values)  # fmt: skip
        events = kube.get(f"/api/v1/namespaces/{NS}/events")["items"]
        completed = {
            e["involvedObject"]["name"]
            for e in events
            if e["involvedObject"]["kind"] == "Job" and e["reason"] == "Completed"
        }
        assert {"gpupack-certs", "gpupack-crds", "renew-now"} <= completed, completed

        # helm uninstall refuses while pods share GPUs ...
        refused = cluster.tool("helm", "uninstall", "gpupack", f"--namespace={NS}", "--wait",
                               check=False)  # fmt: skip
        assert "gpupack-uninstall failed" in refused, refused
        (hook,) = pods(kube, NS, "job-name=gpupack-uninstall")[:1]
        said = cluster.tool("kubectl", "logs", hook["metadata"]["name"], f"--namespace={NS}")
        assert "refusing to uninstall: 3 pods share GPUs through gpupack" in said
        assert len(pods(kube, ns)) == 3

        # ... and once the workload is gone and its namespace opted out, removes everything.
        kube.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/infer")
        kube.wait_for("the shares gone", lambda: not pods(kube, ns), timeout=60)
        kube.merge_patch(
            f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {keys.OPTIMIZE: None}}}
        )
        cluster.tool("helm", "uninstall", "gpupack", f"--namespace={NS}", "--wait", "--timeout=3m")

    kube.wait_for("no pod left in the release namespace", lambda: not pods(kube, NS), timeout=120)
    leftovers = []
    for path in (
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "/apis/storage.k8s.io/v1/csidrivers",
        f"/api/v1/namespaces/{NS}/secrets",
        f"/api/v1/namespaces/{NS}/services",
        f"/apis/batch/v1/namespaces/{NS}/jobs",
        f"/apis/batch/v1/namespaces/{NS}/cronjobs",
        f"/apis/apps/v1/namespaces/{NS}/daemonsets",
        f"/apis/apps/v1/namespaces/{NS}/deployments",
    ):
        try:
            items = kube.get(path)["items"]
        except ApiError:
            continue
        leftovers += [
            f"{path}/{i['metadata']['name']}" for i in items if "gpupack" in i["metadata"]["name"]
        ]
    assert leftovers == []


def test_a_second_real_node_on_the_machine_is_refused_while_the_first_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two nodes would share the bridge and the machine's KUBE- chains: the second's
    # cleanup would break the first (a running hack/demo under hack/test).
    owner = tmp_path / "owner"
    monkeypatch.setattr(realnode, "OWNER", owner)
    first = tmp_path / "demo" / "gpupack-node"
    (first / "containerd").mkdir(parents=True)
    config = f"--config={first / 'containerd' / 'config.toml'}"
    # A process whose command line names that containerd configuration, as its containerd's does.
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", config])
    try:
        owner.write_text(str(first))
        second = realnode.RealNode(ControlPlane(tmp_path / "test"))
        with pytest.raises(RuntimeError, match="already running on this machine"):
            second.claim_host()
        assert owner.read_text() == str(first)
    finally:
        stand_in.kill()
        stand_in.wait()


def test_a_node_left_by_a_run_that_died_is_cleaned_up_before_the_next_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CI run killed mid-suite leaves its node's sysctls, chains and mounts behind, and
    # its containerd gone: the next node (and the install test's `before`) cleans them.
    owner = tmp_path / "owner"
    monkeypatch.setattr(realnode, "OWNER", owner)
    cleaned: list[Path] = []
    monkeypatch.setattr(realnode, "clean_host", cleaned.append)
    dead = tmp_path / "died" / "gpupack-node"
    owner.write_text(str(dead))

    realnode.clean_dead_node()

    assert cleaned == [dead]


def make_one_gpu_node(kube: Kube, name: str) -> None:
    """The real node as a one-GPU node: labels as GPU feature discovery writes them, and
    one nvidia.com/gpu advertised (no device plugin: the capacity pod is pause)."""
    kube.merge_patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.product": "Fake-GPU", "nvidia.com/gpu.memory": "16384",
    }}})  # fmt: skip
    kube.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        [
            {"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "1"},
            {"op": "add", "path": "/status/allocatable/nvidia.com~1gpu", "value": "1"},
        ],
        content_type="application/json-patch+json",
    )


def running(kube: Kube, ns: str, name: str, containers: int) -> dict[str, Any] | None:
    """Pod `name` once `containers` of its containers (ephemeral ones included) run."""
    found = kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    status = found.get("status") or {}
    statuses = [*(status.get("containerStatuses") or []),
                *(status.get("ephemeralContainerStatuses") or [])]  # fmt: skip
    started = [s for s in statuses if "running" in (s.get("state") or {})]
    return found if len(started) >= containers else None


def environments(cluster: LocalCluster, pod: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Per running container, the environment containerd gave it (what the toolkit reads)."""
    assert cluster.node is not None
    status = pod["status"]
    statuses = [*(status.get("containerStatuses") or []),
                *(status.get("ephemeralContainerStatuses") or [])]  # fmt: skip
    return {
        s["name"]: cluster.node.container_env(s["containerID"])
        for s in statuses
        if "running" in (s.get("state") or {})
    }


@pytest.mark.smoke
def test_no_container_on_the_real_node_reaches_a_gpu_its_image_names(
    node_cluster: LocalCluster,
) -> None:
    """An image whose ENV says NVIDIA_VISIBLE_DEVICES=all (as every CUDA base image does),
    run on the real node by pods gpupack never shares: what containerd gives each
    container (what the NVIDIA toolkit reads) names no GPU, whether the pod asked for none,
    took the variable from a ConfigMap, had its image changed or a debugger added; a
    gpupack pod's sidecar neither. A whole-GPU container keeps what the kubelet gives it,
    a fractional one gets exactly its GPU. Where the API server serves
    MutatingAdmissionPolicy (1.36+) it writes `void`, elsewhere the webhook; with neither
    answering, the API server refuses the pod."""
    cluster, kube = node_cluster, node_cluster.kube()
    node = cluster.node
    assert node is not None
    image = os.environ.get("GPUPACK_CUDA_ENV_IMAGE", "")
    assert image, "GPUPACK_CUDA_ENV_IMAGE is set by hack/lib/image.sh: run through hack/test"
    make_one_gpu_node(kube, node.name)
    chart = str(REPO / "charts" / "gpupack")
    root = node.kubelet_root
    values = [f"--set=image.tag={image_tag()}", f"--set=mps.kubeletDir={root}",
              f"--set=exporter.podResourcesPath={root}/pod-resources", "--set=mps.enabled=false",
              "--set=memoryEnforcement.enabled=false"]  # fmt: skip
    # No --wait: the exporter finds no NVML on this node and is never Ready.
    cluster.tool("helm", "install", "gpupack", chart, f"--namespace={NS}", "--create-namespace",
                 "--timeout=5m", *values)  # fmt: skip
    for deployment_name in ("gpupack-webhook", "gpupack-scheduler"):
        cluster.tool("kubectl", "rollout", "status", f"deployment/{deployment_name}",
                     f"--namespace={NS}", "--timeout=300s")  # fmt: skip
    served = kube.get("/apis/admissionregistration.k8s.io/v1")["resources"]
    by_policy = any(r["name"] == "mutatingadmissionpolicies" for r in served)
    plain = kube.create_namespace("it-devices", {})
    shared = kube.create_namespace("it-devices-shared", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    on_node = {"kubernetes.io/hostname": node.name}
    pods_of = f"/api/v1/namespaces/{plain}/pods"
    try:
        kube.create(f"/api/v1/namespaces/{plain}/configmaps", {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpus"},
            "data": {"NVIDIA_VISIBLE_DEVICES": "all"},
        })  # fmt: skip
        kube.create(pods_of, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
            "spec": {"nodeSelector": on_node, "terminationGracePeriodSeconds": 0, "containers": [
                {"name": "app", "image": image},
                {"name": "from-config", "image": image,
                 "envFrom": [{"configMapRef": {"name": "gpus"}}]},
                {"name": "later", "image": "registry.k8s.io/pause:3.10"},
            ]},
        })  # fmt: skip
        kube.wait_for("the plain pod running", lambda: running(kube, plain, "plain", 3), 120)
        # kubectl set image: the next container runs the CUDA image; env is immutable.
        cluster.tool(
            "kubectl", "set", "image", "pod/plain", f"later={image}", f"--namespace={plain}"
        )

        def changed() -> dict[str, Any] | None:
            found = running(kube, plain, "plain", 3)
            statuses = (found or {}).get("status", {}).get("containerStatuses") or []
            later = [s for s in statuses if s["name"] == "later" and "cuda-env" in s["image"]]
            return found if later else None

        kube.wait_for("the new image running", changed, 120)
        # A debugger added to the running pod (kubectl debug's ephemeral container).
        current = kube.get(f"{pods_of}/plain")
        current["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": image}]
        kube.request("PUT", f"{pods_of}/plain/ephemeralcontainers", current)
        plain_pod = kube.wait_for(
            "the debugger running", lambda: running(kube, plain, "plain", 4), 120
        )
        seen = environments(cluster, plain_pod)

        # A whole GPU: what the kubelet gives (here no device plugin: the image's own).
        kube.create(pods_of, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "whole"},
            "spec": {"nodeSelector": on_node, "terminationGracePeriodSeconds": 0,
                     "tolerations": TOLERATE_GPUS, "containers": [
                {"name": "cuda", "image": image, "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            ]},
        })  # fmt: skip
        whole = kube.wait_for(
            "the whole-GPU pod running", lambda: running(kube, plain, "whole", 1), 120
        )
        whole_seen = environments(cluster, whole)
        kube.delete(f"{pods_of}/whole")
        kube.wait_for("the whole GPU free", lambda: not any(
            p["metadata"]["name"] == "whole" for p in pods(kube, plain)), 120)  # fmt: skip

        # A fractional pod with a sidecar, on the real node's one GPU.
        with SimulatedGpuAssigner(kube, agent=cluster.node_agent):
            kube.create(f"/api/v1/namespaces/{shared}/pods", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "share",
                    "annotations": {keys.POLICY: "batch", keys.GPU_COMPUTE: "300m",
                                    keys.GPU_MEMORY: "1Gi"}},
                "spec": {"nodeSelector": on_node, "terminationGracePeriodSeconds": 0, "containers": [
                    {"name": "cuda", "image": image, "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "sidecar", "image": image},
                ]},
            })  # fmt: skip
            share = kube.wait_for(
                "the share running", lambda: running(kube, shared, "share", 2), 180
            )
        share_seen = environments(cluster, share)

        # Nobody answering (the webhook scaled to zero), a pod that would reach the GPUs
        # is refused by the API server; with the policy in the API server it never is.
        cluster.tool("kubectl", "scale", "deployment/gpupack-webhook", "--replicas=0",
                     f"--namespace={NS}")  # fmt: skip
        kube.wait_for("no webhook pod", lambda: not pods(
            kube, NS, "app.kubernetes.io/component=webhook"), 120)  # fmt: skip
        orphan = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "orphan"},
                  "spec": {"containers": [{"name": "app", "image": image}]}}  # fmt: skip
        if by_policy:
            stored = kube.create(pods_of, orphan, dry_run=True)
            assert stored["spec"]["containers"][0]["env"] == [VOID]
        else:
            with pytest.raises(ApiError) as refused:
                kube.create(pods_of, orphan, dry_run=True)
            assert refused.value.status == 403, refused.value
            assert "NVIDIA_VISIBLE_DEVICES=void" in refused.value.body
            assert "gpupack webhook sets it and did not answer" in refused.value.body
    finally:
        for namespace in (plain, shared):
            kube.delete(f"/api/v1/namespaces/{namespace}")
        kube.wait_for("the test pods gone",
                      lambda: not pods(kube, plain) and not pods(kube, shared), timeout=120)  # fmt: skip
        cluster.tool("helm", "uninstall", "gpupack", f"--namespace={NS}", "--wait", "--timeout=3m")

    log(f"real node ({'MutatingAdmissionPolicy' if by_policy else 'webhook'}): {seen}")
    for container in ("app", "from-config", "later", "debugger"):
        assert seen[container]["NVIDIA_VISIBLE_DEVICES"] == "void", (container, seen)
    assert seen["from-config"]["CUDA_VERSION"] == "13.0.0"  # the image's ENV is there ...
    assert (
        "NVIDIA_VISIBLE_DEVICES" not in plain_pod["spec"]["containers"][0].get("envFrom", [{}])[0]
    )
    # ... the kubelet's choice is left alone (a device plugin's variable would win) ...
    assert whole_seen["cuda"]["NVIDIA_VISIBLE_DEVICES"] == "all", whole_seen
    assert "env" not in whole["spec"]["containers"][0]
    # ... and a share sees exactly its GPU, its sidecar none.
    uuid = share["metadata"]["annotations"][keys.GPU_UUID]
    assert uuid == SimulatedGpuAssigner.fake_uuid(node.name, 0)
    assert share_seen["cuda"]["NVIDIA_VISIBLE_DEVICES"] == uuid, share_seen
    assert share_seen["sidecar"]["NVIDIA_VISIBLE_DEVICES"] == "void", share_seen


VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
SHIM_LIMIT = 1 << 30
# Each container runs the C probe against the fake driver (from a ConfigMap), with no
# LD_PRELOAD of its own: only /etc/ld.so.preload can load the shim. `main` takes 600 MiB
# and holds it; `sidecar` then sees what is left of the pod's budget and is refused more.
MAIN = (
    "cat /etc/ld.so.preload; /opt/fake/probe linked ctx info alloc:629145600 info >/tmp/out 2>&1; "
    "cat /tmp/out; touch /shared/holding; sleep 3600 & "
    "/opt/fake/probe linked ctx alloc:629145600 hold"
)
SIDECAR = (
    "while [ ! -e /shared/holding ]; do sleep 0.2; done; sleep 1; "
    "/opt/fake/probe linked ctx info alloc:629145600 alloc:104857600; sleep 3600"
)


def shim_pod(image: str, node: str) -> dict[str, Any]:
    env = [
        {"name": "LD_LIBRARY_PATH", "value": "/opt/fake"},
        {"name": "FAKE_CUDA_STATE", "value": "/shared/device"},
        {"name": "FAKE_CUDA_CONTEXT", "value": "0"},
    ]
    mounts = [
        {"name": "fake", "mountPath": "/opt/fake"},
        {"name": "shared", "mountPath": "/shared"},
    ]

    def container(name: str, script: str, gpu: bool) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "name": name,
            "image": image,
            "command": ["sh", "-c", script],
            "env": list(env),
            "volumeMounts": list(mounts),
            "securityContext": dict(RESTRICTED),
        }
        if gpu:
            spec["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        return spec

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "held", "annotations": {keys.GPU_MEMORY: "1Gi"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "containers": [container("main", MAIN, True), container("sidecar", SIDECAR, False)],
            "volumes": [
                {"name": "fake", "configMap": {"name": "fake-cuda", "defaultMode": 0o555}},
                {"name": "shared", "emptyDir": {}},
            ],
        },
    }


# A container running as root tries to rewrite what holds it, then runs the probe: the
# kubelet mounted the pod's directory and preload file read-only, the budget writable.
ROOT = (
    "for f in /run/gpupack/cuda/limit /run/gpupack/cuda/libgpupack-cuda.so /etc/ld.so.preload "
    '/run/gpupack/cuda/new; do if (echo 0 > $f) 2>/tmp/err; then echo "wrote $f"; '
    'else echo "refused $f: $(cat /tmp/err)"; fi; done; '
    "/opt/fake/probe linked ctx info alloc:2147483648 alloc:104857600; sleep 3600"
)


def root_pod(image: str, node: str) -> dict[str, Any]:
    """A one-container pod (namespace at Pod Security baseline) whose container is root."""
    body = shim_pod(image, node)
    main = body["spec"]["containers"][0]
    main["command"] = ["sh", "-c", ROOT]
    main["securityContext"] = {"runAsUser": 0, "runAsNonRoot": False}
    body["spec"]["containers"] = [main]
    body["spec"]["volumes"][1:] = []
    main["volumeMounts"] = main["volumeMounts"][:1]
    main["env"] = [*main["env"][:1], {"name": "FAKE_CUDA_CONTEXT", "value": "0"}]
    body["metadata"]["name"] = "root"
    return body


PACED_POLICY = {
    "apiVersion": "gpupack.io/v1alpha1",
    "kind": "GPUPolicy",
    "metadata": {"name": "paced", "namespace": NS},
    "spec": {
        "historyWindowSeconds": 3600, "percentile": 90, "computeHeadroom": 0.1,
        "memoryHeadroom": 0.1, "minCompute": "100m", "maxCompute": "1000m", "minMemory": "1Gi",
        "initialCompute": "300m", "initialMemory": "1Gi", "sharing": "shared", "compute": "share",
    },
}  # fmt: skip


def paced_pod(image: str, node: str) -> dict[str, Any]:
    """A one-container pod of the `paced` policy: the shim loads, then two launches."""
    body = shim_pod(image, node)
    main = body["spec"]["containers"][0]
    main["command"] = ["sh", "-c", "/opt/fake/probe linked ctx kernel kernel; sleep 3600"]
    body["spec"]["containers"] = [main]
    body["metadata"] = {"name": "paced", "annotations": {keys.POLICY: "paced"}}
    return body


def _created(kube: Kube, path: str, body: dict[str, Any]) -> bool:
    """Created, or refused for now (the webhook has not seen the new policy yet)."""
    try:
        kube.create(path, body)
    except ApiError as exc:
        if "paced" not in exc.body:
            raise
        return False
    return True


def test_a_restricted_pod_on_the_real_node_loads_the_shim_with_its_limit_in_both_containers(
    node_cluster: LocalCluster, tmp_path: Path
) -> None:
    """The memory shim as users get it: the chart's CSI driver on a kubelet node, the
    webhook's wiring, Pod Security `restricted`. The GPU is simulated (the node advertises
    one and the assigner names it); the CUDA driver is the tests' fake, from a ConfigMap.
    Beside it: a root container cannot rewrite its limit, the library or the preload
    file (the runtime refuses: read-only), and a pod asking to run unenforced under a
    policy that forbids it is refused by the webhook, naming the policy's field."""
    from doubles.shim_build import Build

    cluster, kube = node_cluster, node_cluster.kube()
    node = cluster.node
    assert node is not None
    root = node.kubelet_root
    build = Build(tmp_path / "fake").make()

    make_one_gpu_node(kube, node.name)
    chart = str(REPO / "charts" / "gpupack")
    values = [f"--set=image.tag={image_tag()}", f"--set=mps.kubeletDir={root}",
              f"--set=exporter.podResourcesPath={root}/pod-resources", "--set=mps.enabled=false"]  # fmt: skip
    # No --wait: the exporter's own container finds no NVML on this node and is never
    # Ready; what the test needs is waited for below.
    cluster.tool(
        "helm",
        "install",
        "gpupack",
        chart,
        f"--namespace={NS}",
        "--create-namespace",
        "--timeout=5m",
        *values,
    )
    for deployment_name in ("gpupack-webhook", "gpupack-scheduler"):
        cluster.tool("kubectl", "rollout", "status", f"deployment/{deployment_name}",
                     f"--namespace={NS}", "--timeout=300s")  # fmt: skip
        ns = kube.create_namespace(
            "it-shim",
            {
                keys.OPTIMIZE: keys.OPTIMIZE_ENABLED,
                "pod-security.kubernetes.io/enforce": "restricted",
            },
        )
    rooted = kube.create_namespace(
        "it-shim-root",
        {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED, "pod-security.kubernetes.io/enforce": "baseline"},
    )
    try:
        with SimulatedGpuAssigner(kube, agent=cluster.node_agent):
            kube.wait_for(
                "the memory shim's driver running on the real node",
                lambda: any(
                    s["name"] == "cuda-csi" and s.get("ready")
                    for p in pods(kube, NS, "app.kubernetes.io/component=csi")
                    if p["spec"].get("nodeName") == node.name
                    for s in (p.get("status") or {}).get("containerStatuses") or []
                ),
                timeout=300,
            )
            binary = {
                name: base64.b64encode((build.root / name).read_bytes()).decode()
                for name in ("libcuda.so.1", "libnvidia-ml.so.1", "probe")
            }
            for namespace in (ns, rooted):
                kube.create(f"/api/v1/namespaces/{namespace}/configmaps", {
                    "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fake-cuda"},
                    "binaryData": binary,
                })  # fmt: skip
            image = f"{os.environ['GPUPACK_IMAGE']}"
            unenforced = shim_pod(image, node.name)
            unenforced["metadata"]["name"] = "unenforced"
            unenforced["metadata"]["annotations"][keys.MEMORY_ENFORCEMENT] = "off"
            with pytest.raises(ApiError) as opted_out:
                kube.create(f"/api/v1/namespaces/{ns}/pods", unenforced)
            kube.create(f"/api/v1/namespaces/{ns}/pods", shim_pod(image, node.name))

            def logs(container: str, pod_name: str = "held", namespace: str = ns) -> str:
                return cluster.tool("kubectl", "logs", pod_name, "-c", container,
                                    f"--namespace={namespace}", check=False)  # fmt: skip

            try:
                kube.wait_for(
                    "the sidecar's probe done",
                    lambda: "alloc:104857600 rc=" in logs("sidecar"),
                    timeout=300,
                )
            except ClusterError as exc:
                describe = cluster.tool("kubectl", "describe", "pod", "held",
                                        f"--namespace={ns}", check=False)  # fmt: skip
                driver = cluster.tool("kubectl", "logs", "--selector=app.kubernetes.io/component=csi",
                                      "-c", "cuda-csi", f"--namespace={NS}", "--tail=50", check=False)  # fmt: skip
                raise AssertionError(
                    f"{exc}\n--- pod\n{describe}\n--- main\n{logs('main')}\n"
                    f"--- sidecar\n{logs('sidecar')}\n--- cuda-csi\n{driver}"
                ) from exc
            pod = kube.get(f"/api/v1/namespaces/{ns}/pods/held")
            main, sidecar = logs("main"), logs("sidecar")
            kube.delete(f"/api/v1/namespaces/{ns}/pods/held")  # its GPU, for the next
            kube.wait_for("the held pod gone", lambda: not pods(kube, ns), timeout=120)
            kube.create(f"/api/v1/namespaces/{rooted}/pods", root_pod(image, node.name))
            kube.wait_for(
                "the root container's probe done",
                lambda: "alloc:104857600 rc=" in logs("main", "root", rooted),
                timeout=300,
            )
            as_root = logs("main", "root", rooted)
            kube.delete(f"/api/v1/namespaces/{rooted}/pods/root")  # its GPU, for the next
            kube.wait_for("the root pod gone", lambda: not pods(kube, rooted), timeout=120)
            kube.create(f"/apis/gpupack.io/v1alpha1/namespaces/{NS}/gpupolicies", PACED_POLICY)
            kube.wait_for(
                "the paced pod admitted under its policy",
                lambda: _created(
                    kube, f"/api/v1/namespaces/{ns}/pods", paced_pod(image, node.name)
                ),
                timeout=60,
            )
            kube.wait_for(
                "the paced pod's probe done",
                lambda: "kernel rc=" in logs("main", "paced"),
                timeout=300,
            )
            paced = kube.get(f"/api/v1/namespaces/{ns}/pods/paced")
            paced_log = logs("main", "paced")
    finally:
        with contextlib.suppress(ApiError):  # not there when the test failed before it
            kube.delete(f"/apis/gpupack.io/v1alpha1/namespaces/{NS}/gpupolicies/paced")
        for namespace in (ns, rooted):
            kube.delete(f"/api/v1/namespaces/{namespace}")
        kube.wait_for(
            "the test namespaces gone",
            lambda: not pods(kube, ns) and not pods(kube, rooted),
            timeout=120,
        )
        cluster.tool("helm", "uninstall", "gpupack", f"--namespace={NS}", "--wait", "--timeout=3m")

    assert pod["metadata"]["annotations"][keys.ENFORCEMENT] == "memory"
    assert pod["spec"]["nodeName"] == node.name
    # /etc/ld.so.preload, the CSI driver's, names the library in the pod's directory ...
    assert "/run/gpupack/cuda/libgpupack-cuda.so" in main
    # ... and the dynamic loader loaded it into both containers' processes, which read the
    # limit the driver wrote from the pod's sealed annotation.
    limit = f"GPU memory limit 1.00 GiB ({SHIM_LIMIT} bytes) for this pod"
    assert limit in main, main
    assert limit in sidecar, sidecar
    assert f"info rc=0 free={SHIM_LIMIT} total={SHIM_LIMIT}" in main
    assert "alloc:629145600 rc=0" in main
    # One budget for the pod: the sidecar sees what main holds and is refused past it.
    held = 629145600
    assert f"info rc=0 free={SHIM_LIMIT - held} total={SHIM_LIMIT}" in sidecar, sidecar
    assert "alloc:629145600 rc=2" in sidecar, sidecar
    assert "alloc:104857600 rc=0" in sidecar, sidecar
    assert "refused cuMemAlloc_v2 of 600.00 MiB" in sidecar
    # The webhook refused the pod that asked to run unenforced, naming the policy's field.
    assert opted_out.value.status == 400, opted_out.value
    assert "allowMemoryEnforcementOptOut" in opted_out.value.body
    # Root in a container rewrites none of what holds it: the runtime mounted it read-only.
    for path in ("/run/gpupack/cuda/limit", "/run/gpupack/cuda/libgpupack-cuda.so",
                 "/etc/ld.so.preload", "/run/gpupack/cuda/new"):  # fmt: skip
        assert f"refused {path}:" in as_root, as_root
        assert f"wrote {path}" not in as_root, as_root
    assert as_root.count("Read-only file system") == 4, root
    # ... and is held all the same: the budget, its own mount, is writable.
    assert limit in as_root, as_root
    assert "alloc:2147483648 rc=2" in as_root, as_root
    assert "alloc:104857600 rc=0" in as_root, as_root
    # A pod of a policy with compute: share mounts its GPU's gpu-time file, written by the
    # CSI driver and mounted by the kubelet writable: the shim claimed a slot in it.
    assert paced["metadata"]["annotations"][keys.ENFORCEMENT] == "memory,compute"
    assert "GPU compute share 300m (share) for this pod, /run/gpupack/cuda/gpu-time slot 0" in (
        paced_log
    ), paced_log
    assert "kernel rc=0" in paced_log, paced_log
