"""The capacity pod's manifest: a pod that holds one GPU for the shares placed on it, and
where it may land.

The scheduler alone creates capacity pods (`scheduler.capacity_pods`), for the pods its
waiting room holds (`scheduler.waiting`, `scheduler.lifecycle`). A capacity pod inherits
the workload's scheduling metadata, so kube-scheduler (gpupack's capacity profile) puts
it where the workload may run, and `Where` narrows that to where the pods it is made for
could then run: required, it never lands (nor makes an autoscaler add a node) where they
could not use it; preferred, it fills nodes that already hold GPUs. An MPS pool's
capacity pod runs its GPU's MPS control daemon instead of pause. The names, labels and
annotations other components read are the contract's (`gpupack.capacity`).
"""

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gpupack import keys, mps
from gpupack.capacity import (
    CONTAINER_NAME,
    CREATED_FOR,
    DEFAULT_IMAGE,
    PLACEMENT,
    SHARING,
    capacity_name,
)
from gpupack.objects import JSON, selects
from gpupack.pool import is_mps

MANAGED_BY: Final = "app.kubernetes.io/managed-by"
COMPONENT: Final = "app.kubernetes.io/component"
PAUSE_USER: Final = 65535  # the pause image's nobody user
HOSTNAME: Final = "kubernetes.io/hostname"
INHERITED: Final = (
    "nodeSelector",
    "affinity",
    "tolerations",
    "priorityClassName",
    "runtimeClassName",
)
STEER_WEIGHT: Final = 100  # towards a node the waiting pod may go to
PACK_WEIGHT: Final = 50  # towards a node that already holds capacity pods
MAX_NODES: Final = 1000  # node names in one term; more is a huge pod, not a better one


@dataclass(frozen=True, slots=True)
class Where:
    """Where a new capacity pod may go (required) and should go (preferred).

    - `avoid` (required): the existing nodes where the pods it is made for may not run, by
      any of their rules (kube-scheduler found them infeasible), or whose GPUs are too
      small for what they ask. A GPU there would be
      wasted, so the capacity pod may go to any other node, including one an autoscaler
      adds.
    - `near` (required): the pods' required pod-affinity terms, with their namespaces
      pinned: a pod that must sit next to another is helped only by a GPU next to it,
      and an autoscaler must not add a node for it that the pod could not use.
    - `steer` (preferred, weight 100): the nodes the pods may go to.
    - `packed` (preferred, weight 50): the nodes already holding capacity pods.

    `key` is what the requirements say, as a short stable digest, made once: waiting pods
    with equal keys can use the same new GPUs, others cannot. Empty for no requirement
    at all (the preferences do not change where a GPU may land).
    """

    steer: tuple[str, ...] = ()
    packed: tuple[str, ...] = ()
    avoid: tuple[str, ...] = ()
    near: tuple[JSON, ...] = ()
    key: str = field(default="", init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.avoid or self.near:
            text = json.dumps([sorted(self.avoid), list(self.near)], sort_keys=True)
            object.__setattr__(self, "key", hashlib.sha256(text.encode()).hexdigest()[:16])


ANYWHERE: Final = Where()  # no requirement, no preference


def holding_nodes(pods: Iterable[JSON]) -> list[str]:
    """The nodes these capacity pods are on, sorted: where a new GPU packs best."""
    return sorted(
        {str(p["spec"]["nodeName"]) for p in pods if (p.get("spec") or {}).get("nodeName")}
    )


def affinity_to_others(pod: JSON) -> tuple[JSON, ...]:
    """The pod's required pod-affinity terms that a capacity pod carries (`Where.near`):
    the terms that do not select the pod itself (a pod that must sit with its own
    replicas may start anywhere when none runs yet, and `Where.avoid` already keeps its
    GPU on the nodes where they run), with `namespaces` pinned to the pod's own when the term
    names none (a capacity pod lives in another namespace). `matchLabelKeys` is merged
    into the selector by the API server when the pod is created, so it is dropped."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("podAffinity") or {}
    terms: list[JSON] = []
    for term in affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or ():
        scoped = term.get("namespaces") or term.get("namespaceSelector") is not None
        # A namespaceSelector may select the pod's own namespace: read as "it does", so a
        # term that could be the pod's own is never carried (carried, it could leave the
        # first replica's capacity pod nowhere to go).
        in_scope = namespace in term["namespaces"] if term.get("namespaces") else True
        if in_scope and selects(term.get("labelSelector"), labels):
            continue
        carried = {
            k: copy.deepcopy(v)
            for k, v in term.items()
            if k not in ("matchLabelKeys", "mismatchLabelKeys")
        }
        if not scoped:
            carried["namespaces"] = [namespace]
        terms.append(carried)
    return tuple(terms)


def _placement(where: Where) -> dict[str, str]:
    """The `PLACEMENT` annotation of a capacity pod made with `where`: none without
    requirements (read as the empty key)."""
    return {PLACEMENT: where.key} if where.key else {}


def _prefer(spec: JSON, steer: Sequence[str], packed: Sequence[str]) -> None:
    """Add the placement preferences to a capacity pod's spec (see `Where`), all as
    node affinity: kube-scheduler normalises each plugin's scores, so preferences in two
    plugins tie at their maxima, and an existing capacity pod's pod affinity would pull
    every new one towards its node, even where the waiting pod may not go. In one plugin
    the weights add: a node of `steer` (100) beats one merely in `packed` (50), and one in
    both (150) wins."""
    terms = [(STEER_WEIGHT, steer), (PACK_WEIGHT, packed)]
    preferred = [
        {
            "weight": weight,
            "preference": {
                "matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": sorted(nodes)}]
            },
        }
        for weight, nodes in terms
        if nodes and len(nodes) <= MAX_NODES
    ]
    if preferred:
        node = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
        node.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).extend(preferred)


def _require(
    spec: JSON, avoid: Sequence[str], near: Sequence[JSON], labels: Mapping[str, str] | None
) -> None:
    """Add the requirements of `Where` to a capacity pod's spec: `avoid` as a NotIn in
    every required node-selector term (terms are ORed, so each needs it), `near` as
    required pod affinity. The nodes are named by `kubernetes.io/hostname` when `labels`
    is None, else by their `gpupack.io/node` label, whose value `labels` gives for each
    (Karpenter ignores every pod that names the hostname in a required term). More
    than `MAX_NODES` names to avoid is left to the preferences (and to scale-down, which
    releases a GPU no waiting pod can use)."""
    if labels is None:
        key, values = HOSTNAME, sorted(avoid)
    else:  # a node with no label is gone: it takes no pod
        key, values = keys.NODE, sorted({labels[name] for name in avoid if name in labels})
    if values and len(avoid) <= MAX_NODES:
        expression = {"key": key, "operator": "NotIn", "values": values}
        node = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
        required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        terms = required.setdefault("nodeSelectorTerms", [])
        if not terms:
            terms.append({})
        for term in terms:
            term.setdefault("matchExpressions", []).append(copy.deepcopy(expression))
    if near:
        pod_affinity = spec.setdefault("affinity", {}).setdefault("podAffinity", {})
        pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).extend(
            copy.deepcopy(list(near))
        )


def capacity_pod(
    pool: str,
    scheduling: JSON,
    *,
    index: int,
    created_for: str,
    image: str = DEFAULT_IMAGE,
    mps_image: str | None = None,
    namespace: str = keys.SYSTEM_NAMESPACE,
    where: Where = ANYWHERE,
    node_labels: Mapping[str, str] | None = None,
) -> JSON:
    """The manifest of capacity pod `index` of `pool`: holds one GPU, does nothing else,
    or, for an MPS pool (`gpupack.pool.is_mps`), runs the GPU's MPS control daemon
    (`mps_daemon_container`, in `mps_image`, gpupack's own).

    It inherits the workload's scheduling metadata (nodeSelector, node affinity,
    tolerations, priorityClassName, runtimeClassName) so kube-scheduler puts it where the
    workload may run, and `where` narrows that to where the pods it is made for could
    then run (`Where`): required, it never lands (nor makes an autoscaler add a node)
    where those pods could not use it; preferred, it fills nodes that already hold GPUs.
    No owner reference: owners cannot cross namespaces.
    """
    one_gpu = {keys.NVIDIA_GPU: "1"}
    daemon = is_mps(scheduling)
    if daemon and not mps_image:
        raise ValueError("an MPS pool's capacity pod needs an image with gpupack-mps-daemon")
    container: JSON = {
        "name": CONTAINER_NAME,
        "image": image,
        "resources": {
            "limits": dict(one_gpu),
            "requests": {**one_gpu, "cpu": "1m", "memory": "8Mi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": PAUSE_USER,
            "runAsGroup": PAUSE_USER,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    spec: JSON = {
        "schedulerName": keys.CAPACITY_SCHEDULER_NAME,
        "containers": [container],
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        **{k: copy.deepcopy(v) for k, v in scheduling.items() if k in INHERITED},
    }
    labels = {
        keys.ROLE: keys.ROLE_CAPACITY,
        keys.POOL: pool,
        MANAGED_BY: "gpupack",
        COMPONENT: "capacity",
    }
    if daemon:
        spec["containers"] = [mps_daemon_container(container, str(mps_image))]
        spec["volumes"] = [mps.volume()]
        labels[SHARING] = mps.SHARING_MPS
    _require(spec, where.avoid, where.near, node_labels)
    _prefer(spec, where.steer, where.packed)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": capacity_name(pool, index),
            "namespace": namespace,
            "labels": labels,
            "annotations": {CREATED_FOR: created_for, **_placement(where)},
        },
        "spec": spec,
    }


DAEMON_USER: Final = 0
# What nvidia-cuda-mps-control needs beyond a plain process: it starts each MPS server
# as the user of the client that asked for it (setuid, setgid), and that server writes
# the shared pipe and log directories it does not own.
DAEMON_CAPABILITIES: Final = ("SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE", "FOWNER")


def mps_daemon_container(holder: JSON, image: str) -> JSON:
    """The capacity container of an MPS pool: it holds the GPU as the pause container does
    and runs `gpupack-mps-daemon`, which supervises the GPU's MPS control daemon.

    The NVIDIA container runtime mounts `nvidia-cuda-mps-control` into the container
    (driver capability `compute`). The daemon runs as root, because MPS starts each
    server as the user of its clients, with only the capabilities that needs; no
    privilege. Ready once the daemon answers on its pipe (`--check`)."""
    check = {"exec": {"command": [mps.DAEMON_COMMAND, "--check"]}}
    return {
        **holder,
        "image": image,
        "command": [mps.DAEMON_COMMAND],
        "env": [
            {"name": keys.ENV_DRIVER_CAPABILITIES, "value": mps.DAEMON_DRIVER_CAPABILITIES},
            *mps.environment(),
        ],
        "volumeMounts": mps.volume_mounts(),
        "resources": {
            "limits": {keys.NVIDIA_GPU: "1"},
            "requests": {keys.NVIDIA_GPU: "1", "cpu": "10m", "memory": "64Mi"},
        },
        "readinessProbe": {**check, "periodSeconds": 10, "timeoutSeconds": 5},
        "livenessProbe": {
            **check,
            "initialDelaySeconds": 30,
            "periodSeconds": 30,
            "timeoutSeconds": 10,
            "failureThreshold": 3,
        },
        "securityContext": {
            "runAsUser": DAEMON_USER,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": list(DAEMON_CAPABILITIES)},
        },
    }
