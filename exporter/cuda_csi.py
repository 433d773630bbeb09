"""`gpupack-cuda-csi`: the node agent's CSI driver `cuda.gpupack.io`, one per GPU node.

It registers with the kubelet (a socket in the kubelet's plugin registry) and serves the
CSI Identity and Node services that give each memory-enforced pod the memory shim, its
limit and its budget (`exporter.cuda_volumes`). It runs in the exporter's DaemonSet, in
a container of its own, as root (it writes under the kubelet's pod directories) but
unprivileged: it mounts nothing.

Exit codes: 0 after SIGTERM/SIGINT, 2 for bad arguments, no cluster to talk to, a
socket it cannot serve, or no library to hand out.
"""

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from exporter import csi
from exporter.cuda_volumes import CudaVolumes
from exporter.mps_csi import PLUGINS, REGISTRY, pod_getter
from gpupack import cuda
from gpupack.runtime import shell
from gpupack.runtime.args import conventions, version

log = logging.getLogger("exporter.cuda_csi")

METRICS_PORT: Final = 9402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupack-cuda-csi",
        description=f"Serve the CSI driver {cuda.DRIVER}, which gives each memory-enforced "
        "pod the memory shim (libgpupack-cuda.so), its limit and its budget.",
    )
    add = parser.add_argument
    add(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name (default: $NODE_NAME, set from the downward API)",
    )
    add(
        "--library",
        type=Path,
        default=Path(cuda.IMAGE_LIBRARY),
        help="the memory shim handed to pods (default: %(default)s, built into the image)",
    )
    add(
        "--csi-socket",
        type=Path,
        default=PLUGINS / cuda.DRIVER / "csi.sock",
        help="where the CSI services listen (default: %(default)s)",
    )
    add(
        "--registration-dir",
        type=Path,
        default=REGISTRY,
        help="the kubelet's plugin registry directory (default: %(default)s)",
    )
    add(
        "--kubelet-csi-socket",
        type=Path,
        help="the CSI socket's path as the kubelet sees it (default: --csi-socket)",
    )
    shell.add_arguments(parser, metrics_port=METRICS_PORT)
    return conventions(parser)


class Counted:
    """The node side, with `gpupack_cuda_csi_publishes_total{result}` counted."""

    def __init__(self, volumes: CudaVolumes, registry: CollectorRegistry) -> None:
        self._volumes = volumes
        self._publishes = Counter(
            "gpupack_cuda_csi_publishes",
            "Memory-shim volumes the kubelet asked for, by result: published; refused (not "
            "a memory-enforced pod of this node: its FailedMount event says why); waiting "
            "(the API server could not be asked); failed (a file could not be written)",
            ["result"],
            registry=registry,
        )

    def publish(self, request: csi.PublishRequest) -> None:
        try:
            self._volumes.publish(request)
        except csi.Refused as error:
            waiting = error.code is grpc.StatusCode.UNAVAILABLE
            self._publishes.labels(result="waiting" if waiting else "refused").inc()
            raise
        except OSError:
            self._publishes.labels(result="failed").inc()
            raise
        self._publishes.labels(result="published").inc()

    def unpublish(self, request: csi.UnpublishRequest) -> None:
        self._volumes.unpublish(request)


def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
    if not args.node_name:
        raise ValueError("--node-name (or $NODE_NAME) is required")
    if not args.library.is_file():
        raise ValueError(f"--library {args.library}: no such file: the memory shim to hand out")
    kube = process.connect(args.kubeconfig, "gpupack-cuda-csi")
    volumes = CudaVolumes(args.library, node=args.node_name, get_pod=pod_getter(kube))
    registry = CollectorRegistry()
    node = Counted(volumes, registry)
    process.serve_endpoints(
        args.metrics_address,
        args.metrics_port,
        lambda: (generate_latest(registry), CONTENT_TYPE_LATEST),
    )
    server = csi.serve(
        args.csi_socket, csi.csi_handlers(cuda.DRIVER, version(), args.node_name, node)
    )
    process.defer(lambda: server.stop(5).wait())
    endpoint = args.kubelet_csi_socket or args.csi_socket
    registration = csi.serve(
        args.registration_dir / f"{cuda.DRIVER}-reg.sock",
        csi.registration_handlers(cuda.DRIVER, str(endpoint)),
        workers=1,
    )
    process.defer(lambda: registration.stop(5).wait())
    log.info(
        "CSI driver %s serving",
        cuda.DRIVER,
        extra={
            "socket": str(args.csi_socket),
            "node": args.node_name,
            "library": str(args.library),
        },
    )
    return shell.Service()


def main(argv: Sequence[str] | None = None) -> int:
    return shell.run(build_parser(), argv, start)


if __name__ == "__main__":
    sys.exit(main())
