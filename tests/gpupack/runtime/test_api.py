"""Retries as the API server wants them: backing off with jitter, so the clients a
restart failed together do not come back together, and never sooner than its
Retry-After (API Priority and Fairness answers 429 with one)."""

import json

import pytest

from gpupack.runtime.api import RETRY_AFTER_MAX, ApiError, Backoff, retry, status_error


@pytest.mark.parametrize("attempt", [1, 2, 3, 8])
def test_jitter_stretches_each_pause_by_at_most_its_share_and_never_past_the_cap(
    attempt: int,
) -> None:
    backoff = Backoff(base=0.2, cap=1.0, jitter=0.5)
    plain = backoff.delay(attempt, lambda: 0.0)
    stretched = backoff.delay(attempt, lambda: 0.999)

    assert plain == min(1.0, 0.2 * 2 ** (attempt - 1))
    assert plain <= stretched <= min(1.0, plain * 1.5)


def test_two_clients_failed_together_retry_at_different_moments() -> None:
    draws = iter([0.1, 0.9])
    pauses = {Backoff(base=1.0, cap=30.0).delay(3, lambda: next(draws)) for _ in range(2)}

    assert len(pauses) == 2


def failing_then(errors: list[ApiError]) -> tuple[list[float], object]:
    sleeps: list[float] = []

    def call() -> str:
        if errors:
            raise errors.pop(0)
        return "ok"

    result = retry(call, attempts=5, sleep=sleeps.append, draw=lambda: 0.0)
    return sleeps, result


def test_a_retry_waits_at_least_as_long_as_the_server_asks() -> None:
    sleeps, result = failing_then([ApiError(429, "TooManyRequests", "slow down", retry_after=3)])

    assert result == "ok"
    assert sleeps == [3.0]


def test_a_server_asking_for_an_hour_is_waited_on_for_at_most_a_minute() -> None:
    sleeps, _ = failing_then([ApiError(503, "ServiceUnavailable", "", retry_after=3600)])

    assert sleeps == [RETRY_AFTER_MAX]


def test_without_retry_after_the_backoff_decides() -> None:
    sleeps, _ = failing_then([ApiError(503, "ServiceUnavailable", "")] * 2)

    assert sleeps == [0.2, 0.4]


@pytest.mark.parametrize(
    ("headers", "details", "expected"),
    [
        pytest.param({"Retry-After": "5"}, None, 5.0, id="header"),
        pytest.param({"Retry-After": " 7 "}, None, 7.0, id="header-spaces"),
        pytest.param({}, {"retryAfterSeconds": 2}, 2.0, id="status-details"),
        pytest.param({"Retry-After": "1"}, {"retryAfterSeconds": 9}, 1.0, id="header-first"),
        pytest.param({"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}, None, None, id="date"),
        pytest.param({"Retry-After": "-3"}, {"retryAfterSeconds": "x"}, None, id="garbage"),
        pytest.param({}, None, None, id="none"),
    ],
)
def test_retry_after_is_read_from_the_header_or_the_status(
    headers: dict[str, str], details: dict[str, object] | None, expected: float | None
) -> None:
    status = {"kind": "Status", "reason": "TooManyRequests", "message": "too many requests"}
    if details is not None:
        status["details"] = details  # type: ignore[assignment]

    error = status_error(429, "Too Many Requests", json.dumps(status).encode(), headers)

    assert (error.reason, error.retry_after) == ("TooManyRequests", expected)
