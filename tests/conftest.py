"""Fixtures shared across tiers: the local HTTP stub of the API (`tests/apistub.py`), and
`restore_logging` for tests that run a binary's `main` (it configures the root logger)."""

import logging
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.apistub"]


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Leave the root logger as the other tests expect it after a `main()` configured it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
