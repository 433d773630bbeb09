"""The webhook's seal: proof that gpupack admitted a pod with the allocation it carries.

The webhook writes `gpupack.io/seal` = `v1.<issued, unix seconds>.<HMAC-SHA256>` over
the pod's namespace, the issue time and every annotation the admission decided
(`SEALED`), keyed with a secret only the webhook and the scheduler read. So:

- at CREATE, "already mutated" means a valid seal issued moments ago (`REINVOCATION`:
  the same admission, reinvoked after another webhook changed the pod), never that the
  annotations are present;
- the scheduler places only pods whose seal verifies for their namespace and
  annotations. A pod made outside an opted-in scope, or with edited shares, has none.

What the seal does not prove: which pod it was made for (the name and uid do not exist
yet when the webhook answers). Copying a sealed set of annotations onto another pod of
the same namespace gives that pod what the webhook would have given it; the admission
policy's quota charge and immutability still hold. Pure: the key and the time are
passed in (the webhook passes the API server's time, so replicas on nodes whose clocks
disagree agree on a seal's age).
"""

import base64
import functools
import hashlib
import hmac
import json
from json.encoder import encode_basestring_ascii as _string
from typing import Final

from gpupack import keys

VERSION: Final = "v1"
SEALED: Final = (
    keys.DECISION,
    keys.ENFORCEMENT,
    keys.GPU_COMPUTE,
    keys.GPU_MEMORY,
    keys.ORIGINAL_RESOURCES,
    keys.POLICY,
)
REINVOCATION: Final = 300  # seconds a fresh seal counts as the same admission's
MIN_KEY_BYTES: Final = 32


class SealError(ValueError):
    """Why a pod's seal does not prove that gpupack admitted it."""


def message(namespace: str, issued: int, annotations: dict[str, str]) -> bytes:
    """What the seal's HMAC is over: compact JSON with non-ASCII escaped, as every release
    wrote it (`json.dumps(..., separators=(",", ":"))`). Strings go through json's own
    string encoder, without building the encoder per call: the same bytes, faster."""
    values = [annotations.get(k) for k in SEALED]
    if type(issued) is not int or not all(v is None or type(v) is str for v in values):
        doc = [VERSION, namespace, issued, values]
        return json.dumps(doc, separators=(",", ":")).encode()
    inner = ",".join("null" if v is None else _string(v) for v in values)
    return f"[{_string(VERSION)},{_string(namespace)},{issued},[{inner}]]".encode()


@functools.lru_cache(maxsize=8)
def _pads(key: bytes) -> tuple["hashlib._Hash", "hashlib._Hash"]:
    """HMAC-SHA256's inner and outer hashes with the key's pads taken in (RFC 2104), made
    once per key: every seal and every check copies them instead of setting up an HMAC
    (which with OpenSSL 3 also looks the digest up each time), about half its cost."""
    block = hashlib.sha256().block_size
    padded = (hashlib.sha256(key).digest() if len(key) > block else key).ljust(block, b"\0")
    return (
        hashlib.sha256(bytes(b ^ 0x36 for b in padded)),
        hashlib.sha256(bytes(b ^ 0x5C for b in padded)),
    )


def _digest(key: bytes, namespace: str, issued: int, annotations: dict[str, str]) -> str:
    inner, outer = (h.copy() for h in _pads(key))
    inner.update(message(namespace, issued, annotations))
    outer.update(inner.digest())
    return base64.urlsafe_b64encode(outer.digest()).rstrip(b"=").decode()


def seal(key: bytes, namespace: str, annotations: dict[str, str], issued: int) -> str:
    """The seal value over `annotations` (the final ones, with every key of `SEALED`)."""
    return f"{VERSION}.{issued}.{_digest(key, namespace, issued, annotations)}"


def verify(key: bytes, namespace: str, annotations: dict[str, str]) -> int:
    """The seal's issue time when it verifies; raises SealError saying why not."""
    value = annotations.get(keys.SEAL)
    if not value:
        raise SealError(f"no {keys.SEAL} annotation")
    version, _, rest = value.partition(".")
    issued_text, _, digest = rest.partition(".")
    if version != VERSION or not issued_text.isascii() or not issued_text.isdigit():
        raise SealError(f"{keys.SEAL} is not a gpupack {VERSION} seal")
    issued = int(issued_text)
    if not hmac.compare_digest(digest, _digest(key, namespace, issued, annotations)):
        raise SealError(
            f"{keys.SEAL} does not match the pod's gpupack annotations in namespace {namespace}"
        )
    return issued


def reinvoked(key: bytes, namespace: str, annotations: dict[str, str], now: int) -> bool:
    """Whether the pod carries this admission's own seal: valid and issued within
    `REINVOCATION` seconds of `now`."""
    try:
        issued = verify(key, namespace, annotations)
    except SealError:
        return False
    return now - REINVOCATION <= issued <= now + REINVOCATION


def load_key(data: bytes, source: str) -> bytes:
    """The key from a key file's bytes (surrounding whitespace ignored); raises
    ValueError naming `source` when it is too short to be a secret."""
    key = data.strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"{source}: a decision key must be at least {MIN_KEY_BYTES} bytes, found {len(key)}"
        )
    return key
