"""TEST INFRASTRUCTURE: one GPU node's exporter over a fake NVML, for integration tests.

The exporter's own sampler, PID-to-pod mapping, collector and HTTP server run in the test
process over a fake NVML (doubles/nvml.py) whose processes belong, through
a fake /proc, to the node's pods. kwok nodes run no containers and have no GPUs, so the
fake processes stand in for them; GPUs are named on capacity pods by the harness's
SimulatedGpuAssigner (NoKubelet), or, given a lister of what kubelet gave each pod, by
this exporter's own discovery, which also writes the GPUs' health; on a node whose GPUs
are DRA devices (`dra`), by the exporter's own discovery from the capacity pods'
ResourceClaims.
"""

import threading
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from doubles.nvml import A100, FakeReader
from doubles.procfs import containerd_v2, write_proc
from exporter import server
from exporter.agent import Agent, Lister, node_pods
from exporter.cgroup import ProcessTable
from exporter.claims import ClaimReader
from exporter.collector import ExporterCollector, Scrape
from exporter.health import Health
from exporter.pods import PodMap
from exporter.readings import Device
from exporter.sampler import Sampler
from gpupack import keys
from gpupack.runtime.transport import connect
from hack.localcluster import SYSTEM_NAMESPACE, LocalCluster, SimulatedGpuAssigner, free_port
from hack.localcluster.chart import EXPORTER_NAME


class NoKubelet:
    """Discovery is the simulated GPU assigner's job here; the agent only scrapes."""

    def list(self) -> list[Any]:
        return []


class FakeNode:
    """The exporter of one node over a fake NVML, and the processes of the node's pods:
    each Running pod of an app in `usage` gets a process on the GPU the scheduler gave
    it, using that app's share of SMs and GPU memory. `host_process` adds a process that
    belongs to no pod (a profiler on the host)."""

    def __init__(
        self,
        cluster: LocalCluster,
        node: str,
        gpus: int,
        proc: Path,
        model: tuple[str, int] = A100,
        kubelet: Lister | None = None,
        *,
        dra: bool = False,
    ) -> None:
        self._kube = cluster.kube()
        self._proc = proc
        self.node = node
        self.devices = [
            Device(i, SimulatedGpuAssigner.fake_uuid(node, i), model[0], model[1])
            for i in range(gpus)
        ]
        self.reader = FakeReader(self.devices)
        self.usage: dict[str, tuple[float, int]] = {}  # app label -> (SM ratio, bytes)
        self._pids: dict[str, tuple[str, int]] = {}  # pod uid -> (gpu, pid)
        self._next_pid = 50_000
        self._kubelet = kubelet
        # The node's GPUs are DRA devices: the exporter's own discovery reads the GPU a
        # capacity pod holds from its ResourceClaim and the node's ResourceSlices.
        self._dra = dra
        # As the exporter's ServiceAccount on this node (a token bound to it), with the
        # chart's RBAC: the admission policies let only it write the GPU annotations of
        # this node's capacity pods.
        cluster.exporter_kubeconfig()
        bound = cluster.node_bound_kubeconfig(cluster.namespace, EXPORTER_NAME, node)
        self._client = connect(str(bound), user_agent="gpupack-exporter")
        self._informer = node_pods(self._client, node)
        self._sampler, self._agent = self._exporter()
        self._discovery: threading.Thread | None = None
        registry = CollectorRegistry()
        registry.register(ExporterCollector(self._scrape))
        self.port = free_port()
        self._http = server.make_server("127.0.0.1", self.port, registry, lambda: (True, {}))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sync_loop, name="fake-node", daemon=True)

    def host_process(self, gpu: int, pid: int, *, memory: int, sm: float) -> None:
        write_proc(self._proc, pid, cgroup="0::/system.slice/nvidia-profiler.service\n")
        self.reader.set_process(self.devices[gpu].uuid, pid, memory=memory, sm=sm)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def _scrape(self) -> Scrape:
        return self._agent.scrape()  # the exporter running now: it may have restarted

    def _exporter(self) -> tuple[Sampler, Agent]:
        health = Health()
        sampler = Sampler(self.reader, health, interval=0.2, min_window=0.5, max_window=60)
        agent = Agent(
            self._client,
            PodMap(self._informer, SYSTEM_NAMESPACE),
            sampler,
            ProcessTable(self._proc),
            self._kubelet or NoKubelet(),
            health,
            claims=ClaimReader(self._client, self.node) if self._dra else None,
        )
        return sampler, agent

    def start(self) -> None:
        self._informer.start()
        self._sampler.start()
        self._http.start()
        self._thread.start()
        self._start_discovery()

    def _start_discovery(self) -> None:
        if self._kubelet is not None or self._dra:
            self._discovery = threading.Thread(
                target=self._agent.run_discovery, args=(0.5,), name="discovery", daemon=True
            )
            self._discovery.start()

    def stop_exporter(self) -> None:
        """The exporter stops (its pod evicted, OOM-killed): no sampling, no discovery."""
        self._agent.stop()
        if self._discovery is not None:
            self._discovery.join(timeout=5)
        self._sampler.stop()

    def start_exporter(self) -> None:
        """A new exporter process: NVML opened again, discovery from the start."""
        self._sampler, self._agent = self._exporter()
        self._sampler.start()
        self._start_discovery()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.stop_exporter()
        self._http.close()
        self._informer.stop()
        self._client.close()
        self._kube.close()

    def _sync_loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self.sync()
            except Exception:  # the API server may blink; the next round catches up
                continue

    def sync(self) -> None:
        pods = self._kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.node}")["items"]
        self._kube.close()
        live: set[str] = set()
        for pod in pods:
            app = (pod["metadata"].get("labels") or {}).get("app", "")
            gpu = (pod["metadata"].get("annotations") or {}).get(keys.GPU_UUID)
            if app not in self.usage or not gpu or pod["status"].get("phase") != "Running":
                continue
            uid = pod["metadata"]["uid"]
            live.add(uid)
            if uid not in self._pids:
                self._next_pid += 1
                self._pids[uid] = (gpu, self._next_pid)
                write_proc(self._proc, self._next_pid, cgroup=containerd_v2(uid, uid[:12] * 5))
            sm, memory = self.usage[app]
            self.reader.set_process(gpu, self._pids[uid][1], memory=memory, sm=sm)
        for uid in [u for u in self._pids if u not in live]:
            gpu, pid = self._pids.pop(uid)
            self.reader.remove_process(gpu, pid)
