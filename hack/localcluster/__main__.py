"""`python -m hack.localcluster assign-gpus --kubeconfig K`: the simulated node agent."""

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from hack.localcluster.client import Kube
from hack.localcluster.gpus import SimulatedGpuAssigner


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m hack.localcluster assign-gpus --kubeconfig K`: run the simulated node
    agent until stopped (the demo leaves it running beside its detached cluster)."""

    parser = argparse.ArgumentParser(prog="python -m hack.localcluster")
    commands = parser.add_subparsers(dest="command", required=True)
    assign = commands.add_parser("assign-gpus", help="play the node agent for kwok nodes")
    assign.add_argument("--kubeconfig", required=True, type=Path)
    assign.add_argument(
        "--node-agent",
        metavar="NAMESPACE/ACCOUNT",
        help="write the GPU UUIDs as this ServiceAccount (the exporter's), with a token "
        "bound to each pod's node as its DaemonSet pod would hold it",
    )
    args = parser.parse_args(argv)
    kube = Kube.from_kubeconfig(args.kubeconfig)
    agent = None
    if args.node_agent:
        namespace, _, account = args.node_agent.partition("/")

        def agent(node: str) -> Kube:
            return kube.with_token(kube.node_bound_token(namespace, account, node))

    assigner = SimulatedGpuAssigner(kube, agent=agent)
    signal.signal(signal.SIGTERM, lambda *_: assigner.stop())
    with assigner:
        while not assigner.stopped(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
