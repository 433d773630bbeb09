"""Command-line argument types every gpupack binary shares (argparse `type=` callables).

A bad value is argparse's usage error naming the value and the accepted form, the same
wording in every binary.
"""

import argparse


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")  # fails every comparison below


def positive_seconds(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def non_negative_seconds(text: str) -> float:
    value = _number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (>= 0)")
    return value


def positive_number(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value
