"""Fixtures shared across tiers: the local HTTP stub of the API (`tests/apistub.py`), and
`restore_logging`, for every test: a binary's `main` configures the root logger with a
handler on the stderr of the moment, which under pytest is a capture file closed when the
test ends."""

import logging
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.apistub"]


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Leave the root logger as the other tests expect it after a `main()` configured it.
    For every test, not only those that ask: a handler left on a closed capture file made
    every later log line from any thread fail ("I/O operation on closed file")."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
