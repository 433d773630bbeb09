"""The node agent's stand-in for kwok nodes, which have no kubelet and no GPUs."""

import contextlib
import http.client
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from hack.localcluster.chart import SYSTEM_NAMESPACE
from hack.localcluster.client import ApiError, Kube

# Writers of GPU UUIDs at once: a burst's capacity pods are named by as many nodes'
# exporters at a time in a cluster, not one after the other.
WRITERS: Final = 8


class SimulatedGpuAssigner:
    """TEST INFRASTRUCTURE, not product code. On a real node the exporter asks the kubelet
    (pod-resources API) which GPU it gave each capacity pod and writes `gpupack.io/gpu-uuid`
    on it. kwok nodes have no kubelet and no GPUs, so this thread plays that part: every
    Running capacity pod gets a fake but stable GPU UUID of a free device on its node, and
    the node's GPU memory. It reads with `kube` and writes with `writer` (the exporter's
    ServiceAccount, whose annotations the chart's admission policy allows), by default
    `kube`."""

    def __init__(
        self,
        kube: Kube,
        interval: float = 0.3,
        writer: Kube | None = None,
        namespace: str = SYSTEM_NAMESPACE,
    ) -> None:
        self._namespace = namespace
        self._kube = kube
        self._writer = writer or kube
        self._interval = interval
        self.skip_nodes: set[str] = set()  # nodes whose real exporter a test runs
        self._labels: dict[str, dict[str, str]] = {}  # node -> its labels, read once
        self._writers = ThreadPoolExecutor(WRITERS, thread_name_prefix="gpu-assigner")
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="simulated-gpu-assigner", daemon=True
        )

    def __enter__(self) -> "SimulatedGpuAssigner":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._thread.join(timeout=5)

    def stop(self) -> None:
        self._stop.set()

    def stopped(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for `stop()`; True once it was called."""
        return self._stop.wait(timeout)

    @staticmethod
    def fake_uuid(node: str, index: int) -> str:
        return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{index}.gpupack.test"))

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._interval):
                # An API server restarting (a fault test) breaks reads every way: the
                # thread must outlive it, as the exporter it stands for does.
                with contextlib.suppress(ApiError, OSError, http.client.HTTPException):
                    self.assign_once()
        finally:
            self._writers.shutdown(wait=True)
            self._kube.close()
            if self._writer is not self._kube:
                self._writer.close()

    def assign_once(self) -> int:
        pods = self._kube.get(
            f"/api/v1/namespaces/{self._namespace}/pods", labelSelector="gpupack.io/role=capacity"
        )["items"]
        used: dict[str, set[str]] = {}
        for pod in pods:
            uuid_ = (pod["metadata"].get("annotations") or {}).get("gpupack.io/gpu-uuid")
            if uuid_ and pod["spec"].get("nodeName"):
                used.setdefault(pod["spec"]["nodeName"], set()).add(uuid_)
        patches: list[tuple[str, dict[str, str]]] = []
        for pod in pods:
            node = pod["spec"].get("nodeName")
            annotations = pod["metadata"].get("annotations") or {}
            if (
                not node
                or node in self.skip_nodes
                or pod.get("status", {}).get("phase") != "Running"
                or "gpupack.io/gpu-uuid" in annotations
            ):
                continue
            labels = self._labels.get(node)
            if labels is None:  # GPU count and memory: a node's never change
                labels = self._labels[node] = self._kube.get(f"/api/v1/nodes/{node}")["metadata"][
                    "labels"
                ]
            gpus = int(labels.get("nvidia.com/gpu.count", "1"))
            free = [i for i in range(gpus) if self.fake_uuid(node, i) not in used.get(node, set())]
            if not free:
                continue
            chosen = self.fake_uuid(node, free[0])
            used.setdefault(node, set()).add(chosen)
            patch = {"gpupack.io/gpu-uuid": chosen}
            if "nvidia.com/gpu.memory" in labels:
                patch["gpupack.io/gpu-memory"] = f"{labels['nvidia.com/gpu.memory']}Mi"
            patches.append((pod["metadata"]["name"], patch))

        def write(name: str, patch: dict[str, str]) -> None:
            self._writer.merge_patch(
                f"/api/v1/namespaces/{self._namespace}/pods/{name}",
                {"metadata": {"annotations": patch}},
            )

        def write_all(items: list[tuple[str, dict[str, str]]]) -> None:
            try:
                for name, patch in items:
                    write(name, patch)
            finally:
                self._writer.close()  # this worker thread's connection: it may not last

        chunks = [patches[i::WRITERS] for i in range(WRITERS)]
        list(self._writers.map(write_all, [c for c in chunks if c]))
        return len(patches)
