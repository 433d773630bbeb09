"""The exporter's shell: discovery writes what kubelet says, once, and keeps going when
kubelet or the API server fails; a scrape names every PID's owner."""

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from doubles.nvml import FakeReader, fake_uuid
from doubles.procfs import containerd_v2, write_proc
from exporter.agent import Agent, node_pods
from exporter.cgroup import ProcessTable
from exporter.claims import ClaimReader
from exporter.health import API, POD_RESOURCES, Health
from exporter.podresources import (
    ContainerDevices,
    ContainerResources,
    PodResources,
    PodResourcesUnavailable,
)
from exporter.pods import PodMap
from exporter.sampler import Sampler
from gpupack.quantity import format_memory
from gpupack.runtime.api import ApiError
from gpupack.runtime.informer import Informer
from tests.fakes import FakeKube

JSON = dict[str, Any]
NODE = "gpu-1"
KUBELET_AWAY = "no kubelet pod-resources socket at /x; is the hostPath mounted?"


class PatchingKube(FakeKube):
    """FakeKube plus the merge patch the exporter sends, recorded (and failable)."""

    def __init__(self) -> None:
        super().__init__()
        self.patches: list[tuple[str, JSON]] = []
        self.patch_errors: list[ApiError] = []

    def patch(self, path: str, body: JSON) -> JSON:
        if self.patch_errors:
            raise self.patch_errors.pop(0)
        self.patches.append((path, body))
        return body


class Kubelet:
    def __init__(self) -> None:
        self.pods: list[PodResources] = []
        self.down: str | None = None
        self.calls = 0

    def list(self) -> list[PodResources]:
        self.calls += 1
        if self.down:
            raise PodResourcesUnavailable(self.down)
        return self.pods


def capacity(name: str, uid: str, annotations: Mapping[str, str] | None = None) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "gpupack-system",
            "uid": uid,
            "labels": {"gpupack.io/role": "capacity"},
            "annotations": dict(annotations or {}),
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "hold"}]},
        "status": {"phase": "Running"},
    }


def holding(name: str, device: str) -> PodResources:
    devices = (ContainerDevices("nvidia.com/gpu", (device,)),)
    return PodResources(name, "gpupack-system", (ContainerResources("hold", devices),))


@pytest.fixture
def kube() -> PatchingKube:
    return PatchingKube()


@dataclass
class Parts:
    agent: Agent
    kubelet: Kubelet
    reader: FakeReader
    sampler: Sampler
    informer: Informer

    def __iter__(self) -> Iterator[Any]:
        return iter((self.agent, self.kubelet, self.reader))


@pytest.fixture
def parts(kube: PatchingKube, tmp_path: Path) -> Iterator[Parts]:
    informer = node_pods(kube, NODE)
    reader = FakeReader.typical(gpus=2, processes_per_gpu=0)
    health = Health()
    sampler = Sampler(reader, health)
    kubelet = Kubelet()
    agent = Agent(kube, PodMap(informer), sampler, ProcessTable(tmp_path), kubelet, health)
    sampler.sample_once()
    informer.start()
    assert informer.wait_synced(5)
    yield Parts(agent, kubelet, reader, sampler, informer)
    informer.stop()


def synced_put(kube: PatchingKube, parts: Parts, pod: JSON) -> None:
    kube.put(pod)
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    assert parts.informer.wait_for(lambda informer: informer.get(key) is not None, 5)


def test_discovery_writes_the_gpu_and_its_memory_with_a_resource_version_precondition(
    kube: PatchingKube, parts: Parts
) -> None:
    agent, kubelet, reader = parts
    memory = format_memory(reader.device(fake_uuid(1)).memory_total)
    synced_put(kube, parts, capacity("cap-a", "uid-a"))
    kubelet.pods = [holding("cap-a", fake_uuid(1))]
    assert agent.discover() == 1
    ((path, body),) = kube.patches
    assert path == "/api/v1/namespaces/gpupack-system/pods/cap-a"
    seen = parts.informer.get("gpupack-system/cap-a")
    assert seen is not None
    assert body["metadata"]["resourceVersion"] == seen["metadata"]["resourceVersion"] != ""
    assert body["metadata"]["annotations"] == {
        "gpupack.io/gpu-uuid": fake_uuid(1),
        "gpupack.io/gpu-memory": memory,
    }
    assert agent.health.snapshot().up == {POD_RESOURCES: True, API: True, "nvml": True}


def test_a_pod_that_already_says_the_right_gpu_is_left_alone(
    kube: PatchingKube, parts: Parts
) -> None:
    agent, kubelet, reader = parts
    memory = format_memory(reader.device(fake_uuid(0)).memory_total)
    done = {"gpupack.io/gpu-uuid": fake_uuid(0), "gpupack.io/gpu-memory": memory}
    synced_put(kube, parts, capacity("cap-a", "uid-a", done))
    kubelet.pods = [holding("cap-a", "0")]  # the device plugin's index strategy
    assert agent.discover() == 0
    assert kube.patches == []


def test_kubelet_away_is_one_logged_state_and_counted_failures(
    kube: PatchingKube,
    parts: Parts,
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent, kubelet, _ = parts
    synced_put(kube, parts, capacity("cap-a", "uid-a"))
    kubelet.down = KUBELET_AWAY
    with caplog.at_level(logging.INFO, logger="exporter.health"):
        for _ in range(3):
            assert agent.discover() == 0
        kubelet.down = None
        kubelet.pods = [holding("cap-a", fake_uuid(0))]
        assert agent.discover() == 1
    snapshot = agent.health.snapshot()
    assert snapshot.errors[POD_RESOURCES] == 3
    assert snapshot.up[POD_RESOURCES] is True
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if "socket" in m] == [f"pod-resources: {KUBELET_AWAY}"]
    assert "pod-resources recovered" in messages


@pytest.mark.parametrize(
    ("error", "api_up", "patched"),
    [
        pytest.param(
            ApiError(409, "Conflict", "the object has been modified"), True, 0, id="newer-pod"
        ),
        pytest.param(ApiError(404, "NotFound", "gone"), True, 0, id="gone"),
        pytest.param(ApiError(0, "ConnectionError", "refused"), False, 0, id="api-away"),
    ],
)
def test_a_refused_patch_is_skipped_and_only_an_outage_marks_the_api_down(
    kube: PatchingKube,
    parts: Parts,
    error: ApiError,
    api_up: bool,
    patched: int,
) -> None:
    agent, kubelet, _ = parts
    synced_put(kube, parts, capacity("cap-a", "uid-a"))
    kubelet.pods = [holding("cap-a", fake_uuid(0))]
    kube.patch_errors.append(error)
    assert agent.discover() == patched
    assert agent.health.snapshot().up[API] is api_up
    assert agent.discover() == 1  # and the next round writes it


def test_a_problem_is_logged_once_while_it_lasts(
    kube: PatchingKube,
    parts: Parts,
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent, kubelet, _ = parts
    synced_put(kube, parts, capacity("cap-a", "uid-a"))
    kubelet.pods = [holding("cap-a", "bogus")]
    with caplog.at_level(logging.WARNING, logger="exporter.agent"):
        for _ in range(3):
            agent.discover()
    (record,) = caplog.records
    assert "gpupack-system/cap-a" in record.getMessage()


def test_a_scrape_names_each_pids_owner(kube: PatchingKube, parts: Parts, tmp_path: Path) -> None:
    agent, _, reader = parts
    uid = "0b0a6a3e-5e0f-4c8e-9a4c-2a9e3f1d7c11"
    write_proc(tmp_path, 4001, cgroup=containerd_v2(uid, "c" * 64))
    write_proc(tmp_path, 4002, cgroup="0::/user.slice/user-0.slice/session-1.scope\n")
    reader.set_process(fake_uuid(0), 4001, sm=0.4)
    reader.set_process(fake_uuid(0), 4002, sm=0.1)
    reader.set_process(fake_uuid(1), 4003, sm=0.1)  # exited: no /proc entry
    parts.sampler.sample_once()
    owners = agent.scrape().owners
    assert (owners[4001].kind, owners[4001].pod_uid, owners[4001].container_id) == (
        "pod",
        uid,
        "c" * 64,
    )
    assert owners[4002].kind == "host"
    assert owners[4003].kind == "gone"


def test_a_broken_pod_watch_marks_the_api_down_and_discovery_goes_on(
    kube: PatchingKube, parts: Parts
) -> None:
    agent, kubelet, _ = parts
    synced_put(kube, parts, capacity("cap-a", "uid-a"))
    kubelet.pods = [holding("cap-a", fake_uuid(0))]
    kube.fail("watch", ApiError(0, "ConnectionError", "connection refused"), times=1000)
    kube.end_watches()
    assert kube.wait_for(lambda: parts.informer.error != "", 5)

    assert agent.discover() == 1  # from the pods known before the outage
    snapshot = agent.health.snapshot()
    assert snapshot.up[API] is False
    assert "connection refused" in snapshot.messages[API]


class DraApi:
    """What the API server answers the claim reader: one ResourceClaim, the node's slices."""

    def __init__(self, claim: JSON, slices: list[JSON]) -> None:
        self.claim = claim
        self.slices = slices
        self.reads: list[str] = []

    def get(self, path: str, *, timeout: float | None = None) -> JSON:
        self.reads.append(path)
        if path.endswith(f"/resourceclaims/{self.claim['metadata']['name']}"):
            return self.claim
        raise ApiError(404, "NotFound", path)

    def list(self, path: str, params: Mapping[str, str]) -> JSON:
        self.reads.append(f"{path}?{params['fieldSelector']}")
        return {"items": self.slices}


def claimed(name: str, claim: str) -> JSON:
    """A capacity pod kube-scheduler gave its GPU through the ResourceClaim `claim`."""
    pod = capacity(name, f"uid-{name}")
    pod["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": claim,
        "requestMappings": [
            {"containerName": "hold", "resourceName": "nvidia.com/gpu", "requestName": "r-0"}
        ],
    }
    return pod


def allocation(claim: str, device: str | None) -> JSON:
    results = [{"request": "r-0", "driver": "gpu.nvidia.com", "pool": NODE, "device": device}]
    status = {"allocation": {"devices": {"results": results}}} if device else {}
    return {"metadata": {"name": claim, "namespace": "gpupack-system"}, "status": status}


def node_slice(*uuids: str) -> JSON:
    devices = [
        {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": u}}}
        for i, u in enumerate(uuids)
    ]
    spec = {
        "driver": "gpu.nvidia.com",
        "nodeName": NODE,
        "pool": {"name": NODE},
        "devices": devices,
    }
    return {"metadata": {"name": f"{NODE}-gpu.nvidia.com"}, "spec": spec}


def dra_agent(kube: PatchingKube, parts: Parts, api: DraApi) -> Agent:
    return Agent(
        kube,
        PodMap(parts.informer),
        parts.sampler,
        ProcessTable(Path("/nonexistent")),
        parts.kubelet,
        Health(),
        claims=ClaimReader(api, NODE),
    )


def test_a_gpu_dra_gave_is_written_from_the_claims_allocation_and_the_nodes_slices(
    kube: PatchingKube, parts: Parts
) -> None:
    """kube-scheduler allocated device gpu-1 of the node's pool: its `uuid` attribute is
    the GPU, read once (an allocated claim does not change)."""
    api = DraApi(allocation("cap-a-extended-resources-x", "gpu-1"), [
        node_slice(fake_uuid(0), fake_uuid(1))
    ])  # fmt: skip
    agent = dra_agent(kube, parts, api)
    synced_put(kube, parts, claimed("cap-a", "cap-a-extended-resources-x"))

    assert agent.discover() == 1
    ((path, body),) = kube.patches
    assert path == "/api/v1/namespaces/gpupack-system/pods/cap-a"
    assert body["metadata"]["annotations"]["gpupack.io/gpu-uuid"] == fake_uuid(1)
    assert "gpupack.io/gpu-memory" in body["metadata"]["annotations"]  # NVML's, as ever
    assert api.reads == [
        "/apis/resource.k8s.io/v1/namespaces/gpupack-system/resourceclaims/"
        "cap-a-extended-resources-x",
        f"/apis/resource.k8s.io/v1/resourceslices?spec.nodeName={NODE}",
    ]
    agent.discover()
    assert len(api.reads) == 2


def test_a_claim_not_allocated_yet_is_a_problem_naming_it_and_nothing_is_written(
    kube: PatchingKube, parts: Parts, caplog: pytest.LogCaptureFixture
) -> None:
    api = DraApi(allocation("cap-b-claim", None), [node_slice(fake_uuid(0))])
    agent = dra_agent(kube, parts, api)
    synced_put(kube, parts, claimed("cap-b", "cap-b-claim"))

    with caplog.at_level(logging.WARNING):
        assert agent.discover() == 0
    assert kube.patches == []
    assert "capacity pod gpupack-system/cap-b: ResourceClaim cap-b-claim has no allocation" in (
        caplog.text
    )


def test_a_device_no_slice_gives_a_uuid_is_a_problem_and_asked_again(
    kube: PatchingKube, parts: Parts, caplog: pytest.LogCaptureFixture
) -> None:
    api = DraApi(allocation("cap-c-claim", "gpu-1"), [node_slice(fake_uuid(0))])
    agent = dra_agent(kube, parts, api)
    synced_put(kube, parts, claimed("cap-c", "cap-c-claim"))

    with caplog.at_level(logging.WARNING):
        assert agent.discover() == 0
    assert f"no ResourceSlice of this node gives device gpu-1 of pool {NODE}" in caplog.text
    api.slices = [node_slice(fake_uuid(0), fake_uuid(1))]
    assert agent.discover() == 1  # the driver published it since


def test_a_slice_naming_a_gpu_nvml_does_not_list_is_not_written(
    kube: PatchingKube, parts: Parts, caplog: pytest.LogCaptureFixture
) -> None:
    """A ResourceSlice is anyone's to write who may write slices: the UUID it gives is
    written on the capacity pod only if NVML on this node lists that GPU."""
    api = DraApi(allocation("cap-d-claim", "gpu-0"), [node_slice(fake_uuid(9))])
    agent = dra_agent(kube, parts, api)
    synced_put(kube, parts, claimed("cap-d", "cap-d-claim"))
    with caplog.at_level(logging.WARNING):
        assert agent.discover() == 0
    assert kube.patches == []
    assert f"kubelet names GPU {fake_uuid(9)}, which NVML on this node does not list" in (
        caplog.text
    )
