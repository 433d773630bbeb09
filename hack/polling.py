"""The one polling helper of the harness, the tests and the benchmarks: wait for a signal,
never for a fixed time, and say what was awaited and what was last seen when it does not
come."""

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    what: str,
    check: Callable[[], T],
    timeout: float,
    *,
    interval: float = 0.2,
    tolerate: tuple[type[BaseException], ...] = (),
    error: type[Exception] = AssertionError,
) -> T:
    """Call `check` every `interval` seconds until it returns something truthy, and
    return that. An exception of a `tolerate` type counts as "not yet" (an API server
    that is restarting). After `timeout` seconds, `error` naming `what` and the last
    answer or exception."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            answer = check()
        except tolerate as exc:
            last = exc
        else:
            if answer:
                return answer
            last = answer
        if time.monotonic() >= deadline:
            raise error(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
        time.sleep(interval)
