"""Fixtures shared across tiers: the local HTTP stub of the API (`tests/apistub.py`), the
check that the integration tier is marked, and
`restore_logging`, for every test: a binary's `main` configures the root logger with a
handler on the stderr of the moment, which under pytest is a capture file closed when the
test ends."""

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["tests.apistub"]
INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tiers are chosen by marker alone (`-m integration`, `-m "not integration"`): a test
    under tests/integration/ without the `integration` marker would run in the unit tier
    and fail there for want of a cluster, so collection refuses it."""
    unmarked = [
        item.nodeid
        for item in items
        if item.path.is_relative_to(INTEGRATION) and item.get_closest_marker("integration") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            f"tests/integration/ tests without the integration marker: {unmarked}"
        )


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
