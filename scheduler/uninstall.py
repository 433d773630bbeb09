"""`gpupack-scheduler-uninstall`: the chart's pre-delete hook, so `helm uninstall` never
strands a GPU or a pod.

It refuses (exit 1, naming the pods and what to do) while any pod that gpupack placed or
will place still lives: a pod that names gpupack-scheduler, running on a GPU that only a
capacity pod holds or pending for a scheduler about to be removed. Otherwise it deletes
every capacity pod in gpupack's namespace (as the scheduler, which the admission policy
allows), so no GPU stays held by nobody's pods; Helm then removes the rest.

The procedure it enforces (docs/install.md, Uninstall): opt the namespaces and workloads
out, roll the workloads so their pods come back with whole GPUs, then uninstall.
"""

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Final

from gpupack import keys
from gpupack.objects import JSON
from gpupack.runtime.api import ApiError
from gpupack.runtime.args import conventions
from gpupack.runtime.config import ConfigError
from gpupack.runtime.logs import configure_logging
from gpupack.runtime.shell import EXIT_FAILED, EXIT_OK, EXIT_USAGE, add_log_arguments
from gpupack.runtime.transport import Transport, connect
from gpupack.shares import is_live

log = logging.getLogger(__name__)

SHOWN: Final = 10  # pods named in the refusal; the rest are counted


def fractional_pods(pods: Sequence[JSON], scheduler_name: str) -> list[str]:
    """`namespace/name` of the live pods that name gpupack's scheduler."""
    return sorted(
        f"{p['metadata'].get('namespace')}/{p['metadata'].get('name')}"
        for p in pods
        if (p.get("spec") or {}).get("schedulerName") == scheduler_name and is_live(p)
    )


def refusal(names: Sequence[str]) -> str:
    shown = ", ".join(names[:SHOWN]) + (
        f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    )
    return (
        f"gpupack: refusing to uninstall: {len(names)} pods share GPUs through gpupack "
        f"({shown}); removing gpupack now would leave them on GPUs nobody holds, or pending "
        "for a scheduler that is gone. Opt their namespaces and workloads out "
        f"(`kubectl label namespace <ns> {keys.OPTIMIZE}-`), roll the workloads "
        "(`kubectl rollout restart deployment -n <ns> <name>`) so their pods come back "
        "asking whole GPUs, then uninstall again. `helm uninstall --no-hooks` skips this "
        "check and strands them."
    )


def run(kube: Transport, namespace: str, scheduler_name: str) -> int:
    pods = kube.list("/api/v1/pods", {})["items"]
    names = fractional_pods(pods, scheduler_name)
    if names:
        print(refusal(names), file=sys.stderr)
        return EXIT_FAILED
    capacity = kube.list(
        f"/api/v1/namespaces/{namespace}/pods",
        {"labelSelector": f"{keys.ROLE}={keys.ROLE_CAPACITY}"},
    )["items"]
    for pod in capacity:
        name = pod["metadata"]["name"]
        try:
            kube.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiError as error:
            if error.status != 404:
                raise
        log.info("deleted capacity pod %s/%s", namespace, name)
    print(f"gpupack: no pod shares a GPU; deleted {len(capacity)} capacity pods")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpupack-scheduler-uninstall",
        description="Before `helm uninstall`: refuse while pods share GPUs through gpupack; "
        "otherwise delete the capacity pods, so nothing is stranded.",
    )
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster)")
    parser.add_argument(
        "--namespace",
        default=keys.SYSTEM_NAMESPACE,
        help="gpupack's namespace (default: %(default)s)",
    )
    parser.add_argument("--scheduler-name", default=keys.SCHEDULER_NAME)
    add_log_arguments(parser)
    args = conventions(parser).parse_args(argv)
    configure_logging(args.log_level, fmt=args.log_format)
    try:
        kube = connect(args.kubeconfig, user_agent="gpupack-scheduler-uninstall")
    except ConfigError as error:
        print(f"gpupack-scheduler-uninstall: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run(kube, args.namespace, args.scheduler_name)
    except ApiError as error:
        print(f"gpupack-scheduler-uninstall: the API refused: {error}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        kube.close()


if __name__ == "__main__":
    sys.exit(main())
