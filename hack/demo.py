"""The main job: gpupack installed as users install it, on a local cluster with
simulated GPU nodes, explained.

`python -m hack.demo start` (what `hack/demo` runs) starts the local control plane with
kwok GPU nodes and one real kubelet node, installs gpupack with `helm install` of
charts/gpupack and the image hack/demo built from the Dockerfile (its pods run as
containers on the real node), and the node agent's stand-in, all detached so they keep
running; applies the sample workloads in examples/; and prints what happened: which
pods were rewritten and why, where the scheduler placed them, the capacity pods, GPUs
held versus GPUs asked for, and where to look. `python -m hack.demo stop` stops
everything it started and undoes what the real node changed on this machine.
"""

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hack.localcluster import (
    EXPORTER_NAME,
    SYSTEM_NAMESPACE,
    ClusterError,
    Kube,
    LocalCluster,
    Process,
    log,
)
from ops.audit_reader import parse_lines, table, write_rows
from ops.report import gpus_asked

REPO = Path(__file__).resolve().parents[1]
WORKDIR = REPO / ".cache" / "demo"
MANIFESTS = [
    REPO / "examples" / "demo" / "namespaces.yaml",
    REPO / "examples" / "llm-deployment.yaml",
    REPO / "examples" / "demo" / "inference.yaml",
    REPO / "examples" / "demo" / "training.yaml",
    REPO / "examples" / "demo" / "notebook.yaml",
    REPO / "examples" / "demo" / "research.yaml",
]
NAMESPACES = ("ml", "research")
CAPACITY = "gpupack.io/role=capacity"
JSON = dict[str, Any]


def webhook_logs(cluster: LocalCluster) -> list[str]:
    """What the webhook pods wrote: their audit lines among their logs."""
    selector = "app.kubernetes.io/component=webhook"
    out = cluster.tool("kubectl", "logs", "-n", SYSTEM_NAMESPACE, "-l", selector, "--prefix",
                       "--tail=-1")  # fmt: skip
    return out.splitlines()


def kubectl_gpupack(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The plugin as a user runs it: kubectl finds kubectl-gpupack on PATH (this
    environment's, where `pip install` put it)."""
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    command = [cluster.binary("kubectl"), "gpupack", *args]
    return subprocess.run(  # noqa: S603 (our kubectl, fixed arguments)
        command, capture_output=True, text=True, env=env, timeout=120, check=False
    )


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def workload_pods(kube: Kube) -> list[JSON]:
    pods: list[JSON] = []
    for namespace in NAMESPACES:
        pods += kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    return pods


def capacity_pods(kube: Kube) -> list[JSON]:
    found: list[JSON] = kube.get(
        f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods", labelSelector=CAPACITY
    )["items"]
    return found


def wait_settled(kube: Kube, expected_pods: int, timeout: float = 90.0) -> None:
    """Until every sample pod exists and every capacity pod runs with its GPU."""

    def settled() -> bool:
        pods = workload_pods(kube)
        if len(pods) < expected_pods:
            return False
        rewritten = [
            p for p in pods if "gpupack.io/decision" in p["metadata"].get("annotations", {})
        ]
        if not all(p["spec"].get("nodeName") for p in rewritten):
            return False
        capacity = kube.get(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods", labelSelector=CAPACITY)[
            "items"
        ]
        return bool(capacity) and all(
            (c["metadata"].get("annotations") or {}).get("gpupack.io/gpu-uuid") for c in capacity
        )

    with contextlib.suppress(ClusterError):
        kube.wait_for("the sample workloads to settle", settled, timeout=timeout, interval=0.5)


def anti_affine(pods: list[JSON]) -> dict[str, list[str]]:
    """The nodes of the pods that must not share a node, by workload (app label)."""
    out: dict[str, list[str]] = {}
    for pod in pods:
        rules = ((pod["spec"].get("affinity") or {}).get("podAntiAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        if rules and pod["spec"].get("nodeName"):
            meta = pod["metadata"]
            owner = f"{meta['namespace']}/{(meta.get('labels') or {}).get('app', meta['name'])}"
            out.setdefault(owner, []).append(pod["spec"]["nodeName"])
    return out


def report(cluster: LocalCluster, out: Any = sys.stdout) -> None:
    kube = cluster.kube()
    pods = workload_pods(kube)
    capacity = kube.get(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods", labelSelector=CAPACITY)[
        "items"
    ]
    rewritten = [
        p for p in pods if "gpupack.io/decision" in (p["metadata"].get("annotations") or {})
    ]
    untouched = [p for p in pods if p not in rewritten]
    asked = sum(gpus_asked(p) for p in rewritten)
    whole = sum(gpus_asked(p) for p in untouched)

    out.write("\n== Decisions (the webhook's audit log)\n")
    records = list(parse_lines(webhook_logs(cluster)))
    table(records, out)

    out.write("\n== Placement (gpupack-scheduler): GPU shares on GPUs held by capacity pods\n")
    rows = [["POD", "NODE", "GPU", "COMPUTE", "MEMORY"]]
    for item in sorted(
        rewritten, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])
    ):
        annotations = item["metadata"].get("annotations") or {}
        rows.append(
            [
                f"{item['metadata']['namespace']}/{item['metadata']['name']}",
                item["spec"].get("nodeName") or "(pending)",
                annotations.get("gpupack.io/gpu-uuid", "-")[:13],
                annotations.get("gpupack.io/gpu-compute", "-"),
                annotations.get("gpupack.io/gpu-memory", "-"),
            ]
        )
    write_rows(rows, out)

    out.write("\n== Placement rules (kube-scheduler enforces them, gpupack picks the GPU)\n")
    for owner, nodes in sorted(anti_affine(rewritten).items()):
        out.write(
            f"  {owner}: required pod anti-affinity on the hostname; its "
            f"{plural(len(nodes), 'replica')} run on {plural(len(set(nodes)), 'node')}: "
            f"{', '.join(sorted(nodes))}\n"
        )

    out.write("\n== Capacity pods: each holds one whole GPU that fractional pods share\n")
    rows = [["NAME", "NODE", "PHASE", "GPU"]]
    for item in sorted(capacity, key=lambda c: c["metadata"]["name"]):
        annotations = item["metadata"].get("annotations") or {}
        rows.append(
            [
                item["metadata"]["name"],
                item["spec"].get("nodeName", "-"),
                item.get("status", {}).get("phase", "-"),
                annotations.get("gpupack.io/gpu-uuid", "(waiting for the node agent)"),
            ]
        )
    write_rows(rows, out)

    in_use = {
        (p["metadata"].get("annotations") or {}).get("gpupack.io/gpu-uuid") for p in rewritten
    } - {None}
    empty = len(capacity) - len(in_use)
    out.write("\n== GPUs\n")
    out.write(
        f"  {plural(len(rewritten), 'pod')} rewritten in opted-in namespaces asked for "
        f"{plural(asked, 'GPU')};\n  they share {plural(len(in_use), 'GPU')} held by "
        f"capacity pods.\n"
    )
    if empty > 0:
        out.write(
            f"  {plural(empty, 'more capacity pod')} {'holds' if empty == 1 else 'hold'} a GPU "
            "no pod uses (planned while pods were being placed); the scheduler releases "
            "it after its grace period (--grace-period, 300 s).\n"
        )
    out.write(
        f"  {plural(len(untouched), 'pod')} left alone (not opted in, or no "
        f"GPU) {'holds' if len(untouched) == 1 else 'hold'} {plural(whole, 'whole GPU')}.\n"
    )
    out.write("\n== kubectl gpupack status\n")
    status = kubectl_gpupack(cluster, "status")
    out.write(status.stdout + status.stderr)
    out.write(
        "\n== kubectl gpupack what-if: the GPU pods gpupack does not manage, as if opted in\n"
    )
    what_if = kubectl_gpupack(cluster, "what-if")
    out.write(what_if.stdout + what_if.stderr)
    out.write("\n== Where to look\n")
    out.write(f"  export KUBECONFIG={cluster.kubeconfig}\n")
    out.write(f"  kubectl:          {cluster.binary('kubectl')}\n")
    out.write("  gpupack's pods:   kubectl get pods -n gpupack-system -o wide\n")
    out.write("  decisions:        PATH=$PWD/.venv/bin:$PATH kubectl gpupack decisions -n ml\n")
    out.write("  the plugin:       PATH=$PWD/.venv/bin:$PATH kubectl gpupack status\n")
    out.write("  scheduler events: kubectl get events -n ml --field-selector reason=Scheduled\n")
    out.write(f"  the release:      {cluster.binary('helm')} status gpupack -n gpupack-system\n")
    out.write(f"  cluster logs:     {cluster.workdir / 'logs'}/ (control plane, real node)\n")
    out.write("  stop everything:  hack/demo stop\n")


def start(workdir: Path) -> int:
    stopped = LocalCluster.stop_from_state(workdir)
    if stopped:
        log(f"stopped the previous demo cluster ({', '.join(stopped)})")
    if workdir.exists():
        subprocess.run(["rm", "-rf", str(workdir)], check=True)  # noqa: S603, S607
    images = [Path(p) for p in os.environ.get("GPUPACK_NODE_IMAGES", "").split(":") if p]
    image = os.environ.get("GPUPACK_IMAGE", "")
    if not images or ":" not in image:
        raise ClusterError("run through hack/demo: it builds the image and the node's images")
    # The GPU nodes are tainted, as GPU Operator clusters' often are: gpupack's own pods
    # go to the real node, the samples (which tolerate the taint) to the GPU nodes.
    cluster = LocalCluster(workdir, detach=True, real_node=True, node_images=images, gpu_taint=True)
    try:
        cluster.start()
        started = time.monotonic()
        tag = image.rsplit(":", 1)[1]
        log(f"helm install gpupack charts/gpupack --set image.tag={tag}")
        cluster.tool("helm", "install", "gpupack", str(REPO / "charts" / "gpupack"),
                     f"--namespace={SYSTEM_NAMESPACE}", "--create-namespace", "--wait",
                     "--timeout=5m", f"--set=image.tag={tag}")  # fmt: skip
        log(f"gpupack installed and ready in {time.monotonic() - started:.1f} s")
        assigner = Process(
            "gpu-assigner",
            [
                sys.executable,
                "-m",
                "hack.localcluster",
                "assign-gpus",
                f"--kubeconfig={cluster.kubeconfig}",
                # The chart's exporter ServiceAccount, whose RBAC helm installed, as each
                # node's agent holds it (a token bound to the node).
                f"--node-agent={SYSTEM_NAMESPACE}/{EXPORTER_NAME}",
            ],
            workdir / "logs" / "gpu-assigner.log",
        )
        assigner.start({**os.environ, "PYTHONPATH": str(REPO)}, detach=True)
        cluster.processes["gpu-assigner"] = assigner
        cluster.write_state()
        for manifest in MANIFESTS:
            log(f"kubectl apply -f {manifest.relative_to(REPO)}")
            cluster.tool("kubectl", "apply", "-f", str(manifest))
        wait_settled(cluster.kube(), expected_pods=9 + 2 + 1 + 1 + 1 + 4 + 3 + 1)
        time.sleep(1)  # let the last audit lines land
        report(cluster)
    except BaseException:
        cluster.stop()
        raise
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/demo", description=__doc__)
    parser.add_argument("action", nargs="?", choices=("start", "stop", "status"), default="start")
    parser.add_argument("--workdir", type=Path, default=WORKDIR)
    args = parser.parse_args(argv)
    if args.action == "stop":
        stopped = LocalCluster.stop_from_state(args.workdir)
        print(f"stopped: {', '.join(stopped)}" if stopped else "no demo cluster is running")
        return 0
    if args.action == "status":
        state = args.workdir / "state.json"
        print(state.read_text() if state.exists() else "no demo cluster is running")
        return 0
    try:
        return start(args.workdir)
    except ClusterError as exc:
        print(f"hack/demo: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
