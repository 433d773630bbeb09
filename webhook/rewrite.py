"""The patch of a rewritten pod: the JSONPatch operations that make it gpupack's.

Pure, over the pod as the API server sent it. `build_patch` removes `nvidia.com/gpu`
(keeping the original in `gpupack.io/original-resources`), charges each GPU container its
share as extended resources (so ResourceQuotas bind) and tolerates them as the API
server's `ExtendedResourceToleration` would (`charged_tolerations`), sets `schedulerName`,
writes the share's annotations and the GPU container's environment (`gpu_env`: its GPU by the
annotation the scheduler writes, MPS limits, the shim's limit), and removes user-written
values of gpupack's own keys (`strip_ops`). `with_identity` adds what each admission
writes on top of a plan shared by a template's pods: the decision id and the seal. What
goes into the patch is decided by `webhook.mutate` and `webhook.share`.
"""

from collections.abc import Iterable, Iterator
from typing import Any, Final, cast

from gpupack import cuda, keys
from gpupack import mps as gpupack_mps
from gpupack.codec import OriginalResources, write_original_resources
from gpupack.gpu_request import GpuScan, GpuSlot
from gpupack.objects import JSON, Container, Pod, PodSpec
from gpupack.policy import Policy, Sharing
from gpupack.pool import CHARGED, charged_toleration
from gpupack.quantity import format_compute, format_memory
from webhook import patch
from webhook.policies import PolicyChoice
from webhook.share import PodShare, enforcement, mps_limits

VISIBLE_DEVICES_FIELD: Final = f"metadata.annotations['{keys.GPU_UUID}']"
# The annotations written per admission, not per plan: the decision id and the seal.
IDENTITY: Final = (keys.DECISION, keys.SEAL)


def with_lists(spec: PodSpec, ops: tuple[JSON, ...]) -> PodSpec:
    """`spec` as `ops` leave it, for ops that set whole lists (`/spec/volumes`,
    `/spec/<containers>/<i>/volumeMounts`, as `webhook.mps` writes them). A copy: the
    request's pod is never changed."""
    out: dict[str, Any] = dict(spec)
    for op in ops:
        tokens = op["path"].split("/")[2:]
        if len(tokens) == 1:
            out[tokens[0]] = op["value"]
        elif len(tokens) == 3:
            field_name, index, key = tokens
            containers = list(out[field_name])
            containers[int(index)] = {**containers[int(index)], key: op["value"]}
            out[field_name] = containers
    return cast(PodSpec, out)


def with_identity(ops: tuple[JSON, ...], decision: str, sealed: str) -> tuple[JSON, ...]:
    """The plan's patch writing the decision id and the seal too, keeping the annotation
    ops in key order: into the annotations map the plan adds when the pod had none (one
    op, as before), else one `add` each around the plan's own (an `add` replaces a
    user's value: the plan stripped these keys by leaving them to it). The plan's ops
    are shared by every admission of its template and are never changed."""
    start = end = -1
    for index, op in enumerate(ops):
        path = op["path"]
        if path.startswith(OURS):
            end = index
            if start < 0:
                start = index
        elif op["op"] == "add" and path in ("/metadata/annotations", "/metadata"):
            value = dict(op["value"])
            inner = value if path != "/metadata" else dict(value["annotations"])
            inner[keys.DECISION], inner[keys.SEAL] = decision, sealed
            if path == "/metadata":
                value["annotations"] = inner
            return (*ops[:index], patch.add(path, value), *ops[index + 1 :])
    first, last = patch.add(DECISION_PATH, decision), patch.add(SEAL_PATH, sealed)
    if start < 0:
        return (*ops, first, last)
    return (*ops[:start], first, *ops[start : end + 1], last, *ops[end + 1 :])


def _annotation(key: str) -> str:
    return patch.pointer("metadata", "annotations", key)


OURS: Final = _annotation("gpupack.io/")  # the pointers of gpupack's annotations start so
DECISION_PATH: Final = _annotation(keys.DECISION)
SEAL_PATH: Final = _annotation(keys.SEAL)


def strip_ops(stripped: Iterable[str]) -> Iterator[JSON]:
    """Remove the annotations `stripped` (user-written values of gpupack's own keys)."""
    return (patch.remove(patch.pointer("metadata", "annotations", k)) for k in stripped)


def _charge_ops(container: Container, slot: GpuSlot, allocation: PodShare) -> list[JSON]:
    """Charge the GPU container its share as the quota's extended resources, in limits and
    requests (an extended resource's request must equal its limit)."""
    charge = {
        keys.RESOURCE_COMPUTE: str(allocation.compute),
        keys.RESOURCE_MEMORY: format_memory(allocation.memory),
    }
    resources = container.get("resources") or {}
    ops: list[JSON] = []
    for section in ("limits", "requests"):
        base = patch.pointer("spec", slot.field, slot.index, "resources", section)
        if isinstance(resources.get(section), dict):
            ops.extend(patch.add(f"{base}/{patch.escape(k)}", v) for k, v in charge.items())
        else:
            ops.append(patch.add(base, dict(charge)))
    return ops


def _matched(toleration: JSON) -> tuple[object, ...]:
    """What the plugin compares to find a pod's toleration equal to the one it would add
    (Kubernetes' `Toleration.MatchToleration`: key, operator, value, effect)."""
    return tuple(toleration.get(k) or "" for k in ("key", "operator", "value", "effect"))


def charged_tolerations(spec: PodSpec) -> list[JSON]:
    """The tolerations of the charged shares, written by the webhook itself: where the API
    server runs ExtendedResourceToleration (managed clusters do), the plugin runs again
    after the webhook rewrote the pod and would add them then, which makes the API server
    call the webhook a second time (`reinvocationPolicy: IfNeeded`) for nothing. Written
    here, the plugin's second run finds them and changes nothing, and the pod carries them
    with or without the plugin. No node has such a taint: they
    do not change where the pod may go (nor its pool, `gpupack.pool`). Appended in the
    plugin's order, each one the pod does not already have."""
    have = {_matched(t) for t in spec.get("tolerations") or () if isinstance(t, dict)}
    missing = [
        charged_toleration(r) for r in CHARGED if (r, "Exists", "", "NoSchedule") not in have
    ]
    if not missing:
        return []
    if spec.get("tolerations") is None:
        return [patch.add("/spec/tolerations", missing)]
    return [patch.add("/spec/tolerations/-", t) for t in missing]


def _env_var(name: str, value: str) -> JSON:
    return {"name": name, "value": value}


def gpu_env(policy: Policy, allocation: PodShare, *, memory: bool = False) -> list[JSON]:
    """Environment for the GPU container, in the order it is written: its GPU, and where
    `memory` holds it to its share, the driver's own memory limit (nodes with driver
    r615 or newer and the container toolkit's memory-limit hook enforce it)."""
    env: list[JSON] = [
        {
            "name": keys.ENV_VISIBLE_DEVICES,
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": VISIBLE_DEVICES_FIELD}},
        },
        _env_var(keys.ENV_DRIVER_CAPABILITIES, keys.DEFAULT_DRIVER_CAPABILITIES),
    ]
    if policy.sharing is Sharing.MPS:
        for name, value in mps_limits(allocation.compute, allocation.memory).items():
            env.append(_env_var(name, value))
        env.extend(gpupack_mps.environment())
    if memory:
        env.extend(cuda.memory_environment(allocation.memory))
    return env


def _env_ops(container: Container, base: str, wanted: list[JSON]) -> list[JSON]:
    """Replace our variables where the user set them (keeping their position), append the
    rest; a user's NVIDIA_DRIVER_CAPABILITIES is kept (they may need graphics or video)."""
    env = container.get("env")
    if not env:
        return [patch.add(f"{base}/env", wanted)]
    ops: list[JSON] = []
    last_index = {str(var.get("name")): i for i, var in enumerate(env) if isinstance(var, dict)}
    for var in wanted:
        index = last_index.get(var["name"])
        if index is None:
            ops.append(patch.add(f"{base}/env/-", var))
        elif var["name"] != keys.ENV_DRIVER_CAPABILITIES and env[index] != var:
            ops.append(patch.replace(f"{base}/env/{index}", var))
    return ops


def _set_annotations(pod: Pod, annotations: dict[str, str], wanted: dict[str, str]) -> list[JSON]:
    meta = pod.get("metadata")
    if meta is None:
        return [patch.add("/metadata", {"annotations": wanted})]
    if "annotations" not in meta or meta.get("annotations") is None:
        return [patch.add("/metadata/annotations", wanted)]
    ops = []
    for key, value in wanted.items():  # built in key order by build_patch: deterministic
        path = patch.pointer("metadata", "annotations", key)
        if key not in annotations:
            ops.append(patch.add(path, value))
        elif annotations[key] != value:
            ops.append(patch.replace(path, value))
    return ops


def build_patch(
    pod: Pod,
    spec: PodSpec,
    annotations: dict[str, str],
    gpus: GpuScan,
    choice: PolicyChoice,
    allocation: PodShare,
    stripped: tuple[str, ...],
    *,
    memory: bool = False,
) -> tuple[dict[str, str], tuple[JSON, ...]]:
    """The annotations a rewrite writes (but `IDENTITY`) and its patch; `memory`: the pod
    is held to its memory share (`memory_enforced`)."""
    ops: list[JSON] = []
    original = OriginalResources(scheduler_name=spec.get("schedulerName"))
    charged = False
    for slot in gpus.slots:
        container = spec[slot.field][slot.index]  # type: ignore[literal-required]
        removed = {}
        for section in slot.where:
            values: dict[str, Any] = container["resources"][section]
            removed[section] = {keys.NVIDIA_GPU: values[keys.NVIDIA_GPU]}
            ops.append(
                patch.remove(
                    patch.pointer(
                        "spec", slot.field, slot.index, "resources", section, keys.NVIDIA_GPU
                    )
                )
            )
        target = original.containers if slot.field == "containers" else original.init_containers
        target[slot.name] = removed
        if slot.count > 0:
            ops.extend(_charge_ops(container, slot, allocation))
            charged = True
    if charged:
        ops.extend(charged_tolerations(spec))
    scheduler_path = "/spec/schedulerName"
    if "schedulerName" in spec:
        if spec["schedulerName"] != keys.SCHEDULER_NAME:
            ops.append(patch.replace(scheduler_path, keys.SCHEDULER_NAME))
    else:
        ops.append(patch.add(scheduler_path, keys.SCHEDULER_NAME))
    wanted = {  # in sorted key order, so the ops come out sorted
        keys.ENFORCEMENT: enforcement(choice.policy, memory=memory),
        keys.GPU_COMPUTE: format_compute(allocation.compute),
        keys.GPU_MEMORY: format_memory(allocation.memory),
        keys.ORIGINAL_RESOURCES: write_original_resources(original),
        keys.POLICY: choice.policy.name,
    }
    # A stripped key we write anyway (here or in `stamp`) is replaced (`add` of an
    # existing member), not removed.
    kept = {k: v for k, v in annotations.items() if k not in stripped}
    ops.extend(strip_ops(k for k in stripped if k not in wanted and k not in IDENTITY))
    ops.extend(_set_annotations(pod, kept, wanted))
    env = gpu_env(choice.policy, allocation, memory=memory)
    for slot in gpus.slots:
        if slot.count > 0:
            container = spec[slot.field][slot.index]  # type: ignore[literal-required]
            ops.extend(_env_ops(container, patch.pointer("spec", slot.field, slot.index), env))
    return wanted, tuple(ops)
