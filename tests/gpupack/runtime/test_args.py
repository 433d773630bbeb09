"""The argument types every binary shares: a bad value is a usage error naming it."""

import argparse
from collections.abc import Callable

import pytest

from gpupack.runtime.args import non_negative_seconds, positive_number, positive_seconds


@pytest.mark.parametrize(
    ("parse", "text", "expected"),
    [
        pytest.param(positive_seconds, "2.5", 2.5, id="positive-seconds"),
        pytest.param(non_negative_seconds, "0", 0.0, id="zero-seconds-allowed"),
        pytest.param(positive_number, "0.5", 0.5, id="positive-ratio"),
    ],
)
def test_a_good_value_is_returned_as_a_float(
    parse: Callable[[str], float], text: str, expected: float
) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        pytest.param(positive_seconds, "0", "'0' is not a positive number of seconds", id="zero"),
        pytest.param(positive_seconds, "ten", "'ten' is not a positive", id="word"),
        pytest.param(positive_seconds, "nan", "'nan' is not a positive", id="nan"),
        pytest.param(non_negative_seconds, "-1", "'-1' is not a number of seconds", id="neg"),
        pytest.param(positive_number, "-0.5", "'-0.5' is not a positive number", id="neg-ratio"),
    ],
)
def test_a_bad_value_names_itself(parse: Callable[[str], float], text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse(text)
