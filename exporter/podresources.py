"""Kubelet pod-resources: which devices kubelet allocated to each pod on this node.

The kubelet serves `v1.PodResourcesLister` (k8s.io/kubelet/pkg/apis/podresources/v1,
api.proto) over gRPC on a unix socket under /var/lib/kubelet/pod-resources/. Its `List`
answer is the only place a node agent can learn which GPU UUIDs the device plugin handed
to each container; the exporter uses it to map a capacity pod to its GPUs.

This module owns three things:

- the values (`PodResources`, `ContainerResources`, `ContainerDevices`): the part of the
  API's messages gpupack reads;
- the codec: those messages in the protobuf wire format (`gpupack.runtime.protowire`), by hand so
  the exporter needs neither the `protobuf` runtime nor generated code. Fields gpupack
  does not model (cpu_ids, memory, dynamic_resources, topology, any added later) are
  skipped; malformed input raises `PodResourcesError` naming what was wrong;
- `PodResourcesClient`, the thin gRPC adapter. It connects lazily, fails fast with
  `PodResourcesUnavailable` when the kubelet cannot be reached, and then drops its
  channel so the next call connects afresh (a kubelet restart recreates the socket).
  Retrying is the caller's business.

Field numbers, from api.proto in k8s.io/kubelet v0.35.4:

    ListPodResourcesRequest {}
    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources { string name = 1; string namespace = 2;
                   repeated ContainerResources containers = 3; }
    ContainerResources { string name = 1; repeated ContainerDevices devices = 2;
                         repeated int64 cpu_ids = 3; repeated ContainerMemory memory = 4;
                         repeated DynamicResource dynamic_resources = 5; }
    ContainerDevices { string resource_name = 1; repeated string device_ids = 2;
                       TopologyInfo topology = 3; }
    AllocatableResourcesRequest {}
    AllocatableResourcesResponse { repeated ContainerDevices devices = 1;
                                   repeated int64 cpu_ids = 2;
                                   repeated ContainerMemory memory = 3; }
"""

import contextlib
import os
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self, TypeVar

import grpc

from gpupack.runtime import protowire as wire

DEFAULT_SOCKET: Final = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
SERVICE: Final = "v1.PodResourcesLister"
LIST_METHOD: Final = f"/{SERVICE}/List"
ALLOCATABLE_METHOD: Final = f"/{SERVICE}/GetAllocatableResources"
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024  # what kubelet's own clients accept

_T = TypeVar("_T")


class PodResourcesError(Exception):
    """The pod-resources API answered something unusable: an error status, a bad message."""


class PodResourcesUnavailable(PodResourcesError):
    """The kubelet could not be reached: no socket, connection refused, or no answer in time."""


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource_name: str  # "nvidia.com/gpu"
    device_ids: tuple[str, ...] = ()  # the device plugin's IDs: GPU UUIDs for NVIDIA's


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...] = ()


@dataclass(frozen=True, slots=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...] = ()

    def device_ids(self, resource_name: str) -> tuple[str, ...]:
        """The pod's devices of one resource, over all containers, in order, each once.

        Kubelet may hand an init container's devices on to an app container, so the same
        ID can appear under two containers.
        """
        ids = (
            device_id
            for container in self.containers
            for devices in container.devices
            if devices.resource_name == resource_name
            for device_id in devices.device_ids
        )
        return tuple(dict.fromkeys(ids))


@contextlib.contextmanager
def _malformed() -> Iterator[None]:
    try:
        yield
    except wire.ProtobufError as error:
        raise PodResourcesError(str(error)) from None


# --- messages -----------------------------------------------------------------------


def _encode_devices(devices: ContainerDevices) -> bytes:
    out = [wire.str_field(1, devices.resource_name)] if devices.resource_name else []
    out.extend(wire.len_field(2, device_id.encode()) for device_id in devices.device_ids)
    return b"".join(out)


def _decode_devices(data: memoryview) -> ContainerDevices:
    resource_name, device_ids = "", []
    for number, wire_type, value in wire.fields(data, "ContainerDevices"):
        if number == 1:
            resource_name = wire.text(wire_type, value, "ContainerDevices.resource_name")
        elif number == 2:
            device_ids.append(wire.text(wire_type, value, "ContainerDevices.device_ids"))
    return ContainerDevices(resource_name, tuple(device_ids))


def _encode_container(container: ContainerResources) -> bytes:
    out = [wire.str_field(1, container.name)] if container.name else []
    out.extend(wire.len_field(2, _encode_devices(devices)) for devices in container.devices)
    return b"".join(out)


def _decode_container(data: memoryview) -> ContainerResources:
    name, devices = "", []
    for number, wire_type, value in wire.fields(data, "ContainerResources"):
        if number == 1:
            name = wire.text(wire_type, value, "ContainerResources.name")
        elif number == 2:
            devices.append(
                _decode_devices(wire.payload(wire_type, value, "ContainerResources.devices"))
            )
    return ContainerResources(name, tuple(devices))


def _encode_pod(pod: PodResources) -> bytes:
    out = [wire.str_field(1, pod.name)] if pod.name else []
    if pod.namespace:
        out.append(wire.str_field(2, pod.namespace))
    out.extend(wire.len_field(3, _encode_container(container)) for container in pod.containers)
    return b"".join(out)


def _decode_pod(data: memoryview) -> PodResources:
    name, namespace, containers = "", "", []
    for number, wire_type, value in wire.fields(data, "PodResources"):
        if number == 1:
            name = wire.text(wire_type, value, "PodResources.name")
        elif number == 2:
            namespace = wire.text(wire_type, value, "PodResources.namespace")
        elif number == 3:
            containers.append(
                _decode_container(wire.payload(wire_type, value, "PodResources.containers"))
            )
    return PodResources(name, namespace, tuple(containers))


def encode_empty(message: object = None) -> bytes:
    """A request without fields (ListPodResourcesRequest, AllocatableResourcesRequest)."""
    return b""


def decode_empty(data: bytes) -> tuple[()]:
    """A request without fields, as `()` (to grpc, a decoder's None means it failed).

    Fields a newer client sends are ignored; malformed bytes raise `PodResourcesError`.
    """
    with _malformed():
        wire.skip(data, "request")
    return ()


def encode_list_response(pods: Iterable[PodResources]) -> bytes:
    """ListPodResourcesResponse, byte for byte as Go's protobuf marshals the same values."""
    return b"".join(wire.len_field(1, _encode_pod(pod)) for pod in pods)


def decode_list_response(data: bytes) -> tuple[PodResources, ...]:
    """ListPodResourcesResponse; raises `PodResourcesError` on a malformed message."""
    field = "ListPodResourcesResponse.pod_resources"
    with _malformed():
        return tuple(
            _decode_pod(wire.payload(wire_type, value, field))
            for number, wire_type, value in wire.fields(
                memoryview(data), "ListPodResourcesResponse"
            )
            if number == 1
        )


def encode_allocatable_response(devices: Iterable[ContainerDevices]) -> bytes:
    """AllocatableResourcesResponse with its devices only."""
    return b"".join(wire.len_field(1, _encode_devices(each)) for each in devices)


def decode_allocatable_response(data: bytes) -> tuple[ContainerDevices, ...]:
    """AllocatableResourcesResponse's devices; raises `PodResourcesError` when malformed."""
    field = "AllocatableResourcesResponse.devices"
    with _malformed():
        return tuple(
            _decode_devices(wire.payload(wire_type, value, field))
            for number, wire_type, value in wire.fields(
                memoryview(data), "AllocatableResourcesResponse"
            )
            if number == 1
        )


# --- client -------------------------------------------------------------------------


class PodResourcesClient:
    """The kubelet's pod-resources API on this node, over its unix socket.

    Each call fails within `timeout` seconds: `PodResourcesUnavailable` when the kubelet
    cannot be reached, `PodResourcesError` when it answers with an error or a message
    that does not decode. After an unavailable kubelet the channel is dropped, so the
    next call connects afresh and works as soon as the socket is back. Meant for one
    caller at a time (the exporter's refresh loop); `close()` ends a call in flight.
    """

    def __init__(self, socket: Path = DEFAULT_SOCKET, *, timeout: float = 5.0) -> None:
        self._socket = socket.absolute()
        self._timeout = timeout
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None  # created on first use

    @property
    def socket(self) -> Path:
        return self._socket

    def list(self) -> tuple[PodResources, ...]:
        """Every pod kubelet knows on this node, with the devices of each container."""
        return self._call(LIST_METHOD, decode_list_response)

    def allocatable(self) -> tuple[ContainerDevices, ...]:
        """Every device kubelet can allocate on this node, by resource."""
        return self._call(ALLOCATABLE_METHOD, decode_allocatable_response)

    def close(self) -> None:
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, method: str, decode: Callable[[bytes], _T]) -> _T:
        self._check_socket()
        with self._lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(
                    f"unix://{self._socket}",
                    options=[
                        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                        ("grpc.enable_http_proxy", 0),
                        # A fresh channel must dial afresh, not share a subchannel that
                        # is backing off from the last failure in grpc's global pool.
                        ("grpc.use_local_subchannel_pool", 1),
                    ],
                )
            # Raw bytes out: a decoding error raised inside grpc would reach us only as
            # INTERNAL "Exception deserializing response!", without saying what was wrong.
            stub = self._channel.unary_unary(method, request_serializer=encode_empty)
        name = method.rsplit("/", 1)[-1]
        try:
            data: bytes = stub(None, timeout=self._timeout)
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
            details = (error.details() if isinstance(error, grpc.Call) else str(error)) or "-"
            if code == grpc.StatusCode.UNAVAILABLE:
                self.close()
                raise PodResourcesUnavailable(
                    f"kubelet pod-resources at {self._socket} unavailable: {details}"
                ) from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                self.close()
                raise PodResourcesUnavailable(
                    f"kubelet pod-resources at {self._socket} did not answer {name} "
                    f"within {self._timeout:g}s"
                ) from None
            raise PodResourcesError(
                f"kubelet pod-resources {name} failed: {code.name}: {details}"
            ) from None
        try:
            return decode(data)
        except PodResourcesError as error:
            raise PodResourcesError(f"kubelet pod-resources {name} answered: {error}") from None

    def _check_socket(self) -> None:
        try:
            mode = os.stat(self._socket).st_mode
        except (FileNotFoundError, NotADirectoryError):
            self.close()
            raise PodResourcesUnavailable(
                f"no kubelet pod-resources socket at {self._socket}; is the hostPath mounted?"
            ) from None
        except OSError as error:
            self.close()
            raise PodResourcesUnavailable(
                f"cannot stat kubelet pod-resources socket {self._socket}: {error.strerror}"
            ) from None
        if not stat.S_ISSOCK(mode):
            self.close()
            raise PodResourcesUnavailable(
                f"{self._socket} is not a socket; is the hostPath mounted as the right type?"
            )
