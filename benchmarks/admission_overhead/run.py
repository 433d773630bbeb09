"""What the webhook adds to pod creation, measured through a real API server.

One local cluster (hack/localcluster/) with the webhook registered as the chart
registers it. In one run: create N single-GPU pods in an opted-in namespace (each one
admitted through gpupack: decision, patch, capacity planning, capacity pods created as
the pool grows) and N in a namespace that is not opted in (the API server's selectors
skip the webhook), one after another over one keep-alive connection, in alternating
rounds. Reports both times and `ratio` = opted-in / not. Target: ratio <= 1.3.

`device_env`: what the node's trust boundary adds to every other pod of the cluster
where the webhook writes `NVIDIA_VISIBLE_DEVICES=void` (Kubernetes before 1.36): N
CPU-only pods in the namespace that is not opted in (each sent to `POST /devices`)
against the same pods carrying the variable already (the API server's match condition
skips the call), in the same rounds; `ratio` = sent / skipped.

Where the difference goes (`breakdown`, milliseconds per pod, medians over the rounds;
the three parts add up to `extra_ms_per_pod`). The same rounds also run as dry runs:
the API server admits, validates and answers, and writes nothing; the webhook decides
and plans capacity, and creates none.

- `webhook_call_ms`: in the dry rounds, what the API server waited on gpupack's webhook
  (its own metric `apiserver_admission_webhook_admission_duration_seconds`), of which
  `webhook_handler_ms` is the webhook's own time to answer
  (`gpupack_webhook_admission_duration_seconds`), the rest TLS, HTTP and the API
  server's client. Of the handler's time, `webhook_work_ms` is what follows the body's
  read (it never yields the event loop): `webhook_work_cpu_ms` of it the loop thread's
  CPU time, `webhook_gil_wait_ms` the rest, waiting for the GIL (the watch threads apply
  every pod created) or a core;
- `write_path_ms`: the rest of the dry rounds' difference (opted-in minus not): the
  patch applied, the larger pod validated and encoded;
- `capacity_ms`: what the real rounds' difference adds to the dry rounds'. The webhook
  answers before any capacity pod exists (it creates them in the background), so this
  is the capacity pods' creation competing with the benchmark's own creates for the API
  server, etcd and the machine's cores (the webhook's answers get slower too: compare
  `real_rounds_webhook_call_ms`), and the control plane's work on them.

`cpu_ms_per_pod`: for each kind of round, the CPU time the cluster's processes spent
per pod created (`all`: every process and this benchmark's client; then the API server,
etcd, the webhook and the client one by one; from /proc, medians over the rounds), and
`cpu_ratio`, opted in over not, from `all`. It is steadier than the times: on a machine
whose every core is busy, work moved off the admission's path (the webhook answering
before its capacity plan) shortens the call and not the round, and only less work
shows in both.

Usage: .venv/bin/python benchmarks/admission_overhead/run.py [--pods 200] [--rounds 2]
(needs the binaries: run hack/test or hack/demo once, or source hack/lib/binaries.sh).
The last output line is one JSON object.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.processes import cpu_seconds
from hack.localcluster import SYSTEM_NAMESPACE, Kube, LocalCluster

TARGET: Final = 1.3
# The processes whose CPU per pod is shown one by one (`cpu_ms_per_pod`); `all` counts
# every process of the cluster and the benchmark's own.
CPU_SHOWN: Final = ("kube-apiserver", "etcd", "gpupack-webhook", "benchmark")


def gpu_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                    "resources": {
                        "limits": {"cpu": "100m", "memory": "128Mi", "nvidia.com/gpu": "1"}
                    },
                }
            ],
        },
    }


def cpu_pod(name: str, guarded: bool = False) -> dict[str, Any]:
    """A pod that asks for no GPU; `guarded`: its container says NVIDIA_VISIBLE_DEVICES=void
    already, so the webhook is not called for it."""
    pod = gpu_pod(name)
    container = pod["spec"]["containers"][0]
    container["resources"] = {"limits": {"cpu": "100m", "memory": "128Mi"}}
    if guarded:
        container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    return pod


def namespace(kube: Kube, opted_in: bool) -> str:
    labels = {"gpupack.io/optimize": "enabled"} if opted_in else {}
    return kube.create_namespace(f"bench-{'in' if opted_in else 'out'}", labels)


def create_pods(kube: Kube, ns: str, count: int, dry_run: bool = False, cpu: str = "") -> float:
    """Seconds to create `count` pods: GPU pods, or with `cpu` ("sent", "skipped") CPU-only
    pods that the devices webhook is, or is not, called for."""
    started = time.perf_counter()
    for index in range(count):
        body = cpu_pod(f"p-{index}", cpu == "skipped") if cpu else gpu_pod(f"p-{index}")
        kube.create(f"/api/v1/namespaces/{ns}/pods", body, dry_run=dry_run)
    return time.perf_counter() - started


def histogram(text: str, name: str, **labels: str) -> tuple[float, float]:
    """(sum, count) of histogram `name` over the series whose labels include `labels`."""
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not all(sample.labels.get(k) == v for k, v in labels.items()):
                continue
            if sample.name == f"{name}_sum":
                total += sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
    return total, count


def counter(text: str, name: str) -> float:
    """The value of the unlabelled counter `name` (its `_total` sample)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_total":
                return float(sample.value)
    return 0.0


def waits(kube: Kube, webhook_metrics: str) -> tuple[float, float, float, float]:
    """Seconds so far: the API server waiting on gpupack's webhook, the webhook answering,
    the webhook's own work after reading each body (wall-clock), and its event loop
    thread's CPU time over that work (the rest is waiting for the GIL or a core)."""
    apiserver = kube.text("GET", "/metrics", content_type="text/plain")
    called, _ = histogram(
        apiserver, "apiserver_admission_webhook_admission_duration_seconds", operation="CREATE"
    )
    with urllib.request.urlopen(webhook_metrics, timeout=10) as response:
        text = response.read().decode()
    handled, _ = histogram(text, "gpupack_webhook_admission_duration_seconds")
    work = counter(text, "gpupack_webhook_admission_work_seconds")
    cpu = counter(text, "gpupack_webhook_admission_work_cpu_seconds")
    return called, handled, work, cpu


def cpu_per_pod(before: dict[str, float], after: dict[str, float], pods: int) -> dict[str, float]:
    """Milliseconds of CPU per pod created between the two readings (`cpu_seconds`): all
    the processes together, and each of `CPU_SHOWN`."""
    spent = {name: after[name] - before.get(name, 0.0) for name in after}
    shown = {name: spent.get(name, 0.0) / pods * 1000 for name in CPU_SHOWN}
    return {"all": sum(spent.values()) / pods * 1000, **shown}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=200, help="pods per namespace and round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (median)")
    args = parser.parse_args(argv)
    kinds = ("opted_in", "not_opted_in", "opted_in_dry", "not_opted_in_dry",
             "cpu_sent", "cpu_skipped")  # fmt: skip
    times: dict[str, list[float]] = {k: [] for k in kinds}
    call_ms: dict[str, list[float]] = {"opted_in": [], "opted_in_dry": []}
    handler_ms: dict[str, list[float]] = {"opted_in": [], "opted_in_dry": []}
    work_ms: dict[str, list[float]] = {"opted_in": [], "opted_in_dry": []}
    cpu_ms: dict[str, list[float]] = {"opted_in": [], "opted_in_dry": []}
    used: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}  # CPU ms per pod
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp)) as cluster:
        cluster.install_webhook()
        kube = cluster.kube()
        webhook_metrics = f"http://127.0.0.1:{cluster.webhook_metrics_port}/metrics"
        create_pods(kube, namespace(kube, opted_in=False), 20)  # warm-up: connections, caches
        for round_ in range(args.rounds):
            order = kinds if round_ % 2 == 0 else tuple(reversed(kinds))
            for kind in order:
                devices = kind.removeprefix("cpu_") if kind.startswith("cpu_") else ""
                opted_in = not kind.startswith(("not", "cpu"))
                dry = kind.endswith("dry")
                ns = namespace(kube, opted_in)
                before, cpu_before = waits(kube, webhook_metrics), cpu_seconds(cluster.processes)
                seconds = create_pods(kube, ns, args.pods, dry_run=dry, cpu=devices)
                cpu_after, after = cpu_seconds(cluster.processes), waits(kube, webhook_metrics)
                times[kind].append(seconds)
                used[kind].append(cpu_per_pod(cpu_before, cpu_after, args.pods))
                if kind in call_ms:
                    call_ms[kind].append((after[0] - before[0]) / args.pods * 1000)
                    handler_ms[kind].append((after[1] - before[1]) / args.pods * 1000)
                    work_ms[kind].append((after[2] - before[2]) / args.pods * 1000)
                    cpu_ms[kind].append((after[3] - before[3]) / args.pods * 1000)
                print(
                    f"  round {round_ + 1} {kind:16s}: {args.pods} pods in {seconds:.2f} s",
                    file=sys.stderr,
                )
        capacity = len(kube.get(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods")["items"])
    per_pod = {k: statistics.median(v) / args.pods * 1000 for k, v in times.items()}
    opted, plain = statistics.median(times["opted_in"]), statistics.median(times["not_opted_in"])
    call = {k: statistics.median(v) for k, v in call_ms.items()}
    handler = {k: statistics.median(v) for k, v in handler_ms.items()}
    work = {k: statistics.median(v) for k, v in work_ms.items()}
    cpu = {k: statistics.median(v) for k, v in cpu_ms.items()}
    cpu_used = {
        kind: {name: round(statistics.median(r[name] for r in rounds), 2) for name in rounds[0]}
        for kind, rounds in used.items()
    }
    dry_extra = per_pod["opted_in_dry"] - per_pod["not_opted_in_dry"]
    extra = per_pod["opted_in"] - per_pod["not_opted_in"]
    result = {
        "benchmark": "admission-overhead",
        "pods": args.pods,
        "rounds": args.rounds,
        "opted_in_s": round(opted, 3),
        "not_opted_in_s": round(plain, 3),
        "opted_in_ms_per_pod": round(per_pod["opted_in"], 2),
        "not_opted_in_ms_per_pod": round(per_pod["not_opted_in"], 2),
        "dry_run_ms_per_pod": {
            "opted_in": round(per_pod["opted_in_dry"], 2),
            "not_opted_in": round(per_pod["not_opted_in_dry"], 2),
        },
        "breakdown": {
            "extra_ms_per_pod": round(extra, 2),
            "webhook_call_ms": round(call["opted_in_dry"], 2),
            "webhook_handler_ms": round(handler["opted_in_dry"], 2),
            "webhook_work_ms": round(work["opted_in_dry"], 3),
            "webhook_work_cpu_ms": round(cpu["opted_in_dry"], 3),
            "webhook_gil_wait_ms": round(work["opted_in_dry"] - cpu["opted_in_dry"], 3),
            "write_path_ms": round(dry_extra - call["opted_in_dry"], 2),
            "capacity_ms": round(extra - dry_extra, 2),
        },
        "real_rounds_webhook_call_ms": round(call["opted_in"], 2),
        "real_rounds_webhook_handler_ms": round(handler["opted_in"], 2),
        "real_rounds_webhook_work_ms": round(work["opted_in"], 3),
        "real_rounds_webhook_work_cpu_ms": round(cpu["opted_in"], 3),
        "capacity_pods_created": capacity,
        "device_env": {
            "sent_ms_per_pod": round(per_pod["cpu_sent"], 2),
            "skipped_ms_per_pod": round(per_pod["cpu_skipped"], 2),
            "ratio": round(per_pod["cpu_sent"] / per_pod["cpu_skipped"], 3),
        },
        "cpu_ms_per_pod": cpu_used,
        "cpu_ratio": round(cpu_used["opted_in"]["all"] / cpu_used["not_opted_in"]["all"], 3),
        "ratio": round(opted / plain, 3),
        "dry_run_ratio": round(per_pod["opted_in_dry"] / per_pod["not_opted_in_dry"], 3),
        "target": TARGET,
        "meets_target": opted / plain <= TARGET,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
