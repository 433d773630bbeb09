"""The seal's bytes: what earlier releases sealed must still verify (pods admitted by the
old webhook are placed by the new scheduler during an upgrade)."""

import base64
import hashlib
import hmac
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupack import keys, seal

KEY = b"k" * 32
ANNOTATIONS = {
    keys.DECISION: "0f5c2a51-uid",
    keys.ENFORCEMENT: "accounting",
    keys.GPU_COMPUTE: "300m",
    keys.GPU_MEMORY: "12Gi",
    keys.ORIGINAL_RESOURCES: '{"containers":{"main":{"limits":{"nvidia.com/gpu":"1"}}}}',
    keys.POLICY: "near-real-time",
}


def test_seals_made_by_earlier_releases_verify() -> None:
    # Made by json.dumps itself, before seal.message encoded its own (DEL and non-ASCII too).
    made = {
        "near-real-time": "v1.1790000000.D8opKzM3rNsIg5vxMMUyi48ATzUAfbFZkR5RZwJeM3o",
        "équipe\x7f": "v1.1790000000.xwhth3C_Oh5lMwDe4UTdCRxqbauyi-Xuki2pAIPrcEY",
        "batch\x7f": "v1.1790000000.BQB_0fr-HxPO6wFoLpNsm7kfye6vyOdquNwXo6SCJmk",
    }
    for policy, value in made.items():
        annotations = {**ANNOTATIONS, keys.POLICY: policy, keys.SEAL: value}
        assert seal.seal(KEY, "ml", annotations, 1790000000) == value
        assert seal.verify(KEY, "ml", annotations) == 1790000000


@given(
    st.lists(
        st.none() | st.text(max_size=12), min_size=len(seal.SEALED), max_size=len(seal.SEALED)
    ),
    st.text(max_size=8),
)
def test_the_message_is_what_json_dumps_writes_whatever_the_text(
    values: list[str | None], namespace: str
) -> None:
    annotations = {k: v for k, v in zip(seal.SEALED, values, strict=True) if v is not None}
    expected = json.dumps(
        [seal.VERSION, namespace, 7, [annotations.get(k) for k in seal.SEALED]],
        separators=(",", ":"),
    ).encode()
    assert seal.message(namespace, 7, annotations) == expected


def test_values_no_api_server_would_store_are_encoded_as_json_dumps_does() -> None:
    # A hostile review may carry numbers or lists where annotations hold strings: the seal
    # check must still answer (it then simply fails to verify), never raise.
    odd: dict[str, object] = {keys.POLICY: 7, keys.GPU_COMPUTE: ["300m"], keys.DECISION: True}
    expected = json.dumps(
        [seal.VERSION, "ml", 7, [odd.get(k) for k in seal.SEALED]], separators=(",", ":")
    ).encode()
    assert seal.message("ml", 7, odd) == expected  # type: ignore[arg-type]
    sealed: dict[str, object] = {**odd, keys.SEAL: "v1.7.x"}
    assert not seal.reinvoked(KEY, "ml", sealed, 7)  # type: ignore[arg-type]


@pytest.mark.parametrize("length", [32, 64, 65, 200], ids=["short", "block", "over", "long"])
def test_the_seal_is_hmac_sha256_for_keys_of_any_length(length: int) -> None:
    """The seal precomputes HMAC's pads per key; it must stay RFC 2104 HMAC-SHA256."""
    key = bytes(range(256))[:length]
    annotations = {keys.DECISION: "uid-1", keys.POLICY: "batch"}
    value = seal.seal(key, "ml", annotations, 7)
    mac = hmac.new(key, seal.message("ml", 7, annotations), hashlib.sha256).digest()
    assert value == f"v1.7.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}"
