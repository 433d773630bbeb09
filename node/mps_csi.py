"""`gpupack-mps-csi`: the node agent's CSI driver `mps.gpupack.io`, one per GPU node.

It registers with the kubelet (a socket in the kubelet's plugin registry) and serves the
CSI Identity and Node services that connect `real-time-mps` pods to their GPU's MPS
daemon (`node.mps_volumes`). It runs in the exporter's DaemonSet, in a privileged
container of its own: mounting into pods' volumes needs CAP_SYS_ADMIN on the node,
which the NVML exporter beside it does not get.

Exit codes: 0 after SIGTERM/SIGINT, 2 for bad arguments, no cluster to talk to, or a
socket it cannot serve.
"""

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final
from urllib.parse import quote

import grpc

from gpupack import mps
from gpupack.objects import JSON
from gpupack.runtime import shell
from gpupack.runtime.api import ApiError
from gpupack.runtime.args import conventions, version
from gpupack.runtime.transport import Transport
from node import csi
from node.csi import PodGetter
from node.mps_volumes import DEFAULT_SHM_SIZE, MpsVolumes, shm_bytes

log = logging.getLogger("node.mps_csi")

METRICS_PORT: Final = 9401


def shm_size(text: str) -> str:
    try:
        shm_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupack-mps-csi",
        description=f"Serve the CSI driver {mps.DRIVER}, which gives each real-time-mps pod "
        "the pipes and shared memory of its GPU's MPS daemon.",
    )
    csi.add_driver_arguments(parser, mps.DRIVER)
    add = parser.add_argument
    add(
        "--root",
        type=Path,
        default=Path(mps.HOST_ROOT),
        help="the node's directory for the GPUs' MPS directories (default: %(default)s)",
    )
    add(
        "--shm-size",
        type=shm_size,
        default=DEFAULT_SHM_SIZE,
        help="size of each GPU's MPS shared memory, a tmpfs: its clients' /dev/shm "
        "(default: %(default)s)",
    )
    shell.add_arguments(parser, metrics_port=METRICS_PORT)
    return conventions(parser)


def pod_getter(kube: Transport) -> PodGetter:
    """Pods read from the API server at each publish: the assignment must be current."""

    def get(namespace: str, name: str) -> JSON | None:
        try:
            return kube.get(f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}")
        except ApiError as error:
            if error.status == 404:
                return None
            raise csi.Refused(
                grpc.StatusCode.UNAVAILABLE, f"cannot read pod {namespace}/{name}: {error}"
            ) from None

    return get


def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
    if not args.node_name:
        raise ValueError("--node-name (or $NODE_NAME) is required")
    kube = process.connect(args.kubeconfig, "gpupack-mps-csi")
    volumes = MpsVolumes(
        args.root,
        node=args.node_name,
        namespace=args.namespace,
        get_pod=pod_getter(kube),
        shm_size=args.shm_size,
    )
    csi.run_driver(
        process,
        mps.DRIVER,
        args.node_name,
        volumes,
        metric=(
            "gpupack_mps_csi_publishes",
            "MPS volumes the kubelet asked for, by result: published; refused (not a pod "
            "of an MPS GPU: its FailedMount event says why); waiting (its GPU's daemon has "
            "not started yet); failed (a mount failed)",
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
