"""What gpupack's admission policies add to every pod status update of the cluster.

Every kubelet writes each of its pods' status several times over the pod's life, and
kube-scheduler, the controllers and gpupack write it too; the chart's
ValidatingAdmissionPolicy that matches pod updates (`gpupack-immutable-allocations`:
gpupack's own metadata, and the scheduler's pod writes where the chart lets it write
pods) runs on each of those writes, for every pod of the cluster, opted in or not.
Before Kubernetes 1.37 the API server converts the pod and its old version to CEL's form
for each evaluation: once for a policy's match conditions, three times for a policy
whose validations run.

One local cluster (hack/localcluster/: the real API server, the chart's policies as
rendered). Pods that no scheduler binds (`--pods`, each with labels, annotations and a
container's env, about the size of a Deployment's pod); then, in alternating rounds,
`--updates` status updates (merge patches of one condition, as a kubelet's heartbeat of
a condition would be) under each of:

- `none`: none of gpupack's policies bound (the baseline: what the cluster costs without
  gpupack);
- `chart`: the chart's policies as rendered;
- `no_match_condition`: the same, but `gpupack-immutable-allocations` without its match
  condition (as it was before it had one: its validations run on every update).

Reports the API server's CPU per update (from /proc; a steadier figure than time) and
the client's wall-clock time per update, medians over the rounds, and `ratio`: each
variant's figures over `none`'s in the same round, the median over the rounds.

Usage: .venv/bin/python -m benchmarks.pod_updates.run [--pods 50] [--updates 1500] [--rounds 3]
(needs the binaries: run hack/test or hack/demo once). The last line is one JSON object.
"""

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import yaml

from benchmarks.processes import cpu_seconds
from hack.localcluster import Kube, LocalCluster, chart

BINDINGS: Final = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
NAMESPACE: Final = "pod-updates"
VARIANTS: Final = ("none", "chart", "no_match_condition")
SETTLE_SECONDS: Final = 3.0  # the API server's policy informers see a change
WARM_UPDATES: Final = 100


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": "web", "pod-template-hash": "5d8f7c9b6"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-29T10:00:00Z"},
        },
        "spec": {
            "schedulerName": "nobody",  # never bound: only this benchmark writes it
            "containers": [
                {
                    "name": "web",
                    "image": "nginx",
                    "env": [{"name": f"SETTING_{i}", "value": "value"} for i in range(10)],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ],
        },
    }


def rendered_policies(cluster: LocalCluster) -> list[dict[str, Any]]:
    text = chart.render_chart(
        Path(cluster.binary("helm")), chart.ADMISSION_POLICIES, cluster.namespace
    )
    return [doc for doc in yaml.safe_load_all(text) if doc]


def install(kube: Kube, docs: list[dict[str, Any]], variant: str) -> None:
    """The chart's policies and bindings as `variant` has them: the bindings deleted, the
    policies replaced, the bindings created again (none for `none`)."""
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    for binding in bindings:
        kube.delete(f"{BINDINGS}/{binding['metadata']['name']}")
    if variant == "none":
        return
    for doc in docs:
        if doc["kind"] == "ValidatingAdmissionPolicy":
            policy = copy.deepcopy(doc)
            if variant == "no_match_condition" and policy["metadata"]["name"].endswith(
                "-immutable-allocations"
            ):
                policy["spec"].pop("matchConditions", None)
            kube.apply(policy)  # a replacement: a dropped field goes
    for binding in bindings:
        kube.create(BINDINGS, binding)


def apiserver_cpu(cluster: LocalCluster) -> float:
    return cpu_seconds(cluster.processes)["kube-apiserver"]


def update(kube: Kube, pods: int, index: int, tag: str) -> None:
    condition = {"type": "example.com/heartbeat", "status": "True", "message": tag}
    kube.merge_patch(
        f"/api/v1/namespaces/{NAMESPACE}/pods/p{index % pods}/status",
        {"status": {"conditions": [condition]}},
    )


def paired(figures: dict[str, list[float]], variant: str) -> float:
    """The median over the rounds of `variant`'s figure over the baseline's that round."""
    ratios = [x / base for x, base in zip(figures[variant], figures["none"], strict=True)]
    return round(statistics.median(ratios), 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, default=50, help="pods updated in turn")
    parser.add_argument("--updates", type=int, default=1500, help="status updates a round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    args = parser.parse_args(argv)
    if args.pods < 1 or args.updates < 1 or args.rounds < 1:
        parser.error("--pods, --updates and --rounds must be at least 1")
    cpu_ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
    wall_ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp)) as cluster:
        kube = cluster.kube()
        docs = [
            d
            for d in rendered_policies(cluster)
            if d["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
        ]
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for i in range(args.pods):
            kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod(f"p{i}"))
        for round_ in range(args.rounds):
            order = VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS))
            for variant in order:
                install(kube, docs, variant)
                time.sleep(SETTLE_SECONDS)
                for k in range(WARM_UPDATES):
                    update(kube, args.pods, k, f"warm {round_} {variant} {k}")
                before, started = apiserver_cpu(cluster), time.monotonic()
                for k in range(args.updates):
                    update(kube, args.pods, k, f"{round_} {variant} {k}")
                elapsed = time.monotonic() - started
                cpu_ms[variant].append((apiserver_cpu(cluster) - before) / args.updates * 1000)
                wall_ms[variant].append(elapsed / args.updates * 1000)
                print(
                    f"  round {round_ + 1} {variant:18s}: API server {cpu_ms[variant][-1]:.3f} "
                    f"ms CPU, {wall_ms[variant][-1]:.3f} ms an update",
                    file=sys.stderr,
                )
    cpu = {v: statistics.median(x) for v, x in cpu_ms.items()}
    wall = {v: statistics.median(x) for v, x in wall_ms.items()}
    result = {
        "benchmark": "pod-updates",
        "pods": args.pods,
        "updates": args.updates,
        "rounds": args.rounds,
        "apiserver_cpu_ms_per_update": {v: round(x, 3) for v, x in cpu.items()},
        "wall_ms_per_update": {v: round(x, 3) for v, x in wall.items()},
        # Paired within each round (the rounds drift: the API server's CPU per update
        # grows over a run), then the median of the rounds.
        "ratio": {
            variant: {
                "cpu": paired(cpu_ms, variant),
                "wall": paired(wall_ms, variant),
            }
            for variant in ("chart", "no_match_condition")
        },
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
