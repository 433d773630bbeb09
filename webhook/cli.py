"""`gpupack-webhook`: serve admissions.

`gpupack-webhook explain` and `gpupack-webhook decisions` are retired: they were copies
of `kubectl gpupack explain` and `kubectl gpupack decisions` (operator tooling, `ops`),
which take the same arguments and read files and stdin too. For scripts written against
them, each still runs its `kubectl gpupack` counterpart (installed beside this program)
with a deprecation note on stderr, without importing it.
"""

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gpupack.runtime.args import conventions
from webhook import serve

RETIRED = {"explain": "explain", "decisions": "decisions"}  # ours -> kubectl gpupack's
PLUGIN = "kubectl-gpupack"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupack-webhook",
        description="gpupack's mutating admission webhook: shares NVIDIA GPUs between pods.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve.add_arguments(
        commands.add_parser(
            "serve",
            help="serve AdmissionReviews over HTTPS",
            description="Serve POST /mutate (admission.k8s.io/v1) over HTTPS, with /healthz, "
            "/readyz, and Prometheus metrics on a separate plain-HTTP port.",
        )
    )
    for ours, theirs in RETIRED.items():
        commands.add_parser(
            ours,
            help=f"deprecated: runs `kubectl gpupack {theirs}` (same arguments)",
            add_help=False,
        )
    return conventions(parser)


def plugin() -> str | None:
    """`kubectl-gpupack` beside this program (the same install), else on PATH."""
    here = Path(sys.argv[0]).resolve().parent
    beside = here / PLUGIN
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(PLUGIN)


def retired(command: str, rest: Sequence[str]) -> int:
    theirs = RETIRED[command]
    print(
        f"gpupack-webhook {command} is deprecated and will be removed: use "
        f"`kubectl gpupack {theirs}` (the same arguments; `-` reads stdin)",
        file=sys.stderr,
    )
    found = plugin()
    if found is None:
        print(f"gpupack-webhook: {PLUGIN} is not installed here", file=sys.stderr)
        return 2
    if command == "decisions" and not _files(rest):
        rest = ["-", *rest]  # it read stdin when given no file; the plugin reads the cluster
    return subprocess.run([found, theirs, *rest], check=False).returncode  # noqa: S603


def _files(rest: Sequence[str]) -> list[str]:
    """The files the retired `decisions` was given among its arguments (its options that
    take a value named, so that value is not read as a file)."""
    words = argparse.ArgumentParser(add_help=False)
    words.add_argument("files", nargs="*")
    for option in ("-n", "-w", "-o", "--namespace", "--workload", "--output", "--outcome"):
        words.add_argument(option)
    for option in ("--reason", "--since", "--until"):
        words.add_argument(option)
    known, _ = words.parse_known_args(list(rest))
    return list(known.files)


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in RETIRED:
        return retired(words[0], words[1:])
    args = build_parser().parse_args(words)
    try:
        result: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":
    sys.exit(main())
