"""The kubelet pod-resources codec and client: the wire format against Go's own encoding,
the fields we skip, malformed input, and the client against a real gRPC server on a unix
socket (missing socket, refused, slow, restarted, error status)."""

import contextlib
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.podresources import (
    SERVICE,
    ContainerDevices,
    ContainerResources,
    PodResources,
    PodResourcesClient,
    PodResourcesError,
    PodResourcesUnavailable,
    decode_allocatable_response,
    decode_empty,
    decode_list_response,
    encode_allocatable_response,
    encode_empty,
    encode_list_response,
)
from tests.exporter.podresources_server import PodResourcesServer, short_tempdir

GPU = "nvidia.com/gpu"

# --- hand-built wire format (independent of the module's encoder) ---------------------


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def ld(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return key(number, 2) + varint(len(payload)) + payload


def text(number: int, value: str) -> bytes:
    return ld(number, value.encode())


def unknown_fields() -> bytes:
    """A field of every valid wire type under numbers no version of the API uses yet."""
    return (
        key(90, 0)
        + varint(2**64 - 1)
        + key(91, 1)
        + bytes(8)
        + ld(92, b"\x08\x01future")
        + key(93, 5)
        + bytes(4)
    )


# --- golden vectors from Go ---------------------------------------------------------
# Produced by a throwaway Go program (not in this repo) with the generated code of
# k8s.io/kubelet v0.35.4 pkg/apis/podresources/v1 and google.golang.org/protobuf v1.36.8:
# proto.MarshalOptions{Deterministic: true}.Marshal(msg), printed with hex.EncodeToString.

# ListPodResourcesResponse{PodResources: [
#   {Name: "cap-0", Namespace: "gpupack-system", Containers: [{Name: "hold", Devices: [
#     {ResourceName: "nvidia.com/gpu", DeviceIds: ["GPU-1a2b", "GPU-3c4d"]}]}]},
#   {Name: "idle", Namespace: "default", Containers: [{Name: "app"}]}]}
GO_SIMPLE = bytes.fromhex(
    "0a450a056361702d30120e6770757061636b2d73797374656d1a2c0a04686f6c6412240a0e6e7669646961"
    "2e636f6d2f67707512084750552d3161326212084750552d336334640a160a0469646c6512076465666175"
    "6c741a050a03617070"
)
GO_SIMPLE_PODS = (
    PodResources(
        "cap-0",
        "gpupack-system",
        (ContainerResources("hold", (ContainerDevices(GPU, ("GPU-1a2b", "GPU-3c4d")),)),),
    ),
    PodResources("idle", "default", (ContainerResources("app"),)),
)

# ListPodResourcesResponse{PodResources: [{Name: "cap-1", Namespace: "gpupack-system",
#   Containers: [{Name: "hold",
#     Devices: [{ResourceName: "nvidia.com/gpu", DeviceIds: ["GPU-aaaa"],
#                Topology: {Nodes: [{ID: 0}, {ID: 1}]}}],
#     CpuIds: [0, 1, 300],  (packed)
#     Memory: [{MemoryType: "memory", Size: 1<<33, Topology: {Nodes: [{ID: 1}]}}],
#     DynamicResources: [{ClaimName: "c", ClaimNamespace: "ns", ClaimResources: [
#       {CdiDevices: [{Name: "nvidia.com/gpu=0"}], DriverName: "gpu.nvidia.com",
#        PoolName: "p", DeviceName: "gpu-0", ShareId: "s1"}]}]}]}]}
GO_EVERY_FIELD = bytes.fromhex(
    "0a9d010a056361702d31120e6770757061636b2d73797374656d1a83010a04686f6c6412220a0e6e766964"
    "69612e636f6d2f67707512084750552d616161611a060a000a0208011a040001ac0222140a066d656d6f72"
    "791080808080201a040a0208012a3b1201631a026e7322320a120a106e76696469612e636f6d2f6770753d"
    "30120e6770752e6e76696469612e636f6d1a017022056770752d302a027331"
)


def test_encoding_matches_go_protobuf_byte_for_byte() -> None:
    assert encode_list_response(GO_SIMPLE_PODS) == GO_SIMPLE
    assert decode_list_response(GO_SIMPLE) == GO_SIMPLE_PODS


def test_go_message_with_every_field_decodes_to_the_modelled_ones() -> None:
    assert decode_list_response(GO_EVERY_FIELD) == (
        PodResources(
            "cap-1",
            "gpupack-system",
            (ContainerResources("hold", (ContainerDevices(GPU, ("GPU-aaaa",)),)),),
        ),
    )


# --- round trips ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "pods",
    [
        pytest.param((), id="no-pods"),
        pytest.param((PodResources("p", "ns"),), id="pod-without-containers"),
        pytest.param((PodResources("", ""),), id="pod-with-empty-names"),
        pytest.param((PodResources("p", "ns", (ContainerResources("c"),)),), id="no-devices"),
        pytest.param(
            (PodResources("p", "ns", (ContainerResources("c", (ContainerDevices(GPU),)),)),),
            id="resource-without-ids",
        ),
        pytest.param(
            (PodResources("p", "ns", (ContainerResources("c", (ContainerDevices(GPU, ("",)),)),)),),
            id="empty-device-id",
        ),
        pytest.param(
            (
                PodResources(
                    "p",
                    "ns",
                    (
                        ContainerResources("init", (ContainerDevices(GPU, ("GPU-a",)),)),
                        ContainerResources(
                            "main",
                            (
                                ContainerDevices(GPU, ("GPU-a", "GPU-b")),
                                ContainerDevices("example.com/nic", ("nic0",)),
                            ),
                        ),
                    ),
                ),
            ),
            id="several-containers-and-resources",
        ),
        pytest.param(
            tuple(
                PodResources(
                    f"pod-{i}",
                    f"ns-{i % 7}",
                    (ContainerResources("c", (ContainerDevices(GPU, (f"GPU-{i:04}",)),)),),
                )
                for i in range(500)
            ),
            id="many-pods",
        ),
        pytest.param(
            (
                PodResources(
                    "pöd-名前-🚀",
                    "nämespace",
                    (ContainerResources("ç", (ContainerDevices("ex.com/ü", ("GPU-é",)),)),),
                ),
            ),
            id="unicode-names",
        ),
        pytest.param(
            (PodResources("p" * 300, "n" * 70_000, (ContainerResources("c" * 128),)),),
            id="long-strings-multibyte-lengths",
        ),
    ],
)
def test_list_response_round_trips(pods: tuple[PodResources, ...]) -> None:
    assert decode_list_response(encode_list_response(pods)) == pods


names = st.text(max_size=12)
device_lists = st.builds(ContainerDevices, names, st.lists(names, max_size=3).map(tuple))
pod_lists = st.lists(
    st.builds(
        PodResources,
        names,
        names,
        st.lists(
            st.builds(ContainerResources, names, st.lists(device_lists, max_size=3).map(tuple)),
            max_size=3,
        ).map(tuple),
    ),
    max_size=5,
).map(tuple)


@settings(max_examples=100, deadline=None)
@given(pod_lists)
def test_any_pods_round_trip(pods: tuple[PodResources, ...]) -> None:
    assert decode_list_response(encode_list_response(pods)) == pods


@st.composite
def corrupted_messages(draw: st.DrawFn) -> bytes:
    """A valid ListPodResourcesResponse with one byte changed."""
    data = bytearray(draw(pod_lists.filter(bool).map(encode_list_response)))
    data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64) | corrupted_messages())
def test_decoding_any_bytes_gives_pods_or_a_pod_resources_error(data: bytes) -> None:
    with contextlib.suppress(PodResourcesError):
        decode_list_response(data)


@settings(max_examples=100, deadline=None)
@given(pod_lists.map(encode_list_response), st.data())
def test_truncated_message_is_an_error_or_fewer_pods(data: bytes, draw: st.DataObject) -> None:
    whole = decode_list_response(data)
    cut = draw.draw(st.integers(0, len(data)))
    try:
        kept = decode_list_response(data[:cut])
    except PodResourcesError:
        return
    # Cut between two pods: the ones before the cut, whole; never a pod cut short.
    assert len(kept) <= len(whole)
    assert list(kept) == list(whole[: len(kept)])


def test_allocatable_response_round_trips() -> None:
    devices = (ContainerDevices(GPU, ("GPU-a", "GPU-b")), ContainerDevices("ex.com/x", ("0",)))
    assert decode_allocatable_response(encode_allocatable_response(devices)) == devices
    assert decode_allocatable_response(b"") == ()


def test_allocatable_response_skips_cpu_ids_and_memory() -> None:
    data = (
        ld(1, text(1, GPU) + text(2, "GPU-a"))
        + ld(2, varint(0) + varint(5))  # cpu_ids, packed
        + ld(3, text(1, "memory") + key(2, 0) + varint(1 << 30))
    )
    assert decode_allocatable_response(data) == (ContainerDevices(GPU, ("GPU-a",)),)


def test_requests_are_empty_and_ignore_fields_from_newer_clients() -> None:
    assert encode_empty() == b""
    assert encode_empty(None) == b""
    assert decode_empty(b"") == ()
    assert decode_empty(unknown_fields()) == ()
    with pytest.raises(PodResourcesError, match="truncated varint"):
        decode_empty(b"\x80")


# --- skipped fields -------------------------------------------------------------------


def test_fields_gpupack_does_not_model_are_skipped_at_every_level() -> None:
    topology = ld(3, ld(1, b"") + ld(1, key(1, 0) + varint(1)))  # ContainerDevices.topology
    devices = text(1, GPU) + topology + text(2, "GPU-a") + unknown_fields() + text(2, "GPU-b")
    memory = ld(4, text(1, "hugepages-2Mi") + key(2, 0) + varint(2**40) + topology)
    dynamic = ld(5, text(2, "claim") + text(3, "ns") + ld(4, ld(1, text(1, "vendor.com/x=1"))))
    container = (
        text(1, "main")
        + ld(3, varint(0) + varint(3) + varint(127) + varint(128))  # cpu_ids, packed
        + key(3, 0)
        + varint(7)  # cpu_ids, unpacked
        + key(3, 0)
        + varint(2**63)  # int64 min, ten bytes
        + ld(2, devices)
        + memory
        + dynamic
        + unknown_fields()
    )
    pod = unknown_fields() + text(1, "p") + ld(3, container) + text(2, "ns") + unknown_fields()
    data = unknown_fields() + ld(1, pod) + unknown_fields() + ld(7, ld(1, b"not a pod"))

    assert decode_list_response(data) == (
        PodResources(
            "p", "ns", (ContainerResources("main", (ContainerDevices(GPU, ("GPU-a", "GPU-b")),)),)
        ),
    )


def test_negative_int64_cpu_id_is_skipped() -> None:
    container = text(1, "c") + key(3, 0) + varint(2**64 - 1)  # int64 -1: ten bytes
    assert decode_list_response(ld(1, ld(3, container))) == (
        PodResources("", "", (ContainerResources("c"),)),
    )


def test_a_repeated_singular_string_keeps_the_last_value() -> None:
    assert decode_list_response(ld(1, text(1, "old") + text(1, "new"))) == (
        PodResources("new", ""),
    )


# --- malformed input ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b"\x80", r"ListPodResourcesResponse: truncated varint", id="truncated-key"),
        pytest.param(b"\x0a\x80", r"truncated varint at byte 2", id="truncated-length"),
        pytest.param(
            b"\x0a\x05abc", r"field 1: length 5 runs past the end \(3 bytes left\)", id="past-end"
        ),
        pytest.param(
            ld(1, b"\x1a\x09ab"), r"PodResources: field 3: length 9 runs past", id="nested-past-end"
        ),
        pytest.param(
            ld(1, ld(3, ld(2, b"\x12\x01"))),
            r"ContainerDevices: field 2: length 1 runs past",
            id="deep-past-end",
        ),
        pytest.param(b"\x0b", r"field 1: groups \(wire type 3/4\) unsupported", id="group-start"),
        pytest.param(ld(1, b"\x24"), r"PodResources: field 4: groups", id="group-end"),
        pytest.param(b"\x0e", r"field 1: invalid wire type 6", id="wire-type-6"),
        pytest.param(b"\x0f", r"field 1: invalid wire type 7", id="wire-type-7"),
        pytest.param(b"\x02\x00", r"field number 0", id="field-zero"),
        pytest.param(key(9, 1) + b"\x01\x02", r"field 9: truncated fixed64", id="short-fixed64"),
        pytest.param(key(9, 5) + b"\x01", r"field 9: truncated fixed32", id="short-fixed32"),
        pytest.param(key(9, 0) + b"\xff" * 10 + b"\x01", r"varint longer than 64 bits", id="long"),
        pytest.param(
            key(9, 0) + b"\xff" * 9 + b"\x02", r"varint longer than 64 bits", id="overflow"
        ),
        pytest.param(
            key(1, 0) + varint(1),
            r"ListPodResourcesResponse.pod_resources: wire type 0, expected 2",
            id="pod-as-varint",
        ),
        pytest.param(
            ld(1, key(1, 0) + varint(1)),
            r"PodResources.name: wire type 0, expected 2",
            id="name-as-varint",
        ),
        pytest.param(
            ld(1, key(2, 5) + bytes(4)), r"PodResources.namespace: wire type 5", id="ns-as-fixed"
        ),
        pytest.param(
            ld(1, ld(3, key(2, 1) + bytes(8))),
            r"ContainerResources.devices: wire type 1",
            id="devices-as-fixed64",
        ),
        pytest.param(
            ld(1, ld(1, b"\xff\xfe")), r"PodResources.name: not valid UTF-8", id="bad-utf8"
        ),
        pytest.param(
            ld(1, ld(3, ld(2, ld(2, b"GPU-\xc3")))),
            r"ContainerDevices.device_ids: not valid UTF-8",
            id="bad-utf8-device-id",
        ),
    ],
)
def test_malformed_message_is_an_error_naming_the_problem(data: bytes, message: str) -> None:
    with pytest.raises(PodResourcesError, match=message):
        decode_list_response(data)


def test_device_ids_span_containers_in_order_each_once() -> None:
    pod = PodResources(
        "p",
        "ns",
        (
            ContainerResources("init", (ContainerDevices(GPU, ("GPU-b",)),)),
            ContainerResources(
                "main",
                (
                    ContainerDevices("example.com/nic", ("nic0",)),
                    ContainerDevices(GPU, ("GPU-a", "GPU-b")),
                ),
            ),
            ContainerResources("sidecar"),
        ),
    )
    assert pod.device_ids(GPU) == ("GPU-b", "GPU-a")
    assert pod.device_ids("example.com/nic") == ("nic0",)
    assert pod.device_ids("amd.com/gpu") == ()


# --- the client against a real gRPC server --------------------------------------------

CAPACITY = PodResources(
    "capacity-0",
    "gpupack-system",
    (ContainerResources("hold", (ContainerDevices(GPU, ("GPU-1", "GPU-2")),)),),
)
OTHER = PodResources("web", "default", (ContainerResources("nginx"),))


@pytest.fixture
def sock() -> Iterator[Path]:
    with short_tempdir() as directory:
        yield directory / "kubelet.sock"


@pytest.fixture
def client(sock: Path) -> Iterator[PodResourcesClient]:
    with PodResourcesClient(sock, timeout=2.0) as client:
        yield client


def test_list_returns_what_kubelet_reports(sock: Path, client: PodResourcesClient) -> None:
    with PodResourcesServer(sock, [CAPACITY, OTHER]) as kubelet:
        assert client.list() == (CAPACITY, OTHER)
        kubelet.pods = [OTHER]
        assert client.list() == (OTHER,)
        kubelet.pods = lambda: [CAPACITY]
        assert client.list() == (CAPACITY,)
        assert kubelet.calls == 3


def test_list_of_an_empty_node_is_empty(sock: Path, client: PodResourcesClient) -> None:
    with PodResourcesServer(sock):
        assert client.list() == ()


def test_allocatable_returns_kubelet_devices(sock: Path, client: PodResourcesClient) -> None:
    devices = (ContainerDevices(GPU, ("GPU-1", "GPU-2", "GPU-3")),)
    with PodResourcesServer(sock, allocatable=devices):
        assert client.allocatable() == devices


def test_client_connects_lazily(sock: Path) -> None:
    client = PodResourcesClient(sock)  # nothing there yet: no error until a call
    assert client.socket == sock
    client.close()
    client.close()


def test_missing_socket_is_unavailable_naming_the_path(client: PodResourcesClient) -> None:
    with pytest.raises(PodResourcesUnavailable, match="no kubelet pod-resources socket at") as info:
        client.list()
    assert str(client.socket) in str(info.value)
    assert "hostPath" in str(info.value)


def test_path_that_is_not_a_socket_is_unavailable(sock: Path, client: PodResourcesClient) -> None:
    sock.mkdir()  # what a hostPath of type DirectoryOrCreate leaves behind
    with pytest.raises(PodResourcesUnavailable, match="is not a socket"):
        client.list()


def test_refused_connection_is_unavailable_then_recovers(
    sock: Path, client: PodResourcesClient
) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))  # a socket file nobody listens on: a crashed kubelet's
    stale.close()
    with pytest.raises(PodResourcesUnavailable, match="unavailable") as info:
        client.list()
    assert str(sock) in str(info.value)

    with PodResourcesServer(sock, [CAPACITY]):  # kubelet restarts over the stale socket
        assert client.list() == (CAPACITY,)


def test_after_a_refused_connection_the_next_call_dials_afresh(sock: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()
    with PodResourcesClient(sock, timeout=0.2) as client:
        with pytest.raises(PodResourcesUnavailable, match="Connection refused"):
            client.list()
        sock.unlink()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
            silent.bind(str(sock))
            silent.listen()  # accepts now: a stale failure would still say "refused"
            with pytest.raises(PodResourcesUnavailable, match="did not answer List within"):
                client.list()


def test_kubelet_that_does_not_answer_in_time_is_unavailable(sock: Path) -> None:
    with (
        PodResourcesServer(sock, [CAPACITY]) as kubelet,
        PodResourcesClient(sock, timeout=0.2) as client,
    ):
        kubelet.delay = 30.0  # stop() cuts it short
        with pytest.raises(PodResourcesUnavailable, match=r"did not answer List within 0.2s"):
            client.list()
        kubelet.delay = 0.0
        assert client.list() == (CAPACITY,)


def test_listening_socket_that_never_speaks_is_unavailable(sock: Path) -> None:
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent,
        PodResourcesClient(sock, timeout=0.2) as client,
    ):
        silent.bind(str(sock))
        silent.listen()  # connections queue, nothing ever answers
        with pytest.raises(PodResourcesUnavailable, match="did not answer List within 0.2s"):
            client.list()


def test_client_works_again_after_kubelet_restart(sock: Path, client: PodResourcesClient) -> None:
    kubelet = PodResourcesServer(sock, [CAPACITY]).start()
    try:
        assert client.list() == (CAPACITY,)
        kubelet.stop()
        with pytest.raises(PodResourcesUnavailable):
            client.list()
        with pytest.raises(PodResourcesUnavailable):
            client.list()
        kubelet.pods = [CAPACITY, OTHER]
        kubelet.start()
        assert client.list() == (CAPACITY, OTHER)
    finally:
        kubelet.stop()


@pytest.mark.parametrize(
    "code",
    [
        pytest.param(grpc.StatusCode.PERMISSION_DENIED, id="permission-denied"),
        pytest.param(grpc.StatusCode.UNIMPLEMENTED, id="unimplemented"),
        pytest.param(grpc.StatusCode.INTERNAL, id="internal"),
        pytest.param(grpc.StatusCode.RESOURCE_EXHAUSTED, id="resource-exhausted"),
    ],
)
def test_error_status_is_a_pod_resources_error_with_the_code(
    sock: Path, client: PodResourcesClient, code: grpc.StatusCode
) -> None:
    with PodResourcesServer(sock, [CAPACITY]) as kubelet:
        kubelet.error = (code, "rate limit or whatever")
        with pytest.raises(PodResourcesError) as info:
            client.list()
        assert not isinstance(info.value, PodResourcesUnavailable)
        assert (
            str(info.value)
            == f"kubelet pod-resources List failed: {code.name}: rate limit or whatever"
        )
        kubelet.error = None
        assert client.list() == (CAPACITY,)


def test_unavailable_status_from_kubelet_is_unavailable(
    sock: Path, client: PodResourcesClient
) -> None:
    with PodResourcesServer(sock) as kubelet:
        kubelet.error = (grpc.StatusCode.UNAVAILABLE, "shutting down")
        with pytest.raises(PodResourcesUnavailable, match="shutting down"):
            client.list()


def test_unknown_method_is_unimplemented(sock: Path, client: PodResourcesClient) -> None:
    raw = grpc.method_handlers_generic_handler(SERVICE, {})  # a kubelet without the API
    executor = ThreadPoolExecutor(max_workers=1)
    server = grpc.server(executor, handlers=[raw])
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        with pytest.raises(PodResourcesError, match="List failed: UNIMPLEMENTED"):
            client.list()
    finally:
        server.stop(None).wait()
        executor.shutdown(wait=True)


def test_malformed_answer_is_an_error_saying_what_was_wrong(
    sock: Path, client: PodResourcesClient
) -> None:
    raw = grpc.method_handlers_generic_handler(
        SERVICE,  # no serializer: the handler's bytes go out as they are
        {"List": grpc.unary_unary_rpc_method_handler(lambda request, context: b"\x0a\x05abc")},
    )
    executor = ThreadPoolExecutor(max_workers=1)
    server = grpc.server(executor, handlers=[raw])
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        with pytest.raises(
            PodResourcesError,
            match=r"^kubelet pod-resources List answered: ListPodResourcesResponse: field 1: "
            r"length 5 runs past the end",
        ):
            client.list()
    finally:
        server.stop(None).wait()
        executor.shutdown(wait=True)
