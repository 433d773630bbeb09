"""The API server's clock from the Date headers of its answers (`ServerClock`), with this
process's clocks and the server's played by the test."""

import logging
from email.utils import formatdate

import pytest

from gpupack.runtime.serverclock import ServerClock

OFFSET = 3600.25  # the server's clock minus this machine's


class Clocks:
    """This machine's wall and monotonic clocks, and the server's, moved together."""

    def __init__(self) -> None:
        self.monotonic = 1000.0
        self.wall = 1_800_000_000.0
        self.clock = ServerClock(wall=lambda: self.wall, monotonic=lambda: self.monotonic)

    def server(self) -> float:
        return self.wall + OFFSET

    def pass_time(self, seconds: float) -> None:
        self.monotonic += seconds
        self.wall += seconds

    def answer(self, round_trip: float, written_at: float = 0.5) -> None:
        """A request whose answer took `round_trip`; the server wrote its Date
        `written_at` of the way through."""
        sent = self.monotonic
        self.pass_time(round_trip * written_at)
        date = formatdate(self.server(), usegmt=True)
        self.pass_time(round_trip * (1 - written_at))
        self.clock.observe(date, sent, self.monotonic)


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


def test_until_an_answer_carries_a_date_it_is_this_machines_clock(clocks: Clocks) -> None:
    clocks.clock.observe(None, clocks.monotonic, clocks.monotonic)
    clocks.clock.observe("not a date", clocks.monotonic, clocks.monotonic)

    assert clocks.clock.now() == clocks.wall


def test_answers_at_different_moments_of_the_second_pin_it_down(clocks: Clocks) -> None:
    clocks.answer(0.01)
    first = abs(clocks.clock.now() - clocks.server())
    for step in (0.13, 0.29, 0.41, 0.57, 0.73, 0.89):
        clocks.pass_time(step)
        clocks.answer(0.01)

    assert first <= 0.51
    assert abs(clocks.clock.now() - clocks.server()) < 0.1


def test_a_slow_answer_is_ignored(clocks: Clocks) -> None:
    clocks.answer(0.01)
    before = clocks.clock.now() - clocks.monotonic
    clocks.pass_time(0.5)
    clocks.answer(30.0, written_at=0.0)  # its Date is 30 s old when it arrives

    assert clocks.clock.now() - clocks.monotonic == pytest.approx(before)


def test_a_step_of_this_machines_wall_clock_does_not_move_it(clocks: Clocks) -> None:
    clocks.answer(0.01)
    before = clocks.clock.now()
    clocks.wall += 600  # NTP steps this node's clock; the server's did not move

    assert clocks.clock.now() == before


def test_a_step_of_the_servers_clock_starts_over(clocks: Clocks) -> None:
    clocks.answer(0.01)
    clocks.monotonic += 0.5
    sent = clocks.monotonic
    stepped = clocks.server() + 120  # the server's clock stepped by 2 minutes
    clocks.clock.observe(formatdate(stepped, usegmt=True), sent, sent + 0.01)

    assert abs(clocks.clock.now() - stepped) < 1.1


def test_a_node_clock_far_from_the_servers_is_warned_about_once(
    clocks: Clocks, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "gpupack.runtime.serverclock"):
        clocks.answer(0.01)
        clocks.answer(0.01)

    assert len(caplog.records) == 1
    assert "-3600 s off the API server's" in caplog.messages[0]
