"""The command-line conventions every binary shares: durations as Kubernetes writes
them, a bad value is a usage error naming it, `--version`, and every flag from the
environment."""

import argparse
from collections.abc import Callable

import pytest

from gpupack.runtime.args import (
    conventions,
    format_duration,
    non_negative_seconds,
    parse_duration,
    positive_number,
    positive_seconds,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("15s", 15.0, id="seconds"),
        pytest.param("1m30s", 90.0, id="minutes-and-seconds"),
        pytest.param("500ms", 0.5, id="milliseconds"),
        pytest.param("2h", 7200.0, id="hours"),
        pytest.param("1.5s", 1.5, id="fraction"),
        pytest.param("300", 300.0, id="plain-number-is-seconds"),
        pytest.param("2.5", 2.5, id="plain-fraction"),
    ],
)
def test_durations_are_read_as_kubernetes_writes_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "s", "15 s", "1x", "m5", "1m30", "-5s"])
def test_anything_else_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(15, "15s"), (300, "5m"), (5400, "1h30m"), (1.5, "1.5s"), (0, "0s")],
)
def test_durations_are_written_back_the_same_way(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("parse", "text", "expected"),
    [
        pytest.param(positive_seconds, "2.5", 2.5, id="positive-seconds"),
        pytest.param(positive_seconds, "1m", 60.0, id="positive-duration"),
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
        pytest.param(positive_seconds, "0", "'0' is not a positive duration", id="zero"),
        pytest.param(positive_seconds, "ten", "'ten' is not a positive duration", id="word"),
        pytest.param(positive_seconds, "nan", "'nan' is not a positive", id="nan"),
        pytest.param(non_negative_seconds, "-1", "'-1' is not a duration of at least 0", id="neg"),
        pytest.param(positive_number, "-0.5", "'-0.5' is not a positive number", id="neg-ratio"),
    ],
)
def test_a_bad_value_names_itself(parse: Callable[[str], float], text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse(text)


def parser(environ: dict[str, str]) -> argparse.ArgumentParser:
    built = argparse.ArgumentParser(prog="gpupack-test")
    built.add_argument(
        "--grace-period", type=positive_seconds, default=300.0, help="(default: %(default)s)"
    )
    built.add_argument("--log-level", choices=("info", "debug"), default="info")
    built.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True)
    built.add_argument("--dns-name", action="append", default=[])
    built.add_argument("--decision-key-file", required=True)
    sub = built.add_subparsers(dest="command")
    sub.add_parser("serve").add_argument("--port", type=int, default=8443)
    return conventions(built, environ)


def test_every_flag_can_come_from_a_gpupack_variable_and_the_command_line_wins() -> None:
    environ = {
        "GPUPACK_GRACE_PERIOD": "5m",
        "GPUPACK_LOG_LEVEL": "debug",
        "GPUPACK_LEADER_ELECT": "false",
        "GPUPACK_DNS_NAME": "a.example,b.example",
        "GPUPACK_DECISION_KEY_FILE": "/etc/key",
        "GPUPACK_PORT": "9443",
    }
    args = parser(environ).parse_args(["serve"])
    assert (args.grace_period, args.log_level, args.leader_elect) == (300.0, "debug", False)
    assert args.dns_name == ["a.example", "b.example"]
    assert args.decision_key_file == "/etc/key"  # no longer required on the command line
    assert args.port == 9443
    assert parser(environ).parse_args(["--grace-period=10s", "serve"]).grace_period == 10.0


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("GPUPACK_GRACE_PERIOD", "soon", "GPUPACK_GRACE_PERIOD='soon': 'soon' is not a positive"),
        ("GPUPACK_LOG_LEVEL", "loud", "GPUPACK_LOG_LEVEL='loud': expected one of info, debug"),
        ("GPUPACK_LEADER_ELECT", "maybe", "GPUPACK_LEADER_ELECT='maybe': expected true or false"),
    ],
)
def test_a_bad_variable_is_a_usage_error_naming_it(
    variable: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parser({variable: value, "GPUPACK_DECISION_KEY_FILE": "k"})
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_version_and_the_variables_are_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    built = parser({})
    assert "(default: 5m) [env GPUPACK_GRACE_PERIOD]" in " ".join(built.format_help().split())
    with pytest.raises(SystemExit) as exit_:
        built.parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("gpupack-test ")


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e309", "1e400s", "9999999h", "400d"])
def test_durations_no_wait_can_take_are_not_durations(text: str) -> None:
    """inf, nan and 1e309 once passed as seconds and raised OverflowError inside a wait
    (a leader's lease, long after the binary had started)."""
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)
    with pytest.raises(argparse.ArgumentTypeError):
        positive_seconds(text)


@pytest.mark.parametrize("text", ["inf", "nan", "1e309"])
def test_numbers_must_be_finite(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is not a positive number"):
        positive_number(text)


def test_a_duration_from_the_environment_that_no_wait_can_take_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parser({"GPUPACK_GRACE_PERIOD": "inf", "GPUPACK_DECISION_KEY_FILE": "k"})
    assert exit_.value.code == 2
    assert "GPUPACK_GRACE_PERIOD='inf'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        pytest.param(["--dns-name", "c.example"], ["c.example"], id="the-command-line-replaces"),
        pytest.param(
            ["--dns-name", "c.example", "--dns-name", "d.example"],
            ["c.example", "d.example"],
            id="every-command-line-value",
        ),
        pytest.param([], ["a.example", "b.example"], id="the-environment-alone"),
    ],
)
def test_a_repeatable_flag_on_the_command_line_wins_over_the_environment(
    argv: list[str], names: list[str]
) -> None:
    environ = {"GPUPACK_DNS_NAME": "a.example,b.example", "GPUPACK_DECISION_KEY_FILE": "k"}

    assert parser(environ).parse_args(argv).dns_name == names
    assert parser({"GPUPACK_DECISION_KEY_FILE": "k"}).parse_args(argv).dns_name == (
        names if argv else []
    )
