"""The exporter against a real control plane: the `gpupack-exporter` binary with the
chart's RBAC, a real gRPC kubelet pod-resources server playing its node's kubelet, and
the node's pods from a real API server.

kwok nodes have no kubelet and no GPUs, so `SimulatedKubelet` plays the kubelet's
device manager for one node: every Running capacity pod bound to the node gets the
first free fake GPU, and `List` reports it, as the NVIDIA device plugin (UUID strategy)
would. The simulated node agent (hack/localcluster/) stays off that node, so the GPU
annotations there come from the exporter alone. There is no NVML here: the binary runs
with `gpupack_exporter_nvml_up 0`, which is itself one of the failure modes under test.
"""

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from doubles.nvml import L4
from exporter.podresources import ContainerDevices, ContainerResources, PodResources
from gpupack import keys
from hack import polling
from hack.localcluster import (
    SCHEDULER_NAME,
    SYSTEM_NAMESPACE,
    Kube,
    LocalCluster,
    SimulatedGpuAssigner,
)
from tests.exporter.podresources_server import PodResourcesServer, short_tempdir
from tests.integration.fakenode import FakeNode

pytestmark = pytest.mark.integration

NODE = "gpu-l4-3"
GPUS = 2  # the L4 pool's nodes have two each


class SimulatedKubelet:
    """TEST INFRASTRUCTURE: kubelet's device manager for one kwok node, over the real
    pod-resources gRPC API. Assignments are sticky, like kubelet's checkpoint."""

    def __init__(self, kube: Kube, node: str, gpus: int) -> None:
        self._kube = kube
        self._node = node
        self._gpus = gpus
        self._lock = threading.Lock()
        self.assigned: dict[tuple[str, str], str] = {}

    def uuid(self, index: int) -> str:
        return SimulatedGpuAssigner.fake_uuid(self._node, index)

    def list(self) -> list[PodResources]:
        try:
            pods = self._kube.get(
                "/api/v1/pods", fieldSelector=f"spec.nodeName={self._node},status.phase=Running"
            )["items"]
        finally:
            self._kube.close()  # gRPC's worker threads come and go: keep no connection
        with self._lock:
            live = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
            for key in [k for k in self.assigned if k not in live]:
                del self.assigned[key]
            answer = []
            for key, pod in sorted(live.items()):
                if not holds_a_gpu(pod):
                    continue
                if key not in self.assigned:
                    used = set(self.assigned.values())
                    free = [self.uuid(i) for i in range(self._gpus) if self.uuid(i) not in used]
                    if not free:
                        continue
                    self.assigned[key] = free[0]
                container = pod["spec"]["containers"][0]["name"]
                devices = (ContainerDevices("nvidia.com/gpu", (self.assigned[key],)),)
                answer.append(
                    PodResources(key[1], key[0], (ContainerResources(container, devices),))
                )
            return answer


class Exporter:
    def __init__(self, port: int, kubelet: PodResourcesServer, log: Path) -> None:
        self.port = port
        self.kubelet = kubelet
        self.log = log

    def metrics(self) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = tuple(sorted(sample.labels.items()))
                out.setdefault(sample.name, {})[key] = sample.value
        return out

    def value(self, name: str, **labels: str) -> float | None:
        try:
            return self.metrics().get(name, {}).get(tuple(sorted(labels.items())))
        except OSError:
            return None


# A quiet window (seconds): room for what must not happen to show itself.
QUIET = 1.5


def eventually(check: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """`hack.polling.eventually` with this module's defaults."""
    return polling.eventually(what or "the condition", check, timeout)


@pytest.fixture(scope="module")
def exporter(
    cluster: LocalCluster | None, kube: Kube, gpu_assigner: SimulatedGpuAssigner | None
) -> Iterator[Exporter]:
    if cluster is None or gpu_assigner is None:
        pytest.skip("plays a node's kubelet: needs the local cluster")
    gpu_assigner.skip_nodes.add(NODE)
    simulated = SimulatedKubelet(kube, NODE, GPUS)
    with gpus_of_our_own(cluster, kube, NODE), short_tempdir() as directory:
        socket = directory / "kubelet.sock"
        with PodResourcesServer(socket, pods=simulated.list) as kubelet:
            process, port = cluster.install_exporter(
                NODE, pod_resources_socket=socket, extra_args=["--discovery-interval=0.5"]
            )
            exporter = Exporter(port, kubelet, process.log)
            eventually(
                lambda: exporter.value("gpupack_exporter_api_up") == 1.0,
                what="the exporter to list its node's pods",
            )
            try:
                yield exporter
            finally:
                cluster.stop_exporter(NODE)
                gpu_assigner.skip_nodes.discard(NODE)


def holds_a_gpu(pod: dict[str, Any]) -> bool:
    return any(
        ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
        for c in pod["spec"]["containers"]
    )


@contextmanager
def gpus_of_our_own(cluster: LocalCluster, kube: Kube, node: str) -> Iterator[None]:
    """The node's GPUs free for this module's capacity pods, which are bound to it by
    name. Earlier modules may have left pods there (where placement puts them is not
    this module's business): the node is cordoned, so that their controllers do not put
    them back, and every pod on it is deleted. A capacity pod still labelled hosting
    cannot be deleted (the admission policies refuse it); once its shares are gone, the
    label is taken off as gpupack-scheduler's ServiceAccount, as the scheduler does when a
    GPU empties (none runs in this module). Uncordoned after."""
    scheduler = Kube.from_kubeconfig(
        cluster.component_kubeconfig(SCHEDULER_NAME, "templates/scheduler.yaml")
    )

    def on_node() -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = kube.get(
            "/api/v1/pods", fieldSelector=f"spec.nodeName={node}"
        )["items"]
        return pods

    def path(pod: dict[str, Any]) -> str:
        return f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"

    kube.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}})
    try:
        for pod in on_node():
            if not holds_a_gpu(pod):  # the shares first: then their GPUs are empty
                kube.delete(path(pod))
        eventually(
            lambda: all(holds_a_gpu(pod) for pod in on_node()), what=f"{node}'s shares to go"
        )
        for pod in on_node():
            if (pod["metadata"].get("labels") or {}).get(keys.HOSTING):
                scheduler.merge_patch(path(pod), {"metadata": {"labels": {keys.HOSTING: None}}})
            kube.delete(path(pod))
        eventually(lambda: not on_node(), what=f"the pods on {node} to go")
        yield
    finally:
        kube.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": None}})
        scheduler.close()


def capacity_pod(name: str, node: str = NODE) -> dict[str, Any]:
    """A capacity pod already bound to `node`, as kube-scheduler would leave it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": SYSTEM_NAMESPACE,
            "labels": {"gpupack.io/role": "capacity", "gpupack.io/pool": "exporter-test"},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "hold",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def annotations(kube: Kube, name: str) -> dict[str, str]:
    pod = kube.get(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{name}")
    return dict(pod["metadata"].get("annotations") or {})


@pytest.fixture
def capacity(kube: Kube) -> Iterator[Callable[[str], str]]:
    created: list[str] = []

    def create(name: str) -> str:
        kube.create(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods", capacity_pod(name))
        created.append(name)
        return name

    yield create
    for name in created:
        kube.delete(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{name}")
    eventually(
        lambda: all(
            not kube.get(
                f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods",
                fieldSelector=f"metadata.name={name}",
            )["items"]
            for name in created
        ),
        what="the capacity pods to go",
    )


def test_the_exporter_names_the_gpu_kubelet_gave_each_capacity_pod(
    exporter: Exporter, kube: Kube, capacity: Callable[[str], str]
) -> None:
    first, second = capacity("exp-cap-a"), capacity("exp-cap-b")
    held = {
        name: eventually(
            lambda name=name: annotations(kube, name).get("gpupack.io/gpu-uuid"),  # type: ignore[misc]
            what=f"{name}'s GPU annotation",
        )
        for name in (first, second)
    }
    node_gpus = {SimulatedGpuAssigner.fake_uuid(NODE, i) for i in range(GPUS)}
    assert set(held.values()) == node_gpus  # one distinct GPU each, the node's own
    # No NVML here, so no device memory: the scheduler falls back to the GFD label.
    assert "gpupack.io/gpu-memory" not in annotations(kube, first)

    for name, uuid in held.items():
        eventually(
            lambda name=name, uuid=uuid: (
                exporter.value(  # type: ignore[misc]
                    "gpupack_gpu_capacity_pod", gpu=uuid, namespace=SYSTEM_NAMESPACE, pod=name
                )
                == 1.0
            ),
            what=f"{name} in gpupack_gpu_capacity_pod",
        )
    assert exporter.value("gpupack_exporter_nvml_up") == 0.0
    assert exporter.value("gpupack_exporter_pod_resources_up") == 1.0


def test_a_kubelet_outage_is_reported_once_and_recovered_from(
    exporter: Exporter, kube: Kube, capacity: Callable[[str], str]
) -> None:
    def errors() -> float:
        return exporter.value("gpupack_exporter_errors_total", source="pod-resources") or 0.0

    before = errors()
    exporter.kubelet.stop()
    try:
        eventually(
            lambda: exporter.value("gpupack_exporter_pod_resources_up") == 0.0,
            what="pod_resources_up to drop",
        )
        eventually(lambda: errors() >= before + 3, what="the failures to be counted")
        # While kubelet is away, a new capacity pod waits; nothing is lost.
        name = capacity("exp-cap-late")
        time.sleep(QUIET)  # room for a wrong annotation while the kubelet is away
        assert "gpupack.io/gpu-uuid" not in annotations(kube, name)
    finally:
        exporter.kubelet.start()
    eventually(
        lambda: exporter.value("gpupack_exporter_pod_resources_up") == 1.0,
        what="pod_resources_up to recover",
    )
    eventually(
        lambda: annotations(kube, name).get("gpupack.io/gpu-uuid"),
        what="the late capacity pod's GPU",
    )
    outage_lines = [
        line
        for line in exporter.log.read_text().splitlines()
        if "pod-resources" in line and "no kubelet pod-resources socket" in line
    ]
    assert len(outage_lines) == 1, outage_lines  # logged once per change, not per retry


def test_gpu_processes_are_charged_to_their_pods_by_name_beside_their_allocation(
    exporter: Exporter, cluster: LocalCluster, kube: Kube, plain_namespace: str, tmp_path: Path
) -> None:
    """The exporter's own pieces in this process, on the real API server with the chart's
    RBAC: a node-scoped pod watch, NVML faked below the reader, a fake /proc whose cgroup
    files name the real pods' UIDs and container IDs."""
    from prometheus_client import CollectorRegistry, generate_latest

    from doubles.nvml import FakeReader, GiB, MiB
    from doubles.procfs import containerd_v2, write_proc
    from exporter.agent import Agent, node_pods
    from exporter.cgroup import ProcessTable
    from exporter.collector import ExporterCollector
    from exporter.health import Health
    from exporter.pods import PodMap
    from exporter.readings import Device
    from exporter.sampler import Sampler
    from gpupack.runtime.transport import connect

    gpu = SimulatedGpuAssigner.fake_uuid(NODE, 0)
    reader = FakeReader([Device(0, gpu, "NVIDIA L4", 23034 * MiB)])
    containers = {"trainer": "1" * 64, "whole": "2" * 64}
    uids = {}
    # As the webhook and the scheduler leave a fractional pod: its share at creation, its
    # GPU written by gpupack-scheduler's Binding (only gpupack may write it).
    binder = Kube.from_kubeconfig(
        cluster.component_kubeconfig("gpupack-scheduler", "templates/scheduler.yaml")
    )
    for name, managed in (("trainer", True), ("whole", False)):
        meta: dict[str, Any] = {"name": name, "namespace": plain_namespace}
        if managed:
            meta["annotations"] = {
                "gpupack.io/gpu-compute": "250m",
                "gpupack.io/gpu-memory": "4Gi",
                "gpupack.io/decision": "it-1",
            }
        pod = kube.create(
            f"/api/v1/namespaces/{plain_namespace}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta,
                "spec": {
                    "schedulerName": "bound-by-this-test",
                    "containers": [{"name": "cuda", "image": "cuda"}],
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        )
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "annotations": {"gpupack.io/gpu-uuid": gpu} if managed else {},
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        }
        binder.create(f"/api/v1/namespaces/{plain_namespace}/pods/{name}/binding", binding)
        if name == "whole":
            binder.close()
        uids[name] = pod["metadata"]["uid"]
        path = f"/api/v1/namespaces/{plain_namespace}/pods/{name}"
        eventually(lambda path=path: kube.get(path)["status"].get("phase") == "Running")  # type: ignore[misc]
        kube.merge_patch(  # the container runtime's ID, which kwok does not invent
            path + "/status",
            {
                "status": {
                    "containerStatuses": [
                        {
                            "name": "cuda",
                            "image": "cuda",
                            "imageID": "",
                            "ready": True,
                            "restartCount": 0,
                            "containerID": f"containerd://{containers[name]}",
                            "state": {"running": {}},
                        }
                    ]
                }
            },
        )
    proc = tmp_path / "proc"
    write_proc(proc, 501, cgroup=containerd_v2(uids["trainer"], containers["trainer"]))
    write_proc(proc, 502, cgroup=containerd_v2(uids["whole"], containers["whole"]))
    write_proc(proc, 503, cgroup="0::/system.slice/nv-hostengine.service\n")
    reader.set_process(gpu, 501, memory=3 * GiB, sm=0.2)
    reader.set_process(gpu, 502, memory=GiB, sm=0.5)
    reader.set_process(gpu, 503, memory=GiB // 2, sm=0.1)

    client = connect(
        str(cluster.service_account_kubeconfig("gpupack-exporter")), user_agent="gpupack-exporter"
    )
    informer = node_pods(client, NODE)
    health = Health()
    sampler = Sampler(reader, health)
    agent = Agent(client, PodMap(informer), sampler, ProcessTable(proc), exporter_lister(), health)
    registry = CollectorRegistry()
    registry.register(ExporterCollector(agent.scrape))
    informer.start()
    try:
        assert informer.wait_synced(30)
        for _ in range(3):
            sampler.sample_once()
        found = eventually(
            lambda: _scraped(generate_latest(registry).decode(), plain_namespace),
            what="both pods in the scrape",
        )
    finally:
        informer.stop()
        client.close()
    assert found["compute"] == {
        ("trainer", "cuda"): pytest.approx(0.2),
        ("whole", "cuda"): pytest.approx(0.5),
    }
    assert found["memory"] == {("trainer", "cuda"): 3 * GiB, ("whole", "cuda"): GiB}
    assert found["allocated"] == {"trainer": 0.25}  # the whole-GPU pod has no share
    assert found["managed"] == {"trainer": 1.0, "whole": 0.0}
    assert found["host"] == pytest.approx(0.1)


def exporter_lister() -> Any:
    class NoKubelet:
        def list(self) -> list[PodResources]:
            return []

    return NoKubelet()


def _scraped(text: str, namespace: str) -> dict[str, Any] | None:
    found: dict[str, Any] = {"compute": {}, "memory": {}, "allocated": {}, "managed": {}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = s.labels
            if s.name == "gpupack_gpu_unattributed_compute_ratio" and labels["source"] == "host":
                found["host"] = s.value
            if labels.get("namespace") != namespace:
                continue
            if s.name == "gpupack_pod_gpu_compute_ratio":
                found["compute"][(labels["pod"], labels["container"])] = s.value
            elif s.name == "gpupack_pod_gpu_memory_used_bytes":
                found["memory"][(labels["pod"], labels["container"])] = s.value
            elif s.name == "gpupack_pod_gpu_compute_allocated_ratio":
                found["allocated"][labels["pod"]] = s.value
            elif s.name == "gpupack_pod_gpu_managed":
                found["managed"][labels["pod"]] = s.value
    named = all(container for _, container in found["compute"])  # status seen by the watch
    return found if len(found["compute"]) == 2 and named and "host" in found else None


HEALTH_NODE = "gpu-l4-2"  # another L4 node: the binary above serves NODE


def named_gpu(kube: Kube, name: str) -> str:
    """The UUID the exporter wrote on capacity pod `name`, once it has."""
    uuid: str = eventually(lambda: annotations(kube, name).get(keys.GPU_UUID), what=f"{name}'s GPU")
    return uuid


def test_gpu_health_goes_stale_while_the_exporter_is_down_and_is_caught_up_when_back(
    cluster: LocalCluster,
    kube: Kube,
    gpu_assigner: SimulatedGpuAssigner | None,
    tmp_path: Path,
) -> None:
    """The exporter writes each GPU's health on the capacity pod holding it
    (`gpupack.io/gpu-unhealthy`, which placement reads: no new share there). Its health
    comes from NVML, which the binary here lacks, so this node's exporter runs in this
    process over a fake NVML (`FakeNode`), with its own discovery. While it is down,
    nobody writes health: a GPU lost meanwhile keeps taking shares, and one reset
    meanwhile keeps refusing them. Back, it corrects both from a fresh look at NVML."""
    assert gpu_assigner is not None
    (tmp_path / "proc").mkdir()
    kubelet = SimulatedKubelet(kube, HEALTH_NODE, GPUS)
    node = FakeNode(cluster, HEALTH_NODE, GPUS, tmp_path / "proc", L4, kubelet=kubelet)
    pods = ("health-a", "health-b")
    with ExitStack() as stack:
        stack.enter_context(gpus_of_our_own(cluster, kube, HEALTH_NODE))
        gpu_assigner.skip_nodes.add(HEALTH_NODE)
        stack.callback(gpu_assigner.skip_nodes.discard, HEALTH_NODE)
        node.start()
        stack.callback(node.stop)
        for name in pods:
            stack.callback(kube.delete, f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{name}")
            kube.create(
                f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods", capacity_pod(name, HEALTH_NODE)
            )
        uuid = {name: named_gpu(kube, name) for name in pods}
        lost = time.monotonic()
        node.reader.lose(uuid["health-a"])
        eventually(
            lambda: annotations(kube, "health-a").get(keys.GPU_UNHEALTHY),
            what="health-a's GPU marked unhealthy",
        )
        marked = time.monotonic() - lost

        node.stop_exporter()
        node.reader.recover(uuid["health-a"])  # reset while nobody looks
        node.reader.lose(uuid["health-b"])
        time.sleep(3.0)  # six discovery intervals
        assert annotations(kube, "health-a").get(keys.GPU_UNHEALTHY)  # stale: still refused
        assert not annotations(kube, "health-b").get(keys.GPU_UNHEALTHY)  # stale: still used

        started = time.monotonic()
        node.start_exporter()
        eventually(
            lambda: (
                not annotations(kube, "health-a").get(keys.GPU_UNHEALTHY)
                and annotations(kube, "health-b").get(keys.GPU_UNHEALTHY)
            ),
            what="both GPUs' health corrected",
        )
        caught_up = time.monotonic() - started
    print(
        f"health: a lost GPU marked {marked:.1f} s after NVML said so; "
        f"the exporter back, both GPUs corrected {caught_up:.1f} s after it started"
    )


def test_an_exporter_that_stops_leaves_what_it_wrote_and_catches_up_when_back(
    exporter: Exporter, cluster: LocalCluster, kube: Kube, capacity: Callable[[str], str]
) -> None:
    """The node's exporter stops (its pod evicted, OOM-killed, rolled). The GPU it named
    stays named: the capacity pod still holds it, so placement may go on using it. A
    capacity pod that starts meanwhile is named by no one: its GPU stays one that is
    coming, which gpupack-scheduler books no share on. Back, the exporter names it.
    Last in this module: the exporter it restarts serves the module's teardown."""
    first = capacity("exp-stop-a")
    named = eventually(
        lambda: annotations(kube, first).get("gpupack.io/gpu-uuid"), what=f"{first}'s GPU"
    )
    cluster.stop_exporter(NODE)
    late = capacity("exp-stop-b")
    eventually(
        lambda: (
            kube.get(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{late}")["status"].get("phase")
            == "Running"
        ),
        what=f"{late} running",
    )
    time.sleep(3.0)  # six of the exporter's discovery intervals
    assert "gpupack.io/gpu-uuid" not in annotations(kube, late)
    assert annotations(kube, first).get("gpupack.io/gpu-uuid") == named

    process, exporter.port = cluster.install_exporter(
        NODE,
        pod_resources_socket=exporter.kubelet.socket_path,
        extra_args=["--discovery-interval=0.5"],
    )
    exporter.log = process.log
    started = time.monotonic()
    uuid = eventually(
        lambda: annotations(kube, late).get("gpupack.io/gpu-uuid"), what=f"{late}'s GPU"
    )
    seconds = time.monotonic() - started
    assert uuid != named
    assert uuid in {SimulatedGpuAssigner.fake_uuid(NODE, i) for i in range(GPUS)}
    assert annotations(kube, first).get("gpupack.io/gpu-uuid") == named
    print(f"exporter back: the waiting capacity pod named {seconds:.1f} s after its start")
