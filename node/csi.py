"""The CSI node plugin's wire side: its messages, its gRPC services, its registration.

The kubelet finds a node plugin through plugin registration (it watches
/var/lib/kubelet/plugins_registry/ for sockets serving `pluginregistration.Registration`
and asks each `GetInfo`), then calls the CSI `Identity` and `Node` services on the
endpoint the plugin named. An inline ephemeral volume needs only a few calls:
`GetPluginInfo`, `NodeGetCapabilities` (none: no staging), `NodeGetInfo`, then
`NodePublishVolume` when a pod starts and `NodeUnpublishVolume` when it is gone.

This module owns the messages of those calls (hand-encoded, `gpupack.runtime.protowire`) and
the gRPC servers (generic handlers over raw bytes). What a publish does is the
`Node` protocol's business (`node.mps_volumes`); a refusal travels as a gRPC status
whose details the kubelet shows in the pod's FailedMount event.

Field numbers, from csi.proto (container-storage-interface/spec v1.11.0) and
api.proto (k8s.io/kubelet pkg/apis/pluginregistration/v1):

    GetPluginInfoResponse { string name = 1; string vendor_version = 2; }
    ProbeResponse { google.protobuf.BoolValue ready = 1; }   BoolValue { bool value = 1; }
    NodeGetInfoResponse { string node_id = 1; }
    NodePublishVolumeRequest { string volume_id = 1; string target_path = 4;
                               bool readonly = 6; map<string, string> volume_context = 8; }
    NodeUnpublishVolumeRequest { string volume_id = 1; string target_path = 2; }
    PluginInfo { string type = 1; string name = 2; string endpoint = 3;
                 repeated string supported_versions = 4; }
    RegistrationStatus { bool plugin_registered = 1; string error = 2; }
"""

import argparse
import logging
import os
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from gpupack.objects import JSON
from gpupack.runtime import protowire as wire
from gpupack.runtime import shell

log = logging.getLogger(__name__)

PLUGINS: Final = Path("/var/lib/kubelet/plugins")
REGISTRY: Final = Path("/var/lib/kubelet/plugins_registry")
SPEC_VERSION: Final = "1.0.0"  # what the kubelet's CSI client speaks (and asks for)
PLUGIN_TYPE: Final = "CSIPlugin"


@dataclass(frozen=True, slots=True)
class PublishRequest:
    volume_id: str
    target_path: str
    readonly: bool = False
    volume_context: Mapping[str, str] = field(default_factory=dict)

    # The pod, as the kubelet says it (the CSIDriver's podInfoOnMount).
    @property
    def pod(self) -> tuple[str, str, str]:
        """(namespace, name, uid) of the pod the volume is for."""
        context = self.volume_context
        return (
            context.get("csi.storage.k8s.io/pod.namespace", ""),
            context.get("csi.storage.k8s.io/pod.name", ""),
            context.get("csi.storage.k8s.io/pod.uid", ""),
        )


@dataclass(frozen=True, slots=True)
class UnpublishRequest:
    volume_id: str
    target_path: str


@dataclass(frozen=True, slots=True)
class RegistrationStatus:
    registered: bool
    error: str = ""


def decode_publish(data: bytes) -> PublishRequest:
    volume_id = target = ""
    readonly = False
    context: dict[str, str] = {}
    for number, kind, value in wire.fields(data, "NodePublishVolumeRequest"):
        if number == 1:
            volume_id = wire.text(kind, value, "NodePublishVolumeRequest.volume_id")
        elif number == 4:
            target = wire.text(kind, value, "NodePublishVolumeRequest.target_path")
        elif number == 6:
            readonly = wire.flag(kind, value, "NodePublishVolumeRequest.readonly")
        elif number == 8:
            key, item = wire.map_entry(kind, value, "NodePublishVolumeRequest.volume_context")
            context[key] = item
    return PublishRequest(volume_id, target, readonly, context)


def decode_unpublish(data: bytes) -> UnpublishRequest:
    volume_id = target = ""
    for number, kind, value in wire.fields(data, "NodeUnpublishVolumeRequest"):
        if number == 1:
            volume_id = wire.text(kind, value, "NodeUnpublishVolumeRequest.volume_id")
        elif number == 2:
            target = wire.text(kind, value, "NodeUnpublishVolumeRequest.target_path")
    return UnpublishRequest(volume_id, target)


def decode_registration_status(data: bytes) -> RegistrationStatus:
    registered, error = False, ""
    for number, kind, value in wire.fields(data, "RegistrationStatus"):
        if number == 1:
            registered = wire.flag(kind, value, "RegistrationStatus.plugin_registered")
        elif number == 2:
            error = wire.text(kind, value, "RegistrationStatus.error")
    return RegistrationStatus(registered, error)


def encode_plugin_info(name: str, version: str) -> bytes:
    """GetPluginInfoResponse."""
    return wire.str_field(1, name) + wire.str_field(2, version)


def encode_probe(ready: bool) -> bytes:
    """ProbeResponse: `ready` as a BoolValue (an empty one is false)."""
    return wire.len_field(1, wire.bool_field(1, ready))


def encode_node_info(node_id: str) -> bytes:
    """NodeGetInfoResponse."""
    return wire.str_field(1, node_id)


def encode_registration_info(name: str, endpoint: str) -> bytes:
    """PluginInfo, the answer to the kubelet's GetInfo."""
    return (
        wire.str_field(1, PLUGIN_TYPE)
        + wire.str_field(2, name)
        + wire.str_field(3, endpoint)
        + wire.len_field(4, SPEC_VERSION.encode())
    )


class Refused(Exception):
    """A publish the driver will not do; `code` is the gRPC status the kubelet gets
    (FAILED_PRECONDITION: never for this pod; UNAVAILABLE: not yet, try again)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


PodGetter = Callable[[str, str], JSON | None]  # (namespace, name) -> the pod, or None


def check_volume_id(volume_id: str) -> None:
    """The kubelet's ids (csi-<hex>) name record files: nothing that walks a path."""
    if not volume_id or "/" in volume_id or volume_id.startswith(".") or "\0" in volume_id:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"unusable volume id {volume_id!r}")


def requested_pod(request: PublishRequest, get_pod: PodGetter, driver: str) -> JSON:
    """The pod a publish is for, as the API server has it: the kubelet names it (the
    CSIDriver's podInfoOnMount); refused when it does not, or the pod is gone."""
    check_volume_id(request.volume_id)
    namespace, name, uid = request.pod
    if not (namespace and name and uid):
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"no pod named in the volume context: is the CSIDriver {driver} "
            "installed with podInfoOnMount: true?",
        )
    pod = get_pod(namespace, name)
    if pod is None:
        raise Refused(grpc.StatusCode.NOT_FOUND, f"pod {namespace}/{name} not found")
    return pod


class NodeService(Protocol):
    """What the driver does on the node: `node.mps_volumes.MpsVolumes`."""

    def publish(self, request: PublishRequest) -> None: ...

    def unpublish(self, request: UnpublishRequest) -> None: ...


def _raw(data: bytes) -> bytes:
    return data


Handler = Callable[[bytes, grpc.ServicerContext], bytes]


def _unary(handler: Handler) -> grpc.RpcMethodHandler:
    def call(data: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            return handler(data, context)
        except wire.ProtobufError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except Refused as error:
            context.abort(error.code, str(error))
        raise AssertionError("unreachable")  # abort raises

    return grpc.unary_unary_rpc_method_handler(
        call, request_deserializer=_raw, response_serializer=_raw
    )


def csi_handlers(name: str, version: str, node_id: str, node: NodeService) -> list[object]:
    """The Identity and Node services of a node-only driver without staging."""

    def publish(data: bytes, context: grpc.ServicerContext) -> bytes:
        request = decode_publish(data)
        if not request.volume_id or not request.target_path:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "volume_id and target_path needed")
        node.publish(request)
        return b""

    def unpublish(data: bytes, context: grpc.ServicerContext) -> bytes:
        request = decode_unpublish(data)
        if not request.volume_id or not request.target_path:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "volume_id and target_path needed")
        node.unpublish(request)
        return b""

    def constant(answer: bytes) -> Handler:
        def handler(data: bytes, context: grpc.ServicerContext) -> bytes:
            wire.skip(data, "request")
            return answer

        return handler

    identity = {
        "GetPluginInfo": _unary(constant(encode_plugin_info(name, version))),
        "GetPluginCapabilities": _unary(constant(b"")),  # no controller service
        "Probe": _unary(constant(encode_probe(True))),
    }
    node_methods = {
        "NodeGetCapabilities": _unary(constant(b"")),  # no staging, no stats
        "NodeGetInfo": _unary(constant(encode_node_info(node_id))),
        "NodePublishVolume": _unary(publish),
        "NodeUnpublishVolume": _unary(unpublish),
    }
    return [
        grpc.method_handlers_generic_handler("csi.v1.Identity", identity),
        grpc.method_handlers_generic_handler("csi.v1.Node", node_methods),
    ]


def registration_handlers(name: str, endpoint: str) -> list[object]:
    """The kubelet's plugin registration: who we are, and being told how it went."""

    def get_info(data: bytes, context: grpc.ServicerContext) -> bytes:
        wire.skip(data, "request")
        return encode_registration_info(name, endpoint)

    def notify(data: bytes, context: grpc.ServicerContext) -> bytes:
        status = decode_registration_status(data)
        if status.registered:
            log.info("the kubelet registered CSI driver %s", name)
        else:
            log.error("the kubelet refused CSI driver %s: %s", name, status.error or "-")
        return b""

    methods = {"GetInfo": _unary(get_info), "NotifyRegistrationStatus": _unary(notify)}
    return [grpc.method_handlers_generic_handler("pluginregistration.Registration", methods)]


def serve(socket: Path, handlers: list[object], workers: int = 4) -> grpc.Server:
    """A started gRPC server on unix socket `socket` (a stale socket file is replaced)."""
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    server.add_generic_rpc_handlers(handlers)
    if not server.add_insecure_port(f"unix://{socket}"):
        raise OSError(f"cannot listen on {socket}")
    server.start()
    return server


class Counted:
    """A node service with `<metric>_total{result}` counted: published; refused (its
    FailedMount event says why); waiting (UNAVAILABLE: the kubelet tries again); failed
    (an OSError on the node)."""

    def __init__(
        self, node: NodeService, metric: str, doc: str, registry: CollectorRegistry
    ) -> None:
        self._node = node
        self._publishes = Counter(metric, doc, ["result"], registry=registry)

    def publish(self, request: PublishRequest) -> None:
        try:
            self._node.publish(request)
        except Refused as error:
            waiting = error.code is grpc.StatusCode.UNAVAILABLE
            self._publishes.labels(result="waiting" if waiting else "refused").inc()
            raise
        except OSError:
            self._publishes.labels(result="failed").inc()
            raise
        self._publishes.labels(result="published").inc()

    def unpublish(self, request: UnpublishRequest) -> None:
        self._node.unpublish(request)


def run_driver(
    process: shell.Process,
    name: str,
    node_id: str,
    node: NodeService,
    *,
    metric: tuple[str, str],
    csi_socket: Path,
    kubelet_socket: Path | None,
    registration_dir: Path,
    metrics: tuple[str, int],
    version: str,
) -> None:
    """A node-only CSI driver `name` for a binary's `start`: its metrics endpoint (the
    publishes counted as `metric`, a name and its help), its CSI services on
    `csi_socket`, and its registration with the kubelet (which reaches the services at
    `kubelet_socket`, by default `csi_socket`); all stopped with the process."""
    registry = CollectorRegistry()
    counted = Counted(node, metric[0], metric[1], registry)
    process.serve_endpoints(
        metrics[0], metrics[1], lambda: (generate_latest(registry), CONTENT_TYPE_LATEST)
    )
    server = serve(csi_socket, csi_handlers(name, version, node_id, counted))
    process.defer(lambda: server.stop(5).wait())
    registration = serve(
        registration_dir / f"{name}-reg.sock",
        registration_handlers(name, str(kubelet_socket or csi_socket)),
        workers=1,
    )
    process.defer(lambda: registration.stop(5).wait())
    log.info("CSI driver %s serving", name, extra={"socket": str(csi_socket), "node": node_id})


def add_driver_arguments(parser: argparse.ArgumentParser, driver: str) -> None:
    """The flags every node driver of gpupack takes: its node, its socket and the
    kubelet's plugin registry."""
    add = parser.add_argument
    add(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name (default: $NODE_NAME, set from the downward API)",
    )
    add(
        "--csi-socket",
        type=Path,
        default=PLUGINS / driver / "csi.sock",
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
