"""`kubectl gpupack` (the `kubectl-gpupack` plugin, installed with the package).

    kubectl gpupack status                 GPUs held vs asked for, saved; shares; waiting pods
    kubectl gpupack why-pending POD -n NS  why a pod waits for a GPU share
    kubectl gpupack explain -f FILE        the webhook's decision for a manifest, offline
    kubectl gpupack decisions -n NS        the audit log of every webhook replica
    kubectl gpupack what-if                GPUs and GPU nodes today's GPU pods would need

It reads the cluster as the user running it (kubectl's kubeconfig: `$KUBECONFIG`, else
`~/.kube/config`) and never writes. What each report computes is `ops.report`.
Exit status: 0 done; 1 the API server refused or was unreachable (the message names the
call); 2 bad arguments or no usable kubeconfig.
"""

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from gpupack import keys
from gpupack.objects import JSON
from gpupack.policy import API_VERSION as POLICY_API
from gpupack.policy import PLURAL as POLICY_PLURAL
from gpupack.policy import effective_policies
from gpupack.quantity import format_compute, format_memory, parse_memory
from gpupack.runtime import config
from gpupack.runtime.api import ApiError
from gpupack.runtime.args import conventions
from gpupack.runtime.transport import Transport, connect
from ops import audit_reader, explain, report

PROG = "kubectl gpupack"
WEBHOOK_PODS = "app.kubernetes.io/part-of=gpupack,app.kubernetes.io/component=webhook"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect gpupack on the current cluster: what it saves, what waits and "
        "why, what the webhook decided, and what gpupack would save before anything is "
        "opted in. Read-only.",
    )
    parser.add_argument("--kubeconfig", metavar="PATH", help=f"order: {config.ORDER}")
    parser.add_argument(
        "--gpupack-namespace",
        default=keys.SYSTEM_NAMESPACE,
        metavar="NS",
        help="gpupack's release namespace (default: %(default)s)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    status = commands.add_parser("status", help="GPUs held vs asked for, shares, waiting pods")
    status.add_argument(
        "-n",
        "--namespace",
        help="only this namespace's pods (GPUs held stay the cluster's: they serve every "
        "namespace)",
    )
    status.add_argument("-o", "--output", choices=("table", "json"), default="table")
    status.set_defaults(run=run_status)

    pending = commands.add_parser("why-pending", help="why a pod waits for a GPU share")
    pending.add_argument("pod", metavar="POD")
    pending.add_argument("-n", "--namespace", default="default")
    pending.set_defaults(run=run_why_pending)

    explain.add_arguments(
        commands.add_parser(
            "explain",
            help="the webhook's decision for a manifest (offline)",
            description="Read a Pod or workload manifest and print the webhook's decision "
            "and the resulting pod. Needs no cluster.",
        )
    )

    decisions = commands.add_parser(
        "decisions",
        help="the audit log of every webhook replica, or of files and stdin",
        description="Read the audit lines from the logs of every webhook pod (not one "
        "replica of several, as `kubectl logs deploy/...` does), merge them by time, filter. "
        "Given FILEs (`-` for stdin), read those instead, offline: other lines are ignored, "
        "so `kubectl logs ... --prefix | kubectl gpupack decisions -` works.",
    )
    decisions.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="audit log files, - for stdin (default: the cluster)",
    )
    decisions.add_argument("-n", "--namespace", help="only decisions in this namespace")
    audit_reader.add_filters(decisions)
    decisions.set_defaults(run=run_decisions)

    what_if = commands.add_parser(
        "what-if",
        help="GPUs and GPU nodes the cluster's GPU pods would need under gpupack",
        description="Read today's whole-GPU pods (read-only), run each through the webhook's "
        "decision as if its namespace opted in and plan the shares with the webhook's "
        "capacity planner: GPUs and GPU nodes needed, per namespace and policy.",
    )
    what_if.add_argument("-n", "--namespace", help="only this namespace")
    what_if.add_argument(
        "--gpu-memory",
        default="80Gi",
        help="GPU memory where a node does not say (nvidia.com/gpu.memory) (default: %(default)s)",
    )
    what_if.add_argument("-o", "--output", choices=("table", "json"), default="table")
    what_if.set_defaults(run=run_what_if)
    return conventions(parser)


# Reading the cluster.


def _items(kube: Transport, path: str, **params: str) -> list[JSON]:
    items: list[JSON] = []
    query = {**params, "limit": "500"}
    while True:
        page = kube.list(path, query)
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items
        query = {**query, "continue": str(token)}


def _pods(kube: Transport, namespace: str | None) -> list[JSON]:
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    return _items(kube, path)


def _by_name(objects: list[JSON]) -> dict[str, JSON]:
    return {str((o.get("metadata") or {}).get("name")): o for o in objects}


def _policies(kube: Transport, namespace: str) -> Any:
    try:
        objects = _items(kube, f"/apis/{POLICY_API}/namespaces/{namespace}/{POLICY_PLURAL}")
    except ApiError as error:
        if error.status != 404:
            raise
        objects = []  # the CRD is not installed (what-if before gpupack): the built-ins
    return effective_policies(objects)


# The commands.


def run_status(args: argparse.Namespace, kube: Transport) -> int:
    pods = _pods(kube, args.namespace)
    if args.namespace and args.namespace != args.gpupack_namespace:
        pods += _pods(kube, args.gpupack_namespace)  # the capacity pods serve every namespace
    where = f"/api/v1/namespaces/{args.namespace}/events" if args.namespace else "/api/v1/events"
    events = _items(kube, where, fieldSelector="reason=FailedScheduling")
    namespaces = _by_name(_items(kube, "/api/v1/namespaces", labelSelector=keys.OPTIMIZE))
    result = report.status(pods, namespaces, events, system_namespace=args.gpupack_namespace)
    if args.output == "json":
        print(json.dumps(_status_json(result, args.namespace), indent=2))
        return 0
    if args.namespace:  # held GPUs serve every namespace: no saving of one namespace alone
        print(f"{args.namespace}: {_count(result.asked, 'whole GPU')} asked for, shared on "
              f"{_count(result.in_use, 'GPU')}; gpupack holds {result.held} "
              f"(+{result.coming} coming) for all namespaces")  # fmt: skip
    else:
        print(f"GPUs held       {result.held} (+{result.coming} coming)   in use {result.in_use}")
        print(f"GPUs asked for  {result.asked} (one whole GPU per fractional pod)")
        print(f"GPUs saved      {result.saved}")
        held = result.slack
        print(f"GPUs needed     {held.needed} (the running shares, rounded up to whole GPUs)")
        print(
            f"Held beyond     {held.held - held.needed}: headroom {held.headroom}, grace "
            f"{held.grace}, fragmentation {held.fragmentation}, draining {held.draining}"
        )
    rows = [["NAMESPACE", "PODS", "GPUS ASKED", "COMPUTE", "MEMORY", "MEMORY HELD"]]
    for name, share in sorted(result.namespaces.items()):
        rows.append(
            [name, str(share.pods), str(share.gpus_asked), format_compute(share.compute),
             format_memory(share.memory), f"{share.memory_enforced} of {share.pods}"]
        )  # fmt: skip
    print()
    audit_reader.write_rows(rows, sys.stdout)
    if result.waiting:
        print(f"\n{_count(len(result.waiting), 'pod')} waiting for a GPU share:")
        for waiting in result.waiting:
            print(f"  {waiting.pod}: {waiting.why}")
    if result.escaped:
        escaped = _count(len(result.escaped), "opted-in pod")
        print(f"\n{escaped} holding a whole GPU (never rewritten):")
        for pod in result.escaped:
            print(f"  {pod}")
    return 0


def _status_json(result: report.Status, namespace: str | None) -> JSON:
    return {
        "namespace": namespace,  # None: every namespace; else the counts below but held
        "gpusHeld": result.held,
        "gpusComing": result.coming,
        "gpusInUse": result.in_use,
        "gpusAskedFor": result.asked,
        "gpusSaved": None if namespace else result.saved,
        # what holds the GPUs the shares do not need (ops.slack), every namespace's
        "gpusNeeded": result.slack.needed,
        "gpusHeldFor": {
            "headroom": result.slack.headroom,
            "grace": result.slack.grace,
            "fragmentation": result.slack.fragmentation,
            "draining": result.slack.draining,
        },
        "namespaces": {
            name: {
                "pods": share.pods,
                "gpusAskedFor": share.gpus_asked,
                "compute": format_compute(share.compute),
                "memory": format_memory(share.memory),
                # pods held to their memory share on the GPU (docs/isolation.md)
                "memoryEnforced": share.memory_enforced,
            }
            for name, share in sorted(result.namespaces.items())
        },
        "waiting": [{"pod": w.pod, "why": w.why} for w in result.waiting],
        "escaped": result.escaped,
    }


def run_why_pending(args: argparse.Namespace, kube: Transport) -> int:
    path = f"/api/v1/namespaces/{args.namespace}/pods/{args.pod}"
    try:
        pod = kube.get(path)
    except ApiError as error:
        if error.status == 404:
            print(f"{PROG}: pod {args.namespace}/{args.pod} not found", file=sys.stderr)
            return 1
        raise
    events = _items(
        kube, f"/api/v1/namespaces/{args.namespace}/events",
        fieldSelector=f"involvedObject.name={args.pod}",
    )  # fmt: skip
    for line in report.why_pending(pod, events, _pods(kube, args.gpupack_namespace)):
        print(line)
    return 0


def run_decisions(args: argparse.Namespace, kube: Transport) -> int:
    ns = args.gpupack_namespace
    replicas = _items(kube, f"/api/v1/namespaces/{ns}/pods", labelSelector=WEBHOOK_PODS)
    if not replicas:
        print(f"{PROG}: no webhook pods in {ns} ({WEBHOOK_PODS})", file=sys.stderr)
        return 1
    params = {"container": "webhook"}
    if args.since is not None:
        params["sinceTime"] = args.since.strftime("%Y-%m-%dT%H:%M:%SZ")
    records: list[JSON] = []
    selected = audit_reader.selection(args)
    for replica in replicas:
        name = replica["metadata"]["name"]
        text = kube.text(f"/api/v1/namespaces/{ns}/pods/{name}/log", params)
        records.extend(
            r for r in audit_reader.parse_lines(text.splitlines()) if selected.matches(r)
        )
    records.sort(key=lambda record: str(record.get("time", "")))
    audit_reader.show(records, args.output)
    return 0


def run_what_if(args: argparse.Namespace, kube: Transport) -> int:
    memory = parse_memory(args.gpu_memory, "--gpu-memory")
    pods = _pods(kube, args.namespace)
    namespaces = _by_name(_items(kube, "/api/v1/namespaces"))
    nodes = _by_name(_items(kube, "/api/v1/nodes"))
    policies = _policies(kube, args.gpupack_namespace)
    result = report.what_if(
        pods, namespaces, nodes, policies,
        system_namespace=args.gpupack_namespace, default_gpu_memory=memory,
    )  # fmt: skip
    if args.output == "json":
        print(json.dumps(report.what_if_json(result), indent=2))
        return 0
    if not result.gpus_now:
        print("no pod asks for nvidia.com/gpu")
        return 0
    print(
        f"GPU pods today hold {_count(result.gpus_now, 'GPU')} on "
        f"{_count(result.nodes_now, 'GPU node')}."
    )
    print(
        f"Under gpupack they would need {_count(result.gpus_needed, 'GPU')} on "
        f"{_count(result.nodes_needed, 'GPU node')}: "
        f"{_count(result.gpus_now - result.gpus_needed, 'GPU')} and "
        f"{_count(result.nodes_now - result.nodes_needed, 'node')} fewer."
    )
    rows = [["NAMESPACE", "POLICY", "PODS", "GPUS TODAY", "COMPUTE", "MEMORY"]]
    for (namespace, policy), group in sorted(result.groups.items()):
        rows.append(
            [namespace, policy or "(stay whole)", str(group.pods), str(group.gpus_now),
             format_compute(group.compute) if policy else "-",
             format_memory(group.memory) if policy else "-"]
        )  # fmt: skip
    print()
    audit_reader.write_rows(rows, sys.stdout)
    if result.whole:
        print(f"\n{_count(len(result.whole), 'pod')} would keep whole GPUs:")
        for pod, why in result.whole[:20]:
            print(f"  {pod}: {why}")
    print(
        "\nShares are each policy's initial allocation (no usage history yet); the "
        "recommender shrinks them once it has measured. Placement rules can add GPUs."
    )
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    offline = args.command == "explain" or (args.command == "decisions" and args.files)
    if offline:  # files and stdin: no cluster needed
        run = audit_reader.run if args.command == "decisions" else args.run
        try:
            result: int = run(args)
        except BrokenPipeError:  # `... | head` closed the pipe: not an error
            sys.stderr.close()
            return 0
        return result
    try:
        kube = connect(args.kubeconfig, user_agent="kubectl-gpupack", request_timeout=30)
    except config.ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        code: int = args.run(args, kube)
        return code
    except ApiError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # a bad --gpu-memory, named by the parser of quantities
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        sys.stderr.close()
        return 0
    finally:
        kube.close()


if __name__ == "__main__":
    sys.exit(main())
