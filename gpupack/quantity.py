"""Kubernetes resource quantities (`300m`, `0.3`, `1`, `12Gi`, `1e3`, JSON numbers).

Parsed exactly with Fraction, then turned into the two integer units gpupack uses:
GPU compute in millicores of one GPU (1000 = a whole GPU) and memory in bytes.
"""

import functools
import math
import re
from fractions import Fraction

from gpupack.errors import ContractError

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))$"
)
QUANTITY_FORM = "a Kubernetes quantity such as 300m, 0.5, 1, 12Gi or 12288Mi"
COMPUTE_FORM = "a share of one GPU: 1m..1000m, or 0.001..1 (e.g. 300m or 0.3)"
MEMORY_FORM = "a positive number of bytes, e.g. 12Gi, 12288Mi or 12884901888"


def parse_quantity(value: object, key: str = "quantity") -> Fraction:
    """Parse a Kubernetes quantity string (or a JSON number) into an exact Fraction."""
    if isinstance(value, bool):
        raise ContractError(key, value, QUANTITY_FORM)
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ContractError(key, value, QUANTITY_FORM)
        return Fraction(str(value))
    if not isinstance(value, str):
        raise ContractError(key, value, QUANTITY_FORM)
    parsed = _parse_text(value)
    if isinstance(parsed, str):
        raise ContractError(key, value, QUANTITY_FORM, parsed)
    return parsed


@functools.lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction | str:
    """The quantity, or why it does not parse. Cached: the same few strings ("1", "300m",
    "8Gi") arrive with every admission, and Fraction arithmetic is slow."""
    match = _QUANTITY.match(value.strip())
    if match is None or len(value) > 64:
        return ""
    number = Fraction(match["num"])
    if match["bin"]:
        number *= _BINARY[match["bin"]]
    elif match["exp"]:
        exponent = int(match["exp"][1:])
        if abs(exponent) > 30:
            return "exponent out of range"
        number *= Fraction(10) ** exponent
    else:
        number *= _DECIMAL[match["dec"] or ""]
    return -number if match["sign"] == "-" else number


def parse_compute(value: object, key: str) -> int:
    """A GPU compute share in millis of one GPU, 1..1000."""
    millis = parse_quantity(value, key) * 1000
    if millis.denominator != 1:
        raise ContractError(key, value, COMPUTE_FORM, "finer than 1m")
    if not 1 <= millis <= 1000:
        raise ContractError(key, value, COMPUTE_FORM, "outside 1m..1000m")
    return int(millis)


def parse_memory(value: object, key: str) -> int:
    """GPU memory in bytes (fractions of a byte round up, as Kubernetes does)."""
    quantity = parse_quantity(value, key)
    if quantity <= 0:
        raise ContractError(key, value, MEMORY_FORM, "must be positive")
    return -(-quantity.numerator // quantity.denominator)


def parse_millicores(value: object, key: str) -> int:
    """A CPU quantity (`500m`, `2`, `1.5`) in millicores, rounded up as Kubernetes does."""
    millis = parse_quantity(value, key) * 1000
    if millis < 0:
        raise ContractError(key, value, "a non-negative CPU quantity, e.g. 500m or 2")
    return -(-millis.numerator // millis.denominator)


def parse_bytes(value: object, key: str) -> int:
    """A memory or storage quantity (`128Mi`, `1G`, `0`) in bytes, rounded up."""
    quantity = parse_quantity(value, key)
    if quantity < 0:
        raise ContractError(key, value, "a non-negative quantity of bytes, e.g. 128Mi")
    return -(-quantity.numerator // quantity.denominator)


def parse_count(value: object, key: str) -> int:
    """A whole-number resource count such as `nvidia.com/gpu: 1`."""
    if type(value) is int and value >= 0:  # the usual forms: no quantity arithmetic
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    quantity = parse_quantity(value, key)
    if quantity.denominator != 1 or quantity < 0:
        raise ContractError(key, value, "a whole non-negative number, e.g. 1")
    return int(quantity)


@functools.lru_cache(maxsize=1024)
def format_compute(millis: int) -> str:
    """`300m` for fractions, `1` for a whole GPU: the canonical Kubernetes form."""
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


_LARGEST_FIRST = sorted(_BINARY.items(), key=lambda item: -item[1])


@functools.lru_cache(maxsize=1024)
def format_memory(nbytes: int) -> str:
    """The largest binary suffix that represents the value exactly (`12Gi`, `1536Mi`)."""
    for suffix, factor in _LARGEST_FIRST:
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor}{suffix}"
    return str(nbytes)
