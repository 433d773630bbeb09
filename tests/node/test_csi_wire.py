"""The MPS CSI driver's messages against Go's protobuf, byte for byte, and its gRPC
services over a real unix socket."""

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupack.runtime import protowire
from node import csi
from node.csi import PublishRequest, Refused, UnpublishRequest

# Golden vectors from a throwaway Go program (not in this repo) with
# github.com/container-storage-interface/spec v1.11.0, k8s.io/kubelet v0.34.2
# (pkg/apis/pluginregistration/v1) and google.golang.org/protobuf v1.36.12:
# proto.MarshalOptions{Deterministic: true}.Marshal(msg), printed with hex.EncodeToString.

# NodePublishVolumeRequest{VolumeId: "csi-8f3c", PublishContext: {"p": "q"},
#   TargetPath: "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/gpupack-mps/mount",
#   VolumeCapability: {Mount: {}, AccessMode: SINGLE_NODE_WRITER}, Readonly: true,
#   Secrets: {"s": "t"}, VolumeContext: {pod.name: "llm-0", pod.namespace: "ml",
#   pod.uid: "u1", ephemeral: "true"}}
GO_PUBLISH = bytes.fromhex(
    "0a086373692d3866336312060a017012017122442f7661722f6c69622f6b7562656c65742f706f6473"
    "2f75312f766f6c756d65732f6b756265726e657465732e696f7e6373692f6770757061636b2d6d7073"
    "2f6d6f756e742a061a020801120030013a060a017312017442240a1c6373692e73746f726167652e6b"
    "38732e696f2f657068656d6572616c12047472756542240a1b6373692e73746f726167652e6b38732e"
    "696f2f706f642e6e616d6512056c6c6d2d3042260a206373692e73746f726167652e6b38732e696f2f"
    "706f642e6e616d65737061636512026d6c42200a1a6373692e73746f726167652e6b38732e696f2f70"
    "6f642e75696412027531"
)
GO_UNPUBLISH = bytes.fromhex("0a086373692d3866336312082f742f6d6f756e74")
GO_PLUGIN_INFO = bytes.fromhex("0a0e6d70732e6770757061636b2e696f1205302e312e30")
GO_PROBE_READY = bytes.fromhex("0a020801")
GO_NODE_INFO = bytes.fromhex("0a0a6770752d6e6f64652d31")
GO_REGISTRATION_INFO = bytes.fromhex(
    "0a09435349506c7567696e120e6d70732e6770757061636b2e696f1a302f7661722f6c69622f6b7562"
    "656c65742f706c7567696e732f6d70732e6770757061636b2e696f2f6373692e736f636b2205312e30"
    "2e30"
)
GO_REGISTRATION_REFUSED = bytes.fromhex("12026e6f")
GO_REGISTRATION_OK = bytes.fromhex("0801")
SOCKET = "/var/lib/kubelet/plugins/mps.gpupack.io/csi.sock"


def test_a_kubelet_publish_request_decodes_to_its_pod_and_target() -> None:
    request = csi.decode_publish(GO_PUBLISH)
    assert request.volume_id == "csi-8f3c"
    assert request.target_path.endswith("kubernetes.io~csi/gpupack-mps/mount")
    assert request.readonly is True
    assert request.pod == ("ml", "llm-0", "u1")
    assert request.volume_context["csi.storage.k8s.io/ephemeral"] == "true"


def test_an_unpublish_request_decodes() -> None:
    assert csi.decode_unpublish(GO_UNPUBLISH) == UnpublishRequest("csi-8f3c", "/t/mount")


def test_answers_encode_as_go_does() -> None:
    assert csi.encode_plugin_info("mps.gpupack.io", "0.1.0") == GO_PLUGIN_INFO
    assert csi.encode_probe(True) == GO_PROBE_READY
    assert csi.encode_node_info("gpu-node-1") == GO_NODE_INFO
    assert csi.encode_registration_info("mps.gpupack.io", SOCKET) == GO_REGISTRATION_INFO


def test_the_kubelets_registration_verdicts_decode() -> None:
    assert csi.decode_registration_status(GO_REGISTRATION_OK) == csi.RegistrationStatus(True)
    refused = csi.decode_registration_status(GO_REGISTRATION_REFUSED)
    assert refused == csi.RegistrationStatus(False, "no")


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(GO_PUBLISH[:-3], id="truncated"),
        pytest.param(b"\x0a\x02\xff\xfe", id="bad-utf8"),
        pytest.param(b"\x30\x0a\x01", id="readonly-not-a-varint"),
    ],
)
def test_a_malformed_publish_request_is_an_error_naming_the_message(data: bytes) -> None:
    with pytest.raises(protowire.ProtobufError, match="NodePublishVolumeRequest"):
        csi.decode_publish(data)


def corrupted(message: bytes) -> st.SearchStrategy[bytes]:
    """`message` with a byte changed, cut short or grown: closer to a real peer's bug than
    random bytes, which mostly fail at the first tag."""
    return st.one_of(
        st.builds(
            lambda at, byte: message[:at] + bytes([byte]) + message[at + 1 :],
            st.integers(0, len(message) - 1),
            st.integers(0, 255),
        ),
        st.integers(0, len(message)).map(lambda at: message[:at]),
        st.binary(max_size=16).map(lambda extra: message + extra),
    )


@settings(max_examples=400)
@given(
    st.binary(max_size=256)
    | corrupted(GO_PUBLISH)
    | corrupted(GO_UNPUBLISH)
    | corrupted(GO_REGISTRATION_REFUSED)
)
def test_no_bytes_the_kubelet_could_send_break_a_decoder(data: bytes) -> None:
    """Whatever arrives on the socket decodes or is a ProtobufError naming the message (the
    server answers INVALID_ARGUMENT); never another exception."""
    for decode in (csi.decode_publish, csi.decode_unpublish, csi.decode_registration_status):
        try:
            decode(data)
        except protowire.ProtobufError as error:
            assert str(error)


class RecordingNode:
    """The node side, for the transport test: records calls, refuses on request."""

    def __init__(self) -> None:
        self.published: list[PublishRequest] = []
        self.unpublished: list[UnpublishRequest] = []

    def publish(self, request: PublishRequest) -> None:
        if request.pod[1] == "intruder":
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, "pod ml/intruder is not ours")
        self.published.append(request)

    def unpublish(self, request: UnpublishRequest) -> None:
        self.unpublished.append(request)


@pytest.fixture
def node() -> RecordingNode:
    return RecordingNode()


@pytest.fixture
def channel(tmp_path: Path, node: RecordingNode) -> Iterator[grpc.Channel]:
    # Unix socket paths are limited to about 100 bytes: tmp_path can be longer.
    short = Path("/tmp") / f"gpupack-csi-{tmp_path.name[-20:]}"
    handlers = csi.csi_handlers("mps.gpupack.io", "0.1.0", "gpu-node-1", node)
    handlers += csi.registration_handlers("mps.gpupack.io", SOCKET)
    server = csi.serve(short / "csi.sock", handlers)
    with grpc.insecure_channel(f"unix://{short}/csi.sock") as channel:
        yield channel
    server.stop(0).wait()
    (short / "csi.sock").unlink(missing_ok=True)
    short.rmdir()


def call(channel: grpc.Channel, method: str, body: bytes = b"") -> bytes:
    stub = channel.unary_unary(method)
    answer: bytes = stub(body, timeout=10)
    return answer


def test_the_services_answer_over_grpc_as_the_kubelet_asks(
    channel: grpc.Channel, node: RecordingNode
) -> None:
    assert call(channel, "/pluginregistration.Registration/GetInfo") == GO_REGISTRATION_INFO
    call(channel, "/pluginregistration.Registration/NotifyRegistrationStatus", GO_REGISTRATION_OK)
    assert call(channel, "/csi.v1.Identity/GetPluginInfo") == GO_PLUGIN_INFO
    assert call(channel, "/csi.v1.Identity/Probe") == GO_PROBE_READY
    assert call(channel, "/csi.v1.Node/NodeGetCapabilities") == b""  # no staging
    assert call(channel, "/csi.v1.Node/NodeGetInfo") == GO_NODE_INFO
    assert call(channel, "/csi.v1.Node/NodePublishVolume", GO_PUBLISH) == b""
    assert call(channel, "/csi.v1.Node/NodeUnpublishVolume", GO_UNPUBLISH) == b""
    assert [r.pod for r in node.published] == [("ml", "llm-0", "u1")]
    assert node.unpublished == [UnpublishRequest("csi-8f3c", "/t/mount")]


def test_a_refusal_reaches_the_kubelet_as_its_status_and_reason(channel: grpc.Channel) -> None:
    pod = protowire.map_field(8, {"csi.storage.k8s.io/pod.name": "intruder"})
    body = protowire.str_field(1, "csi-1") + protowire.str_field(4, "/t/mount") + pod
    with pytest.raises(grpc.RpcError) as raised:
        call(channel, "/csi.v1.Node/NodePublishVolume", body)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not ours" in (raised.value.details() or "")


def test_a_malformed_request_is_invalid_argument_not_a_crash(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        call(channel, "/csi.v1.Node/NodePublishVolume", b"\x0a\x09abc")
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "NodePublishVolumeRequest" in (raised.value.details() or "")
