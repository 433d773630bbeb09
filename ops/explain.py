"""`kubectl gpupack explain -f MANIFEST`: the webhook's decision for a manifest, offline.

Takes a Pod or a workload (its pod template), runs the same pure decision the server
runs, and prints the decision and the resulting pod (or only the patch with --patch).
Namespace labels and annotations can be supplied so opt-in and namespace policies are
explained as the cluster would see them. Offline there are no GPUPolicy objects and no
GPURecommendations: the built-in policies apply, with their initial allocations.
"""

import argparse
import copy
import json
import sys
from collections.abc import Iterator
from typing import Any, TextIO, cast

import jsonpatch
import yaml

from gpupack import cuda, keys, mps
from gpupack.objects import JSON, Pod
from gpupack.quantity import format_memory
from webhook.decision import Decision, Outcome
from webhook.mutate import MutationContext, decide
from webhook.review import AdmissionRequest
from webhook.share import mps_limits

TEMPLATE_KINDS = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
# The controller that creates a workload's pods, as their owner reference names it.
POD_OWNER = {"Deployment": "ReplicaSet", "CronJob": "Job"}


class ManifestError(ValueError):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        required=True,
        metavar="MANIFEST",
        help="YAML or JSON file with a Pod or workload; '-' reads stdin; several documents "
        "are explained one after another",
    )
    parser.add_argument("--patch", action="store_true", help="print the JSONPatch, not the pod")
    parser.add_argument(
        "--namespace-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of the pod's namespace, e.g. gpupack.io/optimize=enabled (repeatable); "
        "without any, the namespace is treated as opted in, as the API server's selectors would",
    )
    parser.add_argument(
        "--namespace-annotation",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an annotation of the pod's namespace, e.g. gpupack.io/policy=batch (repeatable)",
    )
    parser.add_argument(
        "--memory-enforcement",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="as the install's memoryEnforcement.enabled (default: on, the chart's default)",
    )
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    parser.set_defaults(run=run)


def _pairs(items: list[str], option: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ManifestError(f"{option} {item!r}: expected KEY=VALUE")
        pairs[key] = value
    return pairs


def _dig(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def pod_from_manifest(doc: Any) -> tuple[Pod, str]:
    """The pod a manifest would produce, as the admission request would carry it, and its
    kind. Workloads get the owner reference their controller would set."""
    if not isinstance(doc, dict):
        raise ManifestError("the manifest is not a Kubernetes object (expected a mapping)")
    kind = doc.get("kind")
    meta = doc.get("metadata") or {}
    if kind == "Pod":
        return copy.deepcopy(doc), "Pod"  # type: ignore[return-value]
    if kind not in TEMPLATE_KINDS:
        accepted = ", ".join(["Pod", *TEMPLATE_KINDS])
        raise ManifestError(f"kind {kind!r} is not supported; accepted: {accepted}")
    template = _dig(doc, TEMPLATE_KINDS[kind])
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        raise ManifestError(f"{kind} {meta.get('name', '')!r} has no pod template spec")
    name = str(meta.get("name", "workload"))
    pod_meta = copy.deepcopy(template.get("metadata") or {})
    pod_meta.setdefault("namespace", meta.get("namespace", "default"))
    owner_kind = POD_OWNER.get(kind, kind)
    owner_name = name
    labels = pod_meta.setdefault("labels", {})
    if kind == "Deployment":
        labels["pod-template-hash"] = "explain"
        owner_name = f"{name}-explain"
    pod_meta["generateName"] = f"{owner_name}-"
    pod_meta["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": owner_kind,
            "name": owner_name,
            "uid": "explain",
            "controller": True,
        }
    ]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": template["spec"]}
    return cast(Pod, copy.deepcopy(pod)), kind


def open_input(path: str) -> TextIO:
    """The named file, or stdin for '-'."""
    if path == "-":
        return sys.stdin
    return open(path, encoding="utf-8", errors="replace")


def _documents(stream: TextIO) -> Iterator[Any]:
    try:
        yield from (doc for doc in yaml.safe_load_all(stream) if doc is not None)
    except yaml.YAMLError as exc:
        raise ManifestError(f"not valid YAML or JSON: {exc}") from None


def summary(decision: Decision, kind: str, name: str) -> JSON:
    out: JSON = {
        "object": f"{kind}/{name}",
        "outcome": decision.outcome.value,
        "reason": decision.reason.value,
        "message": decision.message,
    }
    if decision.outcome is Outcome.MUTATED:
        out |= {
            "policy": decision.policy,
            "policySource": decision.policy_source,
            "policyOrigin": decision.policy_origin,
            "allocationSource": decision.allocation_source,
            "pool": decision.demand.pool if decision.demand else None,
        }
        out["enforcement"] = decision.annotations.get(keys.ENFORCEMENT)
        applies = cuda.enforced(out["enforcement"])
        if cuda.MPS in applies and decision.compute is not None:
            out["mps"] = mps_wiring(decision.compute, decision.memory or 0)
        if cuda.MEMORY in applies and decision.memory is not None:
            out["memory"] = memory_wiring(decision.memory)
    if decision.stripped:
        out["stripped"] = list(decision.stripped)
    if decision.warnings:
        out["warnings"] = list(decision.warnings)
    return out


def memory_wiring(memory: int) -> JSON:
    """How a memory-enforced pod is held to its share, and what that does not cover."""
    return {
        "limit": format_memory(memory),
        "shim": f"{cuda.LIBRARY} from the CSI volume {cuda.VOLUME} ({cuda.DRIVER}) at "
        f"{cuda.MOUNT_PATH}, loaded through {cuda.PRELOAD_PATH}: CUDA allocations past "
        "the limit fail with out-of-memory, and cuMemGetInfo, cuDeviceTotalMem and NVML "
        "report the limit as the GPU's memory",
        "driver": {e["name"]: e["value"] for e in cuda.memory_environment(memory)},
        "notEnforced": "memory bandwidth, compute, faults; a static binary or a process "
        "that bypasses the dynamic loader (docs/isolation.md)",
    }


def mps_wiring(compute: int, memory: int) -> JSON:
    """How a real-time-mps pod reaches its GPU's MPS server, and what that enforces."""
    return {
        "limits": mps_limits(compute, memory),
        "daemon": "nvidia-cuda-mps-control, run by gpupack-mps-daemon in the capacity pod "
        "holding the GPU; the GPU takes only this workload's pods",
        "volume": f"{mps.VOLUME} (CSI {mps.DRIVER}): the GPU's MPS directory at "
        f"{mps.MOUNT_PATH} ({mps.ENV_PIPE_DIRECTORY}={mps.PIPE_DIRECTORY}) and its shared "
        f"memory at {mps.SHM_PATH}",
        "isolates": "compute (each client's share of the GPU's threads) and pinned device "
        "memory (an allocation past the limit fails)",
        "doesNotIsolate": "faults: a fatal GPU error in one client can end every client of "
        "the server; memory bandwidth and caches are shared",
    }


def explain(
    doc: Any, namespace: JSON, as_patch: bool, *, memory_enforcement: bool = True
) -> tuple[JSON, Any]:
    pod, kind = pod_from_manifest(doc)
    meta = pod.get("metadata") or {}
    namespace = copy.deepcopy(namespace)
    namespace["metadata"]["name"] = meta.get("namespace", "default")
    request = AdmissionRequest(
        uid="explain",
        operation="CREATE",
        namespace=str(meta.get("namespace", "default")),
        name=str(meta.get("name", "")),
        dry_run=True,
        pod=pod,
    )
    context = MutationContext(namespace=namespace, memory_enforcement=memory_enforcement)
    decision = decide(request, context)
    name = str((doc.get("metadata") or {}).get("name", meta.get("generateName", "")))
    result = list(decision.patch) if as_patch else jsonpatch.apply_patch(pod, list(decision.patch))
    return summary(decision, kind, name), result


def run(args: argparse.Namespace) -> int:
    try:
        labels = _pairs(args.namespace_label, "--namespace-label") or {
            keys.OPTIMIZE: keys.OPTIMIZE_ENABLED
        }
        namespace = {
            "metadata": {
                "labels": labels,
                "annotations": _pairs(args.namespace_annotation, "--namespace-annotation"),
            }
        }
        with open_input(args.filename) as stream:
            docs = list(_documents(stream))
        if not docs:
            raise ManifestError(f"{args.filename}: no Kubernetes object found")
        outputs = [
            explain(doc, namespace, args.patch, memory_enforcement=args.memory_enforcement)
            for doc in docs
        ]
    except OSError as exc:
        print(
            f"kubectl gpupack explain: cannot read {args.filename}: {exc.strerror}", file=sys.stderr
        )
        return 2
    except ManifestError as exc:
        print(f"kubectl gpupack explain: {exc}", file=sys.stderr)
        return 2
    for index, (decision, result) in enumerate(outputs):
        if args.output == "json":
            print(
                json.dumps(
                    {"decision": decision, "patch" if args.patch else "pod": result}, indent=2
                )
            )
            continue
        if index:
            print("---")
        print("# decision")
        for line in yaml.safe_dump(decision, sort_keys=False).splitlines():
            print(f"#   {line}")
        print(yaml.safe_dump(result, sort_keys=False), end="")
    return 0
