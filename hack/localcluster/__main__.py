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
        "--writer-kubeconfig", type=Path, help="write the GPU UUIDs as this user (the exporter)"
    )
    args = parser.parse_args(argv)
    writer = Kube.from_kubeconfig(args.writer_kubeconfig) if args.writer_kubeconfig else None
    assigner = SimulatedGpuAssigner(Kube.from_kubeconfig(args.kubeconfig), writer=writer)
    signal.signal(signal.SIGTERM, lambda *_: assigner.stop())
    with assigner:
        while not assigner.stopped(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
