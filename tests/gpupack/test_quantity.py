import contextlib
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupack.errors import ContractError
from gpupack.quantity import (
    format_compute,
    format_memory,
    parse_compute,
    parse_count,
    parse_memory,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("300m", Fraction(3, 10), id="milli"),
        pytest.param("0.3", Fraction(3, 10), id="decimal"),
        pytest.param("1", Fraction(1), id="one"),
        pytest.param(1, Fraction(1), id="json-int"),
        pytest.param(0.5, Fraction(1, 2), id="json-float"),
        pytest.param("12Gi", Fraction(12 * 2**30), id="gibi"),
        pytest.param("12288Mi", Fraction(12 * 2**30), id="mebi"),
        pytest.param("1e3", Fraction(1000), id="exponent"),
        pytest.param("1.5k", Fraction(1500), id="kilo"),
        pytest.param(".5", Fraction(1, 2), id="leading-dot"),
        pytest.param("-2", Fraction(-2), id="negative"),
    ],
)
def test_quantities_parse_exactly(text: object, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("12GB", id="not-a-suffix"),
        pytest.param("1.2.3", id="two-dots"),
        pytest.param("abc", id="words"),
        pytest.param(True, id="bool"),
        pytest.param(None, id="none"),
        pytest.param(float("nan"), id="nan"),
        pytest.param("1e999", id="huge-exponent"),
    ],
)
def test_bad_quantities_name_the_key_and_the_form(text: object) -> None:
    with pytest.raises(ContractError) as info:
        parse_quantity(text, "gpupack.io/gpu-memory")
    assert str(info.value).startswith("gpupack.io/gpu-memory: invalid value")
    assert "accepted:" in str(info.value)


@pytest.mark.parametrize(
    ("text", "millis"),
    [("300m", 300), ("0.3", 300), ("1", 1000), ("1000m", 1000), ("1m", 1), (0.25, 250)],
)
def test_compute_is_millis_of_one_gpu(text: object, millis: int) -> None:
    assert parse_compute(text, "k") == millis


@pytest.mark.parametrize("text", ["0", "1001m", "2", "0.0001", "-300m", "1Gi"])
def test_compute_outside_one_gpu_is_rejected(text: str) -> None:
    with pytest.raises(ContractError, match="k: invalid value"):
        parse_compute(text, "k")


def test_memory_rounds_fractional_bytes_up_and_rejects_zero() -> None:
    assert parse_memory("1.5", "k") == 2
    assert parse_memory("12Gi", "k") == 12 * 2**30
    with pytest.raises(ContractError, match="must be positive"):
        parse_memory("0", "k")


def test_counts_are_whole_numbers() -> None:
    assert parse_count("1", "k") == 1
    assert parse_count(2, "k") == 2
    assert parse_count("1e1", "k") == 10
    for not_ascii in ("²", "١٦"):  # str.isdigit() is true for these; int() is not
        with pytest.raises(ContractError):
            parse_count(not_ascii, "k")
    with pytest.raises(ContractError):
        parse_count(True, "k")
    with pytest.raises(ContractError):
        parse_count("500m", "k")


@pytest.mark.parametrize(
    ("millis", "text"), [(300, "300m"), (1000, "1"), (2000, "2"), (1500, "1500m"), (1, "1m")]
)
def test_compute_formats_canonically(millis: int, text: str) -> None:
    assert format_compute(millis) == text


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [(12 * 2**30, "12Gi"), (1536 * 2**20, "1536Mi"), (1000, "1000"), (2**10, "1Ki")],
)
def test_memory_formats_with_the_largest_exact_binary_suffix(nbytes: int, text: str) -> None:
    assert format_memory(nbytes) == text


@given(st.integers(min_value=1, max_value=1000))
def test_compute_round_trips(millis: int) -> None:
    assert parse_compute(format_compute(millis), "k") == millis


@given(st.integers(min_value=1, max_value=2**62))
def test_memory_round_trips(nbytes: int) -> None:
    assert parse_memory(format_memory(nbytes), "k") == nbytes


@given(st.text(max_size=20))
def test_any_text_parses_or_raises_contract_error(text: str) -> None:
    with contextlib.suppress(ContractError):
        parse_quantity(text, "k")
