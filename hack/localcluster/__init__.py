"""A real Kubernetes control plane as local processes, with kwok's simulated GPU nodes
and gpupack's components on it: what the integration tests, the benchmarks and
`hack/demo` run on (Docker, and so kind, is not available on the test machines; any
cluster with a kubeconfig can stand in, see `Kube.from_kubeconfig`).

One concept a module:

- `client`: the harness's own API client and error type, independent of
  `gpupack.runtime` on purpose (a bug in one must not hide in the other);
- `processes`: starting, logging and stopping the control plane's processes; free ports;
- `controlplane`: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok;
  the PKI and the kubeconfigs;
- `nodes`: the simulated GPU nodes kwok plays;
- `chart`: what `helm template` renders: every component's RBAC, the webhook's
  registration, the gpupack kube-scheduler's configuration;
- `containers`: a container the chart renders, as a local process with the same
  command line;
- `realnode`: one real kubelet node (containerd, runc, CNI, kube-proxy) beside kwok's;
- `karpenter`: Karpenter's kwok provider, the real autoscaler, started on demand;
- `clock`: a component whose wall clock is off (libfaketime), for the clock-skew tests;
- `components`: `LocalCluster`, the control plane plus gpupack's CRDs and components as
  local processes;
- `gpus`: the node agent's stand-in that gives capacity pods fake GPU UUIDs;
- `prometheus`: a real Prometheus, started on demand, scraping as the chart's
  ServiceMonitor says;
- `__main__`: `python -m hack.localcluster assign-gpus` (the demo runs it beside its
  cluster).
"""

from hack.localcluster.chart import (
    CHART_DIR,
    EXPORTER_NAME,
    RECOMMENDER_NAME,
    SCHEDULER_NAME,
    SYSTEM_NAMESPACE,
    WEBHOOK_NAME,
    chart_rbac,
    chart_scheduler_config,
    chart_webhook_configuration,
    render_chart,
)
from hack.localcluster.client import JSON, ApiError, ClusterError, Kube, resource_path
from hack.localcluster.components import LocalCluster
from hack.localcluster.controlplane import READY_TIMEOUT, ControlPlane
from hack.localcluster.gpus import SimulatedGpuAssigner
from hack.localcluster.nodes import DEFAULT_NODE_POOLS, GPU_TAINT, NodePool, node_manifest
from hack.localcluster.processes import Process, free_port, log, stop_pid

__all__ = [
    "CHART_DIR",
    "DEFAULT_NODE_POOLS",
    "EXPORTER_NAME",
    "GPU_TAINT",
    "JSON",
    "READY_TIMEOUT",
    "RECOMMENDER_NAME",
    "SCHEDULER_NAME",
    "SYSTEM_NAMESPACE",
    "WEBHOOK_NAME",
    "ApiError",
    "ClusterError",
    "ControlPlane",
    "Kube",
    "LocalCluster",
    "NodePool",
    "Process",
    "SimulatedGpuAssigner",
    "chart_rbac",
    "chart_scheduler_config",
    "chart_webhook_configuration",
    "free_port",
    "log",
    "node_manifest",
    "render_chart",
    "resource_path",
    "stop_pid",
]
