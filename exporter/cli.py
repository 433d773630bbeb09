"""`gpupack-exporter`: the node agent, one per GPU node (a DaemonSet with hostPID).

Samples NVML about once a second, attributes each GPU process to its pod through its
cgroup, serves per-pod and per-GPU metrics on `/metrics`, and writes on each capacity
pod of its node the GPU kubelet gave it. Exit codes: 0 after SIGTERM/SIGINT, 2 for bad
arguments or no cluster to talk to. Everything else (no GPU driver, no kubelet socket,
API server away) is a state the exporter reports and recovers from, not an exit.
"""

import argparse
import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry

from exporter import server
from exporter.agent import Agent, node_pods
from exporter.cgroup import ProcessTable
from exporter.claims import ClaimReader
from exporter.collector import ExporterCollector
from exporter.health import Health
from exporter.nvml import PynvmlReader
from exporter.podresources import PodResourcesClient, PodResourcesError
from exporter.pods import PodMap
from exporter.sampler import Sampler
from exporter.shims import RosterClient
from gpupack.runtime import shell
from gpupack.runtime.args import conventions, positive_seconds
from gpupack.runtime.endpoints import ANY

log = logging.getLogger("exporter.cli")

DEFAULT_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupack-exporter",
        description="Report per-pod GPU compute and memory from NVML, and write on each "
        "capacity pod of this node the GPU kubelet gave it.",
    )
    add = parser.add_argument
    add(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name (default: $NODE_NAME, set from the downward API)",
    )
    add("--address", default=ANY, help="listen address (default: %(default)s, IPv4 and IPv6)")
    add(
        "--port",
        type=int,
        default=9400,
        help="port of /metrics and /healthz (default: %(default)s)",
    )
    add(
        "--interval",
        type=positive_seconds,
        default=1.0,
        metavar="DURATION",
        help="NVML sampling interval (default: %(default)s)",
    )
    add(
        "--min-window",
        type=positive_seconds,
        default=5.0,
        metavar="DURATION",
        help="per-process compute is averaged since the previous scrape, over at least this "
        "long (default: %(default)s)",
    )
    add(
        "--max-window",
        type=positive_seconds,
        default=60.0,
        metavar="DURATION",
        help="and at most this long (default: %(default)s)",
    )
    add(
        "--discovery-interval",
        type=positive_seconds,
        default=10.0,
        metavar="DURATION",
        help="how often kubelet is asked which GPU each capacity pod holds (default: "
        "%(default)s; sooner when a capacity pod changes)",
    )
    add(
        "--pod-resources-socket",
        type=Path,
        default=Path(DEFAULT_SOCKET),
        help="kubelet's pod-resources socket (default: %(default)s)",
    )
    add(
        "--proc",
        type=Path,
        default=Path("/proc"),
        help="the host's /proc (the exporter runs with hostPID; default: %(default)s)",
    )
    add(
        "--shim-roster",
        type=Path,
        metavar="SOCKET",
        help="the node agent's roster of memory-shim processes (gpupack-cuda-csi "
        "--roster-socket): each pod GPU process is then reported with the shim loaded or "
        "missing (default: none, reported unknown)",
    )
    shell.add_arguments(parser)
    return conventions(parser)


def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
    if args.min_window > args.max_window:
        raise ValueError("--min-window must not exceed --max-window")
    if not args.node_name:
        raise ValueError("no node name: pass --node-name or set NODE_NAME")
    kube = process.connect(args.kubeconfig, "gpupack-exporter")
    health = Health()
    sampler = Sampler(
        PynvmlReader(),
        health,
        interval=args.interval,
        min_window=args.min_window,
        max_window=args.max_window,
    )
    holder: list[Agent] = []
    prefix = f"{args.namespace}/"

    def changed(key: str) -> None:
        if holder and (not key or key.startswith(prefix)):
            holder[0].wake()

    # Not waited for: without the API server the exporter still serves NVML readings,
    # and reports gpupack_exporter_api_up 0 until the cache is current.
    informer = process.add(node_pods(kube, args.node_name, on_change=changed), wait=False)
    pods = PodMap(informer, args.namespace)
    processes = ProcessTable(args.proc)
    lister = PodResourcesClient(args.pod_resources_socket)
    process.defer(lister.close)
    agent = Agent(
        kube,
        pods,
        sampler,
        processes,
        lister,
        health,
        lister_errors=(PodResourcesError,),
        claims=ClaimReader(kube, args.node_name),  # GPUs DRA gave (read when a pod names one)
        roster=RosterClient(args.shim_roster) if args.shim_roster else None,
    )
    holder.append(agent)
    registry = CollectorRegistry()
    registry.register(ExporterCollector(agent.scrape))

    def healthy() -> tuple[bool, dict[str, object]]:
        snapshot = health.snapshot()
        return sampler.alive, {"up": dict(snapshot.up), "problems": dict(snapshot.messages)}

    with shell.listening("/metrics and /healthz", args.port):
        http = server.make_server(args.address, args.port, registry, healthy)
    sampler.start()
    process.defer(sampler.stop)
    discovery = threading.Thread(
        target=agent.run_discovery, args=(args.discovery_interval,), name="discovery", daemon=True
    )
    discovery.start()
    process.defer(lambda: discovery.join(timeout=5))
    http.start()
    process.defer(http.close)
    process.defer(agent.stop)
    log.info("exporter started", extra={"node": args.node_name, "port": args.port})
    return shell.Service()


def main(argv: Sequence[str] | None = None) -> int:
    return shell.run(build_parser(), argv, start)


if __name__ == "__main__":
    sys.exit(main())
