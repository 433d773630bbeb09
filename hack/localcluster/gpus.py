"""The node agent's stand-in for kwok nodes, which have no kubelet and no GPUs."""

import http.client
import queue
import threading
from collections.abc import Callable
from typing import Any, Final

from hack.localcluster.chart import SYSTEM_NAMESPACE
from hack.localcluster.client import ApiError, Kube
from hack.localcluster.nodes import fake_uuid

# Writers of GPU UUIDs at once: a burst's capacity pods are named by as many nodes'
# exporters at a time in a cluster, not one after the other.
WRITERS: Final = 4
# Seconds one watch lasts before it is opened again from the last version seen: how long
# `stop` may take to be noticed.
WATCH_SECONDS: Final = 2
CAPACITY: Final = "gpupack.io/role=capacity"
GPU_UUID: Final = "gpupack.io/gpu-uuid"

JSON = dict[str, Any]


class SimulatedGpuAssigner:
    """TEST INFRASTRUCTURE, not product code. On a real node the exporter asks the kubelet
    (pod-resources API) which GPU it gave each capacity pod and writes `gpupack.io/gpu-uuid`
    on it. kwok nodes have no kubelet and no GPUs, so this thread plays that part: every
    Running capacity pod gets a fake but stable GPU UUID of a free device on its node, and
    the node's GPU memory. It reads with `kube` and writes with `writer` (the exporter's
    ServiceAccount, whose annotations the chart's admission policy allows), by default
    `kube`; with `agent` (node -> client: `LocalCluster.node_agent`), each write goes as
    the agent of the pod's node, whose node claim the policy checks.

    Event-driven, as the node agents it stands for: it lists the capacity pods once and
    then watches them, naming a pod as soon as the event that shows it Running arrives
    (`WRITERS` writes at a time); after a broken watch or an expired version (an API
    server restarting, in a fault test) it lists again after `interval` seconds."""

    def __init__(
        self,
        kube: Kube,
        interval: float = 0.3,
        writer: Kube | None = None,
        namespace: str = SYSTEM_NAMESPACE,
        agent: Callable[[str], Kube] | None = None,
    ) -> None:
        self._namespace = namespace
        self._path = f"/api/v1/namespaces/{namespace}/pods"
        self._kube = kube
        self._writer = writer or kube
        self._agent = agent  # node -> that node's agent: writes carry its node claim
        self._agents: dict[str, Kube] = {}  # node -> its agent, made once (and again on 401)
        self._creating = threading.Lock()
        self._interval = interval
        self.skip_nodes: set[str] = set()  # nodes whose real exporter a test runs
        self._labels: dict[str, dict[str, str]] = {}  # node -> its labels, read once
        self._pods: dict[str, JSON] = {}  # capacity pod name -> as last seen
        self._lock = threading.Lock()
        # pod -> (its uid, node, UUID) being written: a pod deleted and made again under
        # its name (a capacity pod whose node went) is another pod.
        self._asked: dict[str, tuple[str, str, str]] = {}
        self._writes: queue.Queue[tuple[str, JSON] | None] = queue.Queue()
        self._failed = threading.Event()  # a write failed: list again, and name it then
        self._version: str | None = None  # the last resourceVersion the watch saw
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="simulated-gpu-assigner", daemon=True
        )

    def __enter__(self) -> "SimulatedGpuAssigner":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._thread.join(timeout=WATCH_SECONDS + 10)

    def stop(self) -> None:
        self._stop.set()

    def stopped(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for `stop()`; True once it was called."""
        return self._stop.wait(timeout)

    @staticmethod
    def fake_uuid(node: str, index: int) -> str:
        return fake_uuid(node, index)

    def _run(self) -> None:
        writers = [
            threading.Thread(target=self._write_loop, name=f"gpu-assigner-{i}", daemon=True)
            for i in range(WRITERS)
        ]
        for thread in writers:
            thread.start()
        try:
            while not self._stop.is_set():
                # An API server restarting (a fault test) breaks reads every way: the
                # thread must outlive it, as the exporter it stands for does.
                try:
                    if self._version is None or self._failed.is_set():
                        self._failed.clear()
                        self._version = self._relist()
                    self._follow(self._version)
                except TimeoutError:
                    continue  # a quiet watch: open it again from the last version seen
                except (ApiError, OSError, http.client.HTTPException, ValueError):
                    self._version = None
                if self._version is None:
                    self._stop.wait(self._interval)
        finally:
            for _ in writers:
                self._writes.put(None)
            for thread in writers:
                thread.join(timeout=10)
            self._kube.close()  # the writers' connections closed as their threads ended

    def _relist(self) -> str:
        if not self._labels:  # every node's at once: one read, not one per node in a burst
            for node in self._kube.get("/api/v1/nodes")["items"]:
                self._labels[node["metadata"]["name"]] = node["metadata"].get("labels") or {}
        listing = self._kube.get(self._path, labelSelector=CAPACITY)
        pods = {p["metadata"]["name"]: p for p in listing["items"]}
        with self._lock:
            self._pods = pods
            self._asked = {
                k: v
                for k, v in self._asked.items()
                if k in pods and pods[k]["metadata"].get("uid") == v[0]
            }
        for name in pods:
            self._assign(name)
        return str(listing["metadata"]["resourceVersion"])

    def _follow(self, version: str) -> None:
        """Watch from `version` for `WATCH_SECONDS`, keeping the last version seen (None
        when the watch says it is gone: list again)."""
        events = self._kube.watch(
            self._path,
            version,
            timeout=WATCH_SECONDS,
            labelSelector=CAPACITY,
            allowWatchBookmarks="true",
        )
        for kind, pod in events:
            if kind == "ERROR":
                self._version = None  # 410 Gone: the version is too old
                return
            self._version = str(pod["metadata"]["resourceVersion"])
            if kind == "BOOKMARK":
                continue
            name = pod["metadata"]["name"]
            with self._lock:
                if kind == "DELETED":
                    self._pods.pop(name, None)
                    self._asked.pop(name, None)
                    continue
                self._pods[name] = pod
            self._assign(name)
            if self._stop.is_set():
                break

    def _assign(self, name: str) -> None:
        """Name capacity pod `name` if it runs and has no GPU yet: a free device of its
        node, none of the node's pods holding or being given it."""
        with self._lock:
            pod = self._pods.get(name)
            uid = str(pod["metadata"].get("uid", "")) if pod is not None else ""
            asked = self._asked.get(name)
            if pod is None or (asked is not None and asked[0] == uid):
                return
            node = pod["spec"].get("nodeName")
            annotations = pod["metadata"].get("annotations") or {}
            if (
                not node
                or node in self.skip_nodes
                or pod.get("status", {}).get("phase") != "Running"
                or GPU_UUID in annotations
            ):
                return
            used = {at for _, held, at in self._asked.values() if held == node}
            for other in self._pods.values():
                held = (other["metadata"].get("annotations") or {}).get(GPU_UUID)
                if held and other["spec"].get("nodeName") == node:
                    used.add(held)
        labels = self._labels.get(node)
        if labels is None:  # GPU count and memory: a node's never change
            labels = self._labels[node] = self._kube.get(f"/api/v1/nodes/{node}")["metadata"][
                "labels"
            ]
        gpus = int(labels.get("nvidia.com/gpu.count", "1"))
        free = [i for i in range(gpus) if self.fake_uuid(node, i) not in used]
        if not free:
            return
        chosen = self.fake_uuid(node, free[0])
        patch = {GPU_UUID: chosen}
        if "nvidia.com/gpu.memory" in labels:
            patch["gpupack.io/gpu-memory"] = f"{labels['nvidia.com/gpu.memory']}Mi"
        with self._lock:
            self._asked[name] = (uid, node, chosen)
        self._writes.put((name, patch))

    def _write_loop(self) -> None:
        try:
            while (item := self._writes.get()) is not None:
                name, patch = item
                with self._lock:
                    asked = self._asked.get(name)
                node = asked[1] if asked is not None else None
                try:
                    writer = self._writer if node is None else self._agent_of(node)
                    writer.merge_patch(f"{self._path}/{name}", {"metadata": {"annotations": patch}})
                except (ApiError, OSError, http.client.HTTPException) as error:
                    with self._lock:  # gone, or the API server restarting: ask again later
                        self._asked.pop(name, None)
                        if isinstance(error, ApiError) and error.status == 401 and node:
                            # Its token died: anew. Its connections close as it goes.
                            self._agents.pop(node, None)
                    self._failed.set()
        finally:
            self._writer.close()  # this thread's connection (the writer may be shared)

    def _agent_of(self, node: str) -> Kube:
        """Who writes for `node`: its agent (a token asked for once), or `writer`."""
        if self._agent is None:
            return self._writer
        with self._creating:  # one agent per node, even when writers race for it
            with self._lock:
                known = self._agents.get(node)
            if known is None:
                known = self._agent(node)
                with self._lock:
                    self._agents[node] = known
        return known
