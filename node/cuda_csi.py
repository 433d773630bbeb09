"""`gpupack-cuda-csi`: the node agent's CSI driver `cuda.gpupack.io`, one per GPU node.

It registers with the kubelet (a socket in the kubelet's plugin registry) and serves the
CSI Identity and Node services that give each memory-enforced pod the memory shim, its
limit and its budget (`node.cuda_volumes`), and, with `--roster-socket`, the roster of
the processes each budget records, for the exporter beside it (`node.shim_roster`). It
runs in the exporter's DaemonSet, in a container of its own, as root (it writes under the
kubelet's pod directories) but unprivileged: it mounts nothing.

Exit codes: 0 after SIGTERM/SIGINT, 2 for bad arguments, no cluster to talk to, a
socket it cannot serve, or no library to hand out.
"""

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from gpupack import cuda
from gpupack.runtime import shell
from gpupack.runtime.args import conventions, version
from node import csi, shim_roster
from node.cuda_volumes import CudaVolumes
from node.mps_csi import pod_getter

log = logging.getLogger("node.cuda_csi")

METRICS_PORT: Final = 9402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupack-cuda-csi",
        description=f"Serve the CSI driver {cuda.DRIVER}, which gives each memory-enforced "
        "pod the memory shim (libgpupack-cuda.so), its limit and its budget.",
    )
    csi.add_driver_arguments(parser, cuda.DRIVER)
    parser.add_argument(
        "--library",
        type=Path,
        default=Path(cuda.IMAGE_LIBRARY),
        help="the memory shim handed to pods (default: %(default)s, built into the image)",
    )
    parser.add_argument(
        "--roster-socket",
        type=Path,
        help="serve the roster of each pod's shim processes on this Unix socket, for the "
        "exporter (default: not served)",
    )
    parser.add_argument(
        "--pods-dir",
        type=Path,
        default=Path("/var/lib/kubelet/pods"),
        help="the kubelet's pod directories, where the pods' budgets and their GPUs' "
        "gpu-time files are (default: %(default)s)",
    )
    shell.add_arguments(parser, metrics_port=METRICS_PORT)
    return conventions(parser)


def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
    if not args.node_name:
        raise ValueError("--node-name (or $NODE_NAME) is required")
    if not args.library.is_file():
        raise ValueError(f"--library {args.library}: no such file: the memory shim to hand out")
    kube = process.connect(args.kubeconfig, "gpupack-cuda-csi")
    if args.roster_socket:
        roster = shim_roster.serve(args.roster_socket, args.pods_dir)
        process.defer(roster.server_close)
        process.defer(roster.shutdown)
    volumes = CudaVolumes(
        args.library, node=args.node_name, get_pod=pod_getter(kube), pods_dir=args.pods_dir
    )
    csi.run_driver(
        process,
        cuda.DRIVER,
        args.node_name,
        volumes,
        metric=(
            "gpupack_cuda_csi_publishes",
            "Memory-shim volumes the kubelet asked for, by result: published; refused (not "
            "a memory-enforced pod of this node: its FailedMount event says why); waiting "
            "(the API server could not be asked); failed (a file could not be written)",
        ),
        csi_socket=args.csi_socket,
        kubelet_socket=args.kubelet_csi_socket,
        registration_dir=args.registration_dir,
        metrics=(args.metrics_address, args.metrics_port),
        version=version(),
    )
    return shell.Service()


def main(argv: Sequence[str] | None = None) -> int:
    return shell.run(build_parser(), argv, start)


if __name__ == "__main__":
    sys.exit(main())
