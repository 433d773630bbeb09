"""Which pods a shrinking ReplicaSet should lose: `python -m benchmarks.churn.scaledown`.

Deployments of fractional pods scale up and down at random on GPU nodes, placed by the
placement core the extender uses (ours, with the pods' own task mix). When one
shrinks, the ReplicaSet controller picks the pods to delete; the question is what
`controller.kubernetes.io/pod-deletion-cost` should make it pick:

- `default`: no cost. The controller's own order among running, ready pods: those on
  nodes with more of the ReplicaSet's pods first, then the newest;
- `bind-cost`: what gpupack's bind writes, at no extra API write: the compute booked on
  the pod's GPU once the pod is on it (pods that joined fuller GPUs cost more), then the
  default order;
- `live-cost`: the compute booked on the pod's GPU now, which only a controller
  re-annotating running pods could keep true (an API write per change);
- `consolidation`: no cost, but gpupack's consolidation (`scheduler.consolidation.plan`,
  mode On) after every step, each moved pod placed again at once, each workload moved at
  most once per `WINDOW` steps. Its evictions per step are reported;
- `live-cost+consolidation`: both, as the extender runs them when a policy allows it.

Reported per choice, the mean over seeds of GPU-time held over the lower bound's (the
shares' compute rounded up). Usage: python -m benchmarks.churn.scaledown [--seeds 10]
[--steps 4000]; the last stdout line is one JSON object.
"""

import argparse
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from typing import Final

from benchmarks.churn.replay import relocate
from scheduler.consolidation import Judge, plan
from scheduler.fragmentation import task_mix
from scheduler.ledger import Booking, Gpu, Ledger, Node, Request
from scheduler.placement import Placement, place
from scheduler.score import FragmentationScorer

CHOICES: Final = ("default", "bind-cost", "live-cost", "consolidation", "live-cost+consolidation")
WINDOW: Final = 20  # steps between two moves of one workload
SHARES: Final = (100, 200, 250, 300, 400, 500)
GiB: Final = 2**30


@dataclass(slots=True)
class Replica:
    key: str
    born: int
    node: str
    gpu: str
    bind_cost: int


@dataclass(slots=True)
class Deployment:
    name: str
    share: int
    replicas: list[Replica] = field(default_factory=list)


def victims(choice: str, deployment: Deployment, snapshot: Ledger, count: int) -> list[Replica]:
    on_node: dict[str, int] = {}
    for r in deployment.replicas:
        on_node[r.node] = on_node.get(r.node, 0) + 1

    def default(r: Replica) -> tuple[int, int]:
        return (-on_node[r.node], -r.born)

    def cost(r: Replica) -> tuple[int, int, int]:
        if choice == "bind-cost":
            return (r.bind_cost, *default(r))
        if choice.startswith("live-cost"):
            return (snapshot.gpus[r.gpu].used_compute, *default(r))
        return (0, *default(r))

    return sorted(deployment.replicas, key=cost)[:count]


def run(
    choice: str, seed: int, steps: int, nodes: int = 40, deployments: int = 24
) -> tuple[float, int]:
    """(GPU-time held over the lower bound's, evictions)."""
    rng = random.Random(seed)
    snapshot = Ledger(
        [Node(f"n{i:03d}", cpu=10**6, memory=10**13, max_pods=10**6) for i in range(nodes)]
    )
    for i in range(nodes):
        for g in range(8):
            snapshot.add_gpu(Gpu(f"n{i:03d}-{g}", f"n{i:03d}", memory=80 * GiB, holder=f"c{i}-{g}"))
    fleet = [Deployment(f"d{i}", rng.choice(SHARES)) for i in range(deployments)]
    mix = task_mix(Request(f"x/{d.name}", compute=d.share) for d in fleet)
    scorer = FragmentationScorer(mix)
    made = held_time = bound_time = evictions = 0
    moved: dict[str, int] = {}
    where: dict[str, Replica] = {}

    def judge(booking: Booking, gpu: Gpu) -> str | None:
        owner = booking.request.owner
        return "budget" if step - moved.get(owner, -WINDOW) < WINDOW else None

    for step in range(steps):
        deployment = rng.choice(fleet)
        target = rng.randint(0, 16)
        while len(deployment.replicas) < target:
            made += 1
            request = Request(
                f"x/{deployment.name}-{made}", compute=deployment.share, owner=deployment.name
            )
            result = place(snapshot, request, scorer)
            if not isinstance(result, Placement):
                break
            snapshot.assume(request, result.node, result.gpus)
            uuid = result.gpus[0]
            cost = snapshot.gpus[uuid].used_compute
            replica = Replica(request.key, step, result.node, uuid, cost)
            deployment.replicas.append(replica)
            where[request.key] = replica
        if len(deployment.replicas) > target:
            for replica in victims(choice, deployment, snapshot, len(deployment.replicas) - target):
                snapshot.forget(replica.key)
                deployment.replicas.remove(replica)
                del where[replica.key]
        if choice.endswith("consolidation"):
            evictions += _consolidate(snapshot, scorer, judge, where, moved, step)
        compute = sum(g.used_compute for g in snapshot.gpus.values())
        held_time += sum(1 for g in snapshot.gpus.values() if g.pods)
        bound_time += math.ceil(compute / 1000)
    return (held_time / bound_time if bound_time else 1.0), evictions


def _consolidate(
    snapshot: Ledger,
    scorer: FragmentationScorer,
    judge: Judge,
    where: dict[str, Replica],
    moved: dict[str, int],
    step: int,
) -> int:
    evicted = 0
    for move in plan(snapshot, judge):
        for booking, node, gpus in relocate(
            snapshot, scorer, move, snapshot.forget, snapshot.assume
        ):
            evicted += 1
            moved[booking.request.owner] = step
            replica = where[booking.request.key]
            replica.node, replica.gpu = node, gpus[0]
    return evicted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.churn.scaledown")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=4000)
    args = parser.parse_args(argv)
    out: dict[str, dict[str, float]] = {}
    for choice in CHOICES:
        runs = [run(choice, seed, args.steps) for seed in range(args.seeds)]
        ratios = [r for r, _ in runs]
        out[choice] = {
            "gpu_ratio_mean": round(statistics.mean(ratios), 4),
            "gpu_ratio_sd": round(statistics.pstdev(ratios), 4),
            "evictions_per_step": round(sum(e for _, e in runs) / (args.seeds * args.steps), 4),
        }
        print(
            f"{choice}: GPU-time held / bound {out[choice]['gpu_ratio_mean']:.4f}", file=sys.stderr
        )
    print(json.dumps({"seeds": args.seeds, "steps": args.steps, "choices": out}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
