"""Command-line conventions every gpupack binary shares.

- Argument types (`type=` callables): durations written as Kubernetes writes them
  (`15s`, `1m30s`, `500ms`, `2h`; a plain number is seconds; at most `MAX_DURATION`, so
  `inf`, `nan` or `1e309` never reach a wait that cannot take them), positive numbers
  (finite). A bad value is argparse's usage error naming the value and the accepted
  form, the same wording in every binary.
- `conventions(parser)`, called last by every binary's `build_parser`: `--version`,
  durations' defaults shown as durations in the help (`5m`), and
  every option also settable by an environment variable named after its first long
  option (`--grace-period` is `GPUPACK_GRACE_PERIOD`), which the help shows. A flag on the
  command line wins over the environment, a repeatable one too (`--dns-name` given once
  replaces every name `GPUPACK_DNS_NAME` lists); a bad value in the environment is a
  usage error naming the variable.
"""

import argparse
import math
import os
import re
from collections.abc import Mapping
from importlib import metadata
from typing import Final

ENV_PREFIX: Final = "GPUPACK_"
_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_DURATION: Final = 366 * 24 * 3600.0  # a year: longer is a typo, and waits cannot take inf
EXAMPLES: Final = "(15s, 1m30s, 500ms, 2h; a plain number is seconds; at most a year)"
DURATION_FORM: Final = f"a duration {EXAMPLES}"


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration (`1h2m3.5s`, `250ms`) or a plain number of seconds.
    ValueError naming the accepted form otherwise."""
    text = text.strip()
    try:
        total = float(text)
    except ValueError:
        position, total = 0, 0.0
        for match in _DURATION.finditer(text):
            if match.start() != position:
                break
            total += float(match[1]) * _SECONDS[match[2]]
            position = match.end()
        if not text or position != len(text):
            raise ValueError(f"{text!r} is not {DURATION_FORM}") from None
    if not abs(total) <= MAX_DURATION:  # inf, nan, 1e309, a century
        raise ValueError(f"{text!r} is not {DURATION_FORM}")
    return total


def format_duration(seconds: float) -> str:
    """`15s`, `5m`, `1h30m`, `1.5s`: how help texts and the chart write a duration."""
    if seconds and seconds == int(seconds):
        whole, out = int(seconds), ""
        for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
            if whole >= size:
                out += f"{whole // size}{unit}"
                whole %= size
        return out
    return f"{seconds:g}s"


def _seconds(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError:
        return float("nan")  # fails every comparison below


def positive_seconds(text: str) -> float:
    value = _seconds(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration {EXAMPLES}")
    return value


def non_negative_seconds(text: str) -> float:
    value = _seconds(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration of at least 0 {EXAMPLES}")
    return value


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < math.inf:
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


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 0 or more")
    return value


def version() -> str:
    try:
        return metadata.version("gpupack")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def env_name(action: argparse.Action) -> str | None:
    """`GPUPACK_<FIRST LONG OPTION>`, or None for an option with no long form."""
    long = [s for s in action.option_strings if s.startswith("--") and not s.startswith("--no-")]
    if not long:
        return None
    return ENV_PREFIX + long[0][2:].upper().replace("-", "_")


_TRUE: Final = {"1", "true", "yes", "on"}
_FALSE: Final = {"0", "false", "no", "off"}


def _from_environment(
    parser: argparse.ArgumentParser, action: argparse.Action, name: str, text: str
) -> object:
    if isinstance(action, argparse.BooleanOptionalAction | argparse._StoreTrueAction):
        if text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        parser.error(f"{name}={text!r}: expected true or false")
    if isinstance(action, argparse._AppendAction):
        return [_convert(parser, action, name, part) for part in text.split(",") if part]
    return _convert(parser, action, name, text)


def _convert(
    parser: argparse.ArgumentParser, action: argparse.Action, name: str, text: str
) -> object:
    try:
        value = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        parser.error(f"{name}={text!r}: {exc}")
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        parser.error(f"{name}={text!r}: expected one of {choices}")
    return value


_SKIPPED: Final = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


def conventions(
    parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None
) -> argparse.ArgumentParser:
    """`--version`, and every option (of every subcommand too) settable from
    `GPUPACK_...` variables in `environ` (default: the process's)."""
    env = os.environ if environ is None else environ
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    _environment(parser, env)
    return parser


def _environment(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in {id(p): p for p in action.choices.values()}.values():
                _environment(sub, env)
            continue
        if isinstance(action, _SKIPPED) or not action.option_strings:
            continue
        name = env_name(action)
        if name is None:
            continue
        if action.help is not argparse.SUPPRESS:
            text = action.help or ""
            if action.type in (positive_seconds, non_negative_seconds) and isinstance(
                action.default, int | float
            ):  # a duration's default as it is written: 5m, not 300.0
                text = text.replace("%(default)s", format_duration(action.default))
            action.help = f"{text} [env {name}]".strip()
        if name in env:
            action.default = _from_environment(parser, action, name, env[name])
            action.required = False
            if isinstance(action, argparse._AppendAction):
                action.__class__ = _replaced_by_command_line(type(action))  # type: ignore[assignment]


def _replaced_by_command_line(base: type[argparse.Action]) -> type[argparse.Action]:
    """`base`, a repeatable option, whose values from the environment the first value on
    the command line replaces (argparse appends to the default, which would merge them)."""

    class FromEnvironment(base):  # type: ignore[valid-type, misc]
        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: object,
            option_string: str | None = None,
        ) -> None:
            if getattr(namespace, self.dest, None) is self.default:
                setattr(namespace, self.dest, None)
            super().__call__(parser, namespace, values, option_string)

    return FromEnvironment
