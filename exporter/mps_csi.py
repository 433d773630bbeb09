"""`gpupack-mps-csi`: the node agent's CSI driver `mps.gpupack.io`, one per GPU node.

It registers with the kubelet (a socket in the kubelet's plugin registry) and serves the
CSI Identity and Node services that connect `real-time-mps` pods to their GPU's MPS
daemon (`exporter.mps_volumes`). It runs in the exporter's DaemonSet, in a privileged
container of its own: mounting into pods' volumes needs CAP_SYS_ADMIN on the node,
which the NVML exporter beside it does not get.

Exit codes: 0 after SIGTERM/SIGINT, 2 for bad arguments, no cluster to talk to, or a
socket it cannot serve.
"""

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final
from urllib.parse import quote

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from exporter import csi
from exporter.mps_volumes import DEFAULT_SHM_SIZE, MpsVolumes, PodGetter, shm_bytes
from gpupack import mps
from gpupack.kube import JSON
from gpupack.runtime import shell
from gpupack.runtime.api import ApiError
from gpupack.runtime.args import conventions, version
from gpupack.runtime.transport import Transport

log = logging.getLogger("exporter.mps_csi")

METRICS_PORT: Final = 9401
PLUGINS: Final = Path("/var/lib/kubelet/plugins")
REGISTRY: Final = Path("/var/lib/kubelet/plugins_registry")


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
    add = parser.add_argument
    add(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name (default: $NODE_NAME, set from the downward API)",
    )
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
    add(
        "--csi-socket",
        type=Path,
        default=PLUGINS / mps.DRIVER / "csi.sock",
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


class Counted:
    """The node side, with `gpupack_mps_csi_publishes_total{result}` counted."""

    def __init__(self, volumes: MpsVolumes, registry: CollectorRegistry) -> None:
        self._volumes = volumes
        self._publishes = Counter(
            "gpupack_mps_csi_publishes",
            "MPS volumes the kubelet asked for, by result: published; refused (not a pod "
            "of an MPS GPU: its FailedMount event says why); waiting (its GPU's daemon has "
            "not started yet); failed (a mount failed)",
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
    kube = process.connect(args.kubeconfig, "gpupack-mps-csi")
    volumes = MpsVolumes(
        args.root,
        node=args.node_name,
        namespace=args.namespace,
        get_pod=pod_getter(kube),
        shm_size=args.shm_size,
    )
    registry = CollectorRegistry()
    node = Counted(volumes, registry)
    process.serve_endpoints(
        args.metrics_address,
        args.metrics_port,
        lambda: (generate_latest(registry), CONTENT_TYPE_LATEST),
    )
    handlers = csi.csi_handlers(mps.DRIVER, version(), args.node_name, node)
    server = csi.serve(args.csi_socket, handlers)
    process.defer(lambda: server.stop(5).wait())
    endpoint = args.kubelet_csi_socket or args.csi_socket
    registration = csi.serve(
        args.registration_dir / f"{mps.DRIVER}-reg.sock",
        csi.registration_handlers(mps.DRIVER, str(endpoint)),
        workers=1,
    )
    process.defer(lambda: registration.stop(5).wait())
    log.info(
        "CSI driver %s serving",
        mps.DRIVER,
        extra={"socket": str(args.csi_socket), "node": args.node_name},
    )
    return shell.Service()


def main(argv: Sequence[str] | None = None) -> int:
    return shell.run(build_parser(), argv, start)


if __name__ == "__main__":
    sys.exit(main())
