"""`gpupack-scheduler`: the extender beside the gpupack kube-scheduler.

kube-scheduler (its own instance, profile `gpupack-scheduler`, the configuration the
chart renders) decides where a pod may go and calls this process on loopback to choose
the GPU (`/filter`) and write the assignment (`/bind`). Starts the informers (nodes,
every pod that has not finished, and the GPUPolicy objects), waits for them to sync,
then serves; housekeeping runs while the kube-scheduler beside it holds its Lease. Exit
codes: 0 after SIGTERM/SIGINT, 1 when the caches never synced or the work failed, 2 for
bad arguments, no cluster to talk to, or a port that cannot be opened
(`gpupack.runtime.shell`).
"""

import argparse
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpupack import keys, seal
from gpupack.capacity import DEFAULT_IMAGE, default_mps_image
from gpupack.policy import API_VERSION as POLICY_API
from gpupack.policy import PLURAL as POLICY_PLURAL
from gpupack.policy import effective_policies
from gpupack.runtime import shell
from gpupack.runtime.args import (
    conventions,
    non_negative_int,
    non_negative_seconds,
    positive_seconds,
    version,
)
from scheduler.cache import Cache, Dirty
from scheduler.escapes import Escapes
from scheduler.exclusion import Autoscaler
from scheduler.extender import Extender
from scheduler.leadership import Follower
from scheduler.metrics import Metrics
from scheduler.placement import Scorer
from scheduler.score import FragmentationScorer, PackingScorer
from scheduler.server import make_server
from scheduler.settings import Settings

LIVE_PODS: Final = "status.phase!=Succeeded,status.phase!=Failed"
DEFAULT_PORT: Final = 8888


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupack-scheduler",
        description="The gpupack extender of kube-scheduler: choose the GPU for each pod "
        "kube-scheduler found nodes for, hold it until bind, write the assignment; create "
        "capacity when no GPU has room and release what nothing uses.",
    )
    add = parser.add_argument
    add("--address", default="127.0.0.1", help="address of the verbs (default: loopback)")
    add(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="port of /filter, /bind, /healthz and /readyz (default: %(default)s)",
    )
    add("--scheduler-name", default=keys.SCHEDULER_NAME, help="schedulerName to serve")
    add(
        "--decision-key-file",
        required=True,
        metavar="PATH",
        help="the webhook's decision key (the chart's Secret): only pods whose "
        "gpupack.io/seal verifies with it are placed",
    )
    add(
        "--grace-period",
        type=non_negative_seconds,
        default=15.0,
        metavar="DURATION",
        help="how long a capacity pod may hold a GPU nothing uses and its pool does not "
        "keep as headroom before it is deleted (default: %(default)s)",
    )
    add(
        "--headroom-pods",
        type=non_negative_int,
        default=1,
        metavar="N",
        help="the room each pool keeps for its next pods: N more pods as large as the "
        "largest share it runs, on the GPUs it uses, else on empty GPUs it keeps; 0 keeps "
        "none (default: %(default)s)",
    )
    add(
        "--unused-grace-period",
        type=non_negative_seconds,
        default=30.0,
        metavar="DURATION",
        help="how long a capacity pod created since this extender started may hold a GPU "
        "that no pod ever used and none waits for, before it is deleted: capacity a burst "
        "asked for and did not need (default: %(default)s)",
    )
    add(
        "--orphan-grace",
        type=non_negative_seconds,
        default=30.0,
        metavar="DURATION",
        help="how long a pod may sit on a GPU whose capacity pod is gone before it is "
        "evicted (default: %(default)s)",
    )
    add(
        "--reservation-timeout",
        type=positive_seconds,
        default=60.0,
        metavar="DURATION",
        help="how long a GPU share chosen at filter is held for kube-scheduler's bind "
        "(default: %(default)s)",
    )
    add(
        "--consolidation-interval",
        type=non_negative_seconds,
        default=30.0,
        metavar="DURATION",
        help="seconds between two consolidation rounds, each emptying at most one part-used "
        "GPU per pool whose policies allow it (GPUPolicy spec.consolidation); 0: never "
        "(default: %(default)s)",
    )
    add(
        "--drain-timeout",
        type=positive_seconds,
        default=300.0,
        metavar="DURATION",
        help="how long a GPU consolidation is emptying may keep pods before it takes new "
        "pods again (default: %(default)s)",
    )
    add(
        "--budgets-configmap",
        default="",
        metavar="NAME",
        help="the ConfigMap of the --namespace where consolidation budgets are kept, so a "
        "new leader spends what the last one spent; empty: a new leader moves nothing for "
        "a window (default: none)",
    )
    add(
        "--deletion-cost",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the pod-deletion-cost of ReplicaSet pods equal to their GPU's booked "
        "compute, so a shrinking ReplicaSet deletes pods on the emptiest GPUs first and "
        "GPUs empty (needs the chart's pods patch permission; default: on)",
    )
    add(
        "--autoscaler",
        choices=[a.value for a in Autoscaler],
        default=Autoscaler.AUTO.value,
        help="what buys GPU nodes, which decides how a capacity pod names the existing "
        "nodes it must avoid: karpenter, by the gpupack.io/node label this process writes "
        "once on each GPU node (Karpenter ignores pods that name kubernetes.io/hostname); "
        "cluster-autoscaler or none, by hostname, writing no node; auto, karpenter when "
        "the API server serves karpenter.sh/v1 (default: %(default)s; see "
        "docs/scheduler.md)",
    )
    add("--capacity-image", default=DEFAULT_IMAGE, help="image of capacity pods")
    add(
        "--mps-image",
        default=default_mps_image(version()),
        help="image of the capacity pods of real-time-mps GPUs, which run the GPU's MPS "
        "daemon: gpupack's own",
    )
    add(
        "--scorer",
        choices=("fragmentation", "packing"),
        default="fragmentation",
        help="how GPUs are ranked: best fit in compute, or fragmentation-aware with the "
        "cluster's own pod mix (default: %(default)s; see docs/scheduler.md)",
    )
    add("--workers", type=int, default=8, help="threads for capacity writes (default: %(default)s)")
    add(
        "--excluded-namespaces",
        type=_names,
        default=frozenset(),
        metavar="NS,NS",
        help="namespaces the webhook never rewrites, besides kube-system and --namespace (the "
        "chart passes excludedNamespaces): their pods never count as escaped",
    )
    election = parser.add_argument_group(
        "leadership (kube-scheduler's: housekeeping runs while it leads)"
    )
    election.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="follow kube-scheduler's Lease; off: this replica always does housekeeping",
    )
    election.add_argument(
        "--leader-elect-resource-name",
        "--lease-name",
        dest="lease_name",
        default=keys.SCHEDULER_NAME,
        help="kube-scheduler's Lease (default: %(default)s)",
    )
    election.add_argument(
        "--identity",
        default=socket.gethostname(),
        help="the hostname of the kube-scheduler beside this process, which prefixes its "
        "name in the Lease (default: this hostname, the pod's name in a pod)",
    )
    election.add_argument(
        "--leader-elect-retry-period",
        "--retry-period",
        dest="retry_period",
        type=positive_seconds,
        default=2.0,
        metavar="DURATION",
        help="how often the Lease is read (default: 2s)",
    )
    shell.add_arguments(parser, metrics_port=9090)
    return conventions(parser)


def _names(text: str) -> frozenset[str]:
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def make_scorer(name: str) -> Scorer:
    return FragmentationScorer() if name == "fragmentation" else PackingScorer()


def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
    if not 0 < args.port < 65536:
        raise ValueError(f"--port: {args.port} is not a port number (1-65535)")
    with open(args.decision_key_file, "rb") as file:
        key = seal.load_key(file.read(), f"--decision-key-file {args.decision_key_file}")
    kube = process.connect(args.kubeconfig, "gpupack-scheduler")
    dirty = Dirty()

    def pod_changed(key: str) -> None:  # informers start after `start` returns
        dirty.pod(key)
        escapes.pod(key)

    def namespace_changed(key: str) -> None:
        escapes.namespace(key)

    nodes = process.informer(kube, "/api/v1/nodes", name="nodes", on_change=dirty.node)
    pods = process.informer(
        kube, "/api/v1/pods", {"fieldSelector": LIVE_PODS}, name="pods", on_change=pod_changed
    )
    # Only the namespaces that carry the opt-in label: whether their pods escaped.
    namespaces = process.informer(
        kube,
        "/api/v1/namespaces",
        {"labelSelector": keys.OPTIMIZE},
        name="namespaces",
        on_change=namespace_changed,
    )
    # Which policies allow consolidation, as the operator's GPUPolicy objects say now.
    gpupolicies = process.informer(
        kube, f"/apis/{POLICY_API}/namespaces/{args.namespace}/{POLICY_PLURAL}", name="policies"
    )
    # Where the cluster serves DRA, the GPUs of nodes that advertise no `nvidia.com/gpu`
    # are devices in ResourceSlices (NVIDIA's DRA driver): read, never written.
    slices = process.informer(
        kube,
        f"/apis/{keys.DRA_API}/resourceslices",
        name="resourceslices",
        on_change=dirty.slice,
        optional=True,
    )
    escapes = Escapes(pods, namespaces, {"kube-system", args.namespace} | args.excluded_namespaces)
    cache = Cache(nodes, pods, dirty, args.scheduler_name, args.namespace, key, slices)
    settings = Settings(
        identity=args.identity,
        scheduler_name=args.scheduler_name,
        namespace=args.namespace,
        grace_period=args.grace_period,
        headroom_pods=args.headroom_pods,
        unused_grace=args.unused_grace_period,
        orphan_grace=args.orphan_grace,
        capacity_image=args.capacity_image,
        mps_image=args.mps_image,
        workers=max(1, args.workers),
        reservation_timeout=args.reservation_timeout,
        consolidation_interval=args.consolidation_interval,
        drain_timeout=args.drain_timeout,
        budgets_configmap=args.budgets_configmap,
        deletion_cost=args.deletion_cost,
        autoscaler=args.autoscaler,
    )
    registry = CollectorRegistry()
    holder: list[Extender] = []
    # Times other replicas read, or compared with the API server's (a pod's age): its clock.
    wall = kube.server_clock.now
    metrics = Metrics(registry, lambda: holder[0].usage, wall)
    extender = Extender(
        kube,
        cache,
        make_scorer(args.scorer),
        settings,
        metrics,
        escapes=escapes,
        policies=lambda: effective_policies(gpupolicies.items()),
        wall=wall,
    )
    holder.append(extender)
    synced = threading.Event()
    with shell.listening("the extender", args.port):
        server = make_server(args.address, args.port, extender, synced.is_set)
    process.defer(server.close)
    process.serve_endpoints(
        args.metrics_address,
        args.metrics_port,
        lambda: (generate_latest(registry), CONTENT_TYPE_LATEST),
    )
    follower = (
        Follower(kube, args.namespace, args.lease_name, args.identity)
        if args.leader_elect
        else None
    )

    def work(stop: threading.Event) -> None:
        """Caches synced: serve the verbs, follow the Lease, keep house."""
        extender.tick()  # fold the synced caches in before the first verb
        synced.set()
        server.start()
        if follower is None:
            extender.leading = True
        else:
            threading.Thread(
                target=follower.run,
                args=(lambda leads: setattr(extender, "leading", leads), stop, args.retry_period),
                name="lease",
                daemon=True,
            ).start()
        try:
            extender.run(stop)
        finally:
            server.close()

    return shell.Service(work=work)


def main(argv: Sequence[str] | None = None) -> int:
    return shell.run(build_parser(), argv, start)


if __name__ == "__main__":
    sys.exit(main())
