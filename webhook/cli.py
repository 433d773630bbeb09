"""`gpupack-webhook`: serve admissions, explain a manifest offline, read the audit log."""

import argparse
import sys
from collections.abc import Sequence

from gpupack.runtime.args import conventions
from ops import audit_reader, explain
from webhook import serve


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
    explain.add_arguments(
        commands.add_parser(
            "explain",
            help="show what the webhook would do to a manifest (offline)",
            description="Read a Pod or workload manifest (Deployment, StatefulSet, DaemonSet, "
            "ReplicaSet, Job, CronJob) and print the webhook's decision and the resulting pod. "
            "Needs no cluster.",
        )
    )
    audit_reader.add_arguments(
        commands.add_parser(
            "decisions",
            help="read audit lines and print the decisions",
            description="Read the webhook's JSON audit lines from files or stdin (other lines "
            "are ignored), filter them, and print a table or JSON. Example: kubectl logs "
            "-n gpupack-system deploy/gpupack-webhook | gpupack-webhook decisions --namespace ml",
        )
    )
    return conventions(parser)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `... | head` closed the pipe: not an error
        sys.stderr.close()
        return 0
    return result


if __name__ == "__main__":
    sys.exit(main())
