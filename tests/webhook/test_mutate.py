"""The mutation rules as a table: one row per rule of the webhook's scope and patch."""

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from doubles.pods import TestPod as Pod
from doubles.pods import deployment_pod, gpu_container, namespace, request
from gpupack import keys, seal
from gpupack.codec import read_original_resources
from gpupack.gpu_request import GpuSlot
from gpupack.objects import JSON
from gpupack.recommendation import Recommendation
from webhook.decision import Decision, Demand, Outcome, Reason, stamped
from webhook.mutate import MutationContext, decide

UUID_ENV = {
    "name": "NVIDIA_VISIBLE_DEVICES",
    "valueFrom": {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.annotations['gpupack.io/gpu-uuid']"}
    },
}
FORGED = "GPU-4c2f8f3e-1b2a-4d3c-9e8f-0a1b2c3d4e5f"


def with_meta(pod: Pod, **meta: Any) -> Pod:
    pod = copy.deepcopy(pod)
    for key, value in meta.items():
        if value is None:
            pod["metadata"].pop(key, None)
        else:
            pod["metadata"][key] = value
    return pod


def labelled(pod: Pod, **labels: str) -> Pod:
    return with_meta(pod, labels={**pod["metadata"].get("labels", {}), **labels})


def annotated(pod: Pod, annotations: dict[str, str]) -> Pod:
    return with_meta(pod, annotations=annotations)


def bare_pod(**spec: Any) -> Pod:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "notebook", "namespace": "ml"},
        "spec": {"containers": [gpu_container()], **spec},
    }


def owned_by(kind: str, name: str = "owner") -> Pod:
    pod = deployment_pod()
    pod["metadata"]["labels"] = {"app": "x"}
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": kind, "name": name, "uid": "u", "controller": True}
    ]
    return pod


Check = Callable[[Pod, Decision], object]


@dataclass
class Case:
    pod: Pod
    outcome: Outcome
    reason: Reason
    ns: JSON | None = None
    operation: str = "CREATE"
    checks: list[Check] = field(default_factory=list)


def env_of(pod: Pod, index: int = 0, field_name: str = "containers") -> list[JSON]:
    env: list[JSON] = pod["spec"][field_name][index].get("env", [])
    return env


def has_gpu(pod: Pod) -> bool:
    containers = pod["spec"].get("containers", []) + pod["spec"].get("initContainers", [])
    return any(
        keys.NVIDIA_GPU in (c.get("resources", {}).get(section) or {})
        for c in containers
        for section in ("limits", "requests")
    )


def policy_is(name: str, source_prefix: str = "") -> Check:
    def check(pod: Pod, decision: Decision) -> None:
        assert pod["metadata"]["annotations"][keys.POLICY] == name
        assert decision.policy == name
        assert (decision.policy_source or "").startswith(source_prefix)

    return check


def allocation_is(compute: str, memory: str) -> Check:
    def check(pod: Pod, decision: Decision) -> None:
        annotations = pod["metadata"]["annotations"]
        assert (annotations[keys.GPU_COMPUTE], annotations[keys.GPU_MEMORY]) == (compute, memory)

    return check


def message_has(text: str) -> Check:
    def check(pod: Pod, decision: Decision) -> None:
        assert text in decision.message

    return check


def annotations(pod: Pod) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("annotations") or {})


def unchanged(pod: Pod, decision: Decision) -> None:
    assert decision.patch == ()


def not_forged(pod: Pod, decision: Decision) -> None:
    assert keys.GPU_UUID not in pod["metadata"].get("annotations", {})
    assert keys.CAPACITY_POD not in pod["metadata"].get("annotations", {})
    assert decision.stripped


def env_names_are(names: list[str], index: int = 0, field_name: str = "containers") -> Check:
    def check(pod: Pod, decision: Decision) -> None:
        assert [e["name"] for e in env_of(pod, index, field_name)] == names

    return check


MPS_VOLUME = {"name": "gpupack-mps", "csi": {"driver": "mps.gpupack.io"}}
MPS_MOUNTS = [
    {"name": "gpupack-mps", "mountPath": "/run/gpupack/mps"},
    {"name": "gpupack-mps", "mountPath": "/dev/shm", "subPath": "shm"},
]


def mps_wired(pod: Pod, decision: Decision) -> None:
    assert pod["spec"]["volumes"].count(MPS_VOLUME) == 1
    (container,) = pod["spec"]["containers"]
    for mount in MPS_MOUNTS:
        assert container["volumeMounts"].count(mount) == 1
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpupack/mps/pipe"
    assert env["CUDA_MPS_LOG_DIRECTORY"] == "/run/gpupack/mps/log"


def mps_limits(percentage: str, memory: str) -> Check:
    def check(pod: Pod, decision: Decision) -> None:
        env = {e["name"]: e.get("value") for e in env_of(pod)}
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == percentage
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == memory
        assert pod["metadata"]["annotations"][keys.ENFORCEMENT] == "mps"
        assert decision.demand is not None
        assert decision.demand.exclusive

    return check


ENABLED_NS = namespace({keys.OPTIMIZE: "enabled"})
CASES = [
    # --- scope: admitted unchanged, with a reason ---
    pytest.param(
        Case(
            deployment_pod(containers=[{"name": "c", "image": "x"}]),
            Outcome.SKIPPED,
            Reason.NO_GPU,
            checks=[unchanged],
        ),
        id="no-gpu",
    ),
    pytest.param(
        Case(deployment_pod(containers=[gpu_container(gpus="0")]), Outcome.SKIPPED, Reason.NO_GPU),
        id="zero-gpus",
    ),
    pytest.param(
        Case(
            deployment_pod(containers=[gpu_container(gpus="2")]),
            Outcome.SKIPPED,
            Reason.MULTIPLE_GPUS,
            checks=[message_has("2 GPUs")],
        ),
        id="two-gpus-one-container",
    ),
    pytest.param(
        Case(
            deployment_pod(containers=[gpu_container("a"), gpu_container("b")]),
            Outcome.SKIPPED,
            Reason.MULTIPLE_GPUS,
        ),
        id="one-gpu-in-each-of-two-containers",
    ),
    pytest.param(
        Case(
            deployment_pod(initContainers=[gpu_container("warm")]),
            Outcome.SKIPPED,
            Reason.MULTIPLE_GPUS,
        ),
        id="gpu-in-init-and-main",
    ),
    pytest.param(
        Case(
            deployment_pod(
                containers=[
                    {
                        "name": "c",
                        "image": "x",
                        "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}},
                    }
                ]
            ),
            Outcome.SKIPPED,
            Reason.OTHER_GPU_RESOURCE,
            checks=[message_has("mig-1g.10gb")],
        ),
        id="mig-profile",
    ),
    pytest.param(
        Case(
            deployment_pod(
                containers=[
                    gpu_container(
                        resources={"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpu.shared": 1}}
                    )
                ]
            ),
            Outcome.SKIPPED,
            Reason.OTHER_GPU_RESOURCE,
        ),
        id="gpu-and-shared-gpu",
    ),
    pytest.param(
        Case(
            deployment_pod(
                containers=[
                    {"name": "c", "image": "x", "resources": {"limits": {"amd.com/gpu": 1}}}
                ]
            ),
            Outcome.SKIPPED,
            Reason.OTHER_GPU_RESOURCE,
        ),
        id="amd-gpu",
    ),
    pytest.param(
        Case(
            deployment_pod(containers=[gpu_container(gpus="half")]),
            Outcome.SKIPPED,
            Reason.INVALID_GPU_REQUEST,
            checks=[message_has("containers[0].resources.limits[nvidia.com/gpu]")],
        ),
        id="unparseable-gpu-count",
    ),
    pytest.param(
        Case(
            labelled(deployment_pod(), **{keys.OPTIMIZE: "disabled"}),
            Outcome.SKIPPED,
            Reason.OPTED_OUT,
            ns=ENABLED_NS,
        ),
        id="pod-opted-out-wins-over-namespace",
    ),
    pytest.param(
        Case(
            deployment_pod(),
            Outcome.SKIPPED,
            Reason.OPTED_OUT,
            ns=namespace({keys.OPTIMIZE: "disabled"}),
        ),
        id="namespace-opted-out",
    ),
    pytest.param(
        Case(deployment_pod(), Outcome.SKIPPED, Reason.NOT_OPTED_IN, ns=namespace()),
        id="namespace-not-opted-in",
    ),
    pytest.param(
        Case(
            labelled(deployment_pod(), **{keys.OPTIMIZE: "maybe"}),
            Outcome.SKIPPED,
            Reason.NOT_OPTED_IN,
            checks=[message_has("gpupack.io/optimize")],
        ),
        id="invalid-optimize-label",
    ),
    pytest.param(
        Case(deployment_pod(nodeName="gpu-node-1"), Outcome.SKIPPED, Reason.NODE_NAME_SET),
        id="node-name-preset",
    ),
    pytest.param(
        Case(
            deployment_pod(schedulerName="volcano"),
            Outcome.SKIPPED,
            Reason.OTHER_SCHEDULER,
            checks=[message_has("volcano")],
        ),
        id="other-scheduler",
    ),
    pytest.param(
        Case(deployment_pod(), Outcome.SKIPPED, Reason.NOT_CREATE, operation="UPDATE"),
        id="update-not-handled",
    ),
    pytest.param(
        Case(
            annotated(
                deployment_pod(
                    containers=[{"name": "c", "image": "x"}], schedulerName="gpupack-scheduler"
                ),
                {keys.DECISION: "earlier", keys.SEAL: "v1.1.forged"},
            ),
            Outcome.SKIPPED,
            Reason.NO_GPU,
            checks=[lambda result, _: not ({keys.DECISION, keys.SEAL} & set(annotations(result)))],
        ),
        id="forged-decision-is-stripped",
    ),
    pytest.param(
        Case(
            annotated(
                deployment_pod(containers=[{"name": "c", "image": "x"}]),
                {keys.GPU_UUID: FORGED, keys.CAPACITY_POD: "x"},
            ),
            Outcome.SKIPPED,
            Reason.NO_GPU,
            checks=[not_forged],
        ),
        id="forged-assignment-stripped-on-skipped-pod",
    ),
    # --- scope: taken over ---
    pytest.param(
        Case(
            labelled(deployment_pod(), **{keys.OPTIMIZE: "enabled"}),
            Outcome.MUTATED,
            Reason.MUTATED,
            ns=namespace(),
        ),
        id="pod-opt-in-without-namespace",
    ),
    pytest.param(
        Case(deployment_pod(), Outcome.MUTATED, Reason.MUTATED, ns=ENABLED_NS),
        id="namespace-opt-in",
    ),
    pytest.param(
        Case(deployment_pod(), Outcome.MUTATED, Reason.MUTATED, ns=None),
        id="namespace-unreadable-trusts-selectors",
    ),
    pytest.param(
        Case(
            deployment_pod(schedulerName="default-scheduler"),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[
                lambda p, d: (
                    json.loads(p["metadata"]["annotations"][keys.ORIGINAL_RESOURCES])[
                        "schedulerName"
                    ]
                    == "default-scheduler"
                )
            ],
        ),
        id="default-scheduler-named",
    ),
    pytest.param(
        Case(
            deployment_pod(
                containers=[
                    gpu_container(
                        resources={
                            "requests": {"nvidia.com/gpu": "1"},
                            "limits": {"nvidia.com/gpu": "1"},
                        }
                    )
                ]
            ),
            Outcome.MUTATED,
            Reason.MUTATED,
        ),
        id="gpu-in-limits-and-requests",
    ),
    pytest.param(
        Case(
            deployment_pod(
                containers=[{"name": "sidecar", "image": "x"}],
                initContainers=[gpu_container("warmup")],
            ),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[
                env_names_are(
                    ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"], 0, "initContainers"
                )
            ],
        ),
        id="gpu-in-init-container",
    ),
    pytest.param(
        Case(
            deployment_pod(
                containers=[{"name": "app", "image": "x"}],
                initContainers=[gpu_container("proxy", restartPolicy="Always")],
            ),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[
                env_names_are(
                    ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"], 0, "initContainers"
                )
            ],
        ),
        id="gpu-in-native-sidecar",
    ),
    pytest.param(
        Case(
            deployment_pod(
                containers=[
                    {"name": "log", "image": "x", "env": [{"name": "Z", "value": "1"}]},
                    gpu_container("gpu"),
                ]
            ),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[
                env_names_are(["Z"], 0),
                env_names_are(["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"], 1),
            ],
        ),
        id="only-the-gpu-container-gets-env",
    ),
    pytest.param(
        Case(
            deployment_pod(
                containers=[
                    gpu_container(
                        env=[
                            {"name": "B", "value": "1"},
                            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                            {"name": "A", "value": "2"},
                        ]
                    )
                ]
            ),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[
                env_names_are(["B", "NVIDIA_VISIBLE_DEVICES", "A", "NVIDIA_DRIVER_CAPABILITIES"]),
                lambda p, d: env_of(p)[1] == UUID_ENV or pytest.fail("not replaced"),
            ],
        ),
        id="user-visible-devices-replaced-in-place",
    ),
    pytest.param(
        Case(
            deployment_pod(
                containers=[
                    gpu_container(env=[{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}])
                ]
            ),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[
                lambda p, d: (
                    env_of(p)[0] == {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}
                    or pytest.fail("capabilities changed")
                )
            ],
        ),
        id="user-driver-capabilities-kept",
    ),
    pytest.param(
        Case(with_meta(deployment_pod(), annotations=None), Outcome.MUTATED, Reason.MUTATED),
        id="no-annotations-map",
    ),
    pytest.param(
        Case(
            annotated(deployment_pod(), {"team": "a", "example.com/a~b": "x"}),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[
                lambda p, d: p["metadata"]["annotations"]["team"] == "a" or pytest.fail("lost")
            ],
        ),
        id="existing-annotations-kept",
    ),
    pytest.param(
        Case(
            annotated(deployment_pod(), {keys.GPU_UUID: FORGED, keys.CAPACITY_POD: "cap-1"}),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[not_forged],
        ),
        id="forged-assignment-stripped",
    ),
    # --- policy ---
    pytest.param(
        Case(
            deployment_pod(),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[
                policy_is("near-real-time", "auto: owner kind Deployment"),
                allocation_is("400m", "8Gi"),
            ],
        ),
        id="deployment-near-real-time",
    ),
    pytest.param(
        Case(
            annotated(deployment_pod(), {keys.POLICY: "batch"}),
            Outcome.MUTATED,
            Reason.MUTATED,
            ns=namespace({keys.OPTIMIZE: "enabled"}, {keys.POLICY: "training"}),
            checks=[policy_is("batch", "pod-annotation"), allocation_is("250m", "6Gi")],
        ),
        id="pod-policy-wins-over-namespace",
    ),
    pytest.param(
        Case(
            deployment_pod(),
            Outcome.MUTATED,
            Reason.MUTATED,
            ns=namespace({keys.OPTIMIZE: "enabled"}, {keys.POLICY: "training"}),
            checks=[policy_is("training", "namespace-annotation")],
        ),
        id="namespace-policy",
    ),
    pytest.param(
        Case(
            deployment_pod(),
            Outcome.MUTATED,
            Reason.MUTATED,
            ns=namespace({keys.OPTIMIZE: "enabled"}, {keys.POLICY: "nope"}),
            checks=[
                policy_is("near-real-time", "auto:"),
                lambda p, d: d.warnings or pytest.fail("no warning"),
            ],
        ),
        id="bad-namespace-policy-falls-back-with-warning",
    ),
    pytest.param(
        Case(
            owned_by("Job"),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[policy_is("training", "auto: owner kind Job")],
        ),
        id="job-training",
    ),
    pytest.param(
        Case(
            owned_by("PyTorchJob"), Outcome.MUTATED, Reason.MUTATED, checks=[policy_is("training")]
        ),
        id="pytorchjob-training",
    ),
    pytest.param(
        Case(
            labelled(owned_by("StatefulSet"), **{"notebook-name": "nb"}),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[policy_is("build", "auto: label notebook-name")],
        ),
        id="kubeflow-notebook-build",
    ),
    pytest.param(
        Case(
            labelled(deployment_pod(), **{"serving.kserve.io/inferenceservice": "llm"}),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[policy_is("real-time")],
        ),
        id="kserve-real-time",
    ),
    pytest.param(
        Case(
            labelled(owned_by("RayCluster"), **{"ray.io/originated-from-crd": "RayJob"}),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[policy_is("training")],
        ),
        id="rayjob-training",
    ),
    pytest.param(
        Case(
            labelled(deployment_pod(), **{"app.kubernetes.io/name": "vllm"}),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[policy_is("real-time")],
        ),
        id="vllm-real-time",
    ),
    pytest.param(
        Case(
            bare_pod(),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[policy_is("near-real-time", "auto: no owner")],
        ),
        id="bare-pod-default",
    ),
    pytest.param(
        Case(
            deployment_pod(containers=[gpu_container(image="ghcr.io/org/vllm-openai:v0.6.3")]),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[policy_is("real-time", "auto: model-server image")],
        ),
        id="serving-image-real-time",
    ),
    pytest.param(
        Case(
            deployment_pod(containers=[gpu_container(image="registry.local/vllm-tools/trainer:1")]),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[policy_is("near-real-time")],
        ),
        id="serving-name-in-registry-path-only",
    ),
    pytest.param(
        Case(
            annotated(deployment_pod(), {keys.POLICY: "does-not-exist"}),
            Outcome.DENIED,
            Reason.UNKNOWN_POLICY,
            checks=[message_has("known: batch, build")],
        ),
        id="unknown-policy-denied",
    ),
    pytest.param(
        Case(
            annotated(deployment_pod(), {keys.POLICY: "Bad_Name"}),
            Outcome.DENIED,
            Reason.INVALID_ANNOTATION,
            checks=[message_has("gpupack.io/policy")],
        ),
        id="malformed-policy-denied",
    ),
    # --- allocation ---
    pytest.param(
        Case(
            annotated(deployment_pod(), {keys.GPU_COMPUTE: "0.3", keys.GPU_MEMORY: "12288Mi"}),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[
                allocation_is("300m", "12Gi"),
                lambda p, d: (
                    d.allocation_source == "pinned" or pytest.fail(str(d.allocation_source))
                ),
            ],
        ),
        id="pinned-allocation-canonicalised",
    ),
    pytest.param(
        Case(
            annotated(deployment_pod(), {keys.GPU_COMPUTE: "300m"}),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[allocation_is("300m", "8Gi")],
        ),
        id="pinned-compute-policy-memory",
    ),
    pytest.param(
        Case(
            annotated(deployment_pod(), {keys.GPU_COMPUTE: "1500m"}),
            Outcome.DENIED,
            Reason.INVALID_ANNOTATION,
            checks=[message_has("gpupack.io/gpu-compute"), message_has("accepted:")],
        ),
        id="compute-above-one-gpu-denied",
    ),
    pytest.param(
        Case(
            annotated(deployment_pod(), {keys.GPU_MEMORY: "lots"}),
            Outcome.DENIED,
            Reason.INVALID_ANNOTATION,
            checks=[message_has("gpupack.io/gpu-memory")],
        ),
        id="bad-memory-denied",
    ),
    pytest.param(
        Case(
            annotated(
                deployment_pod(nodeSelector={"nvidia.com/gpu.memory": "16384"}),
                {keys.GPU_MEMORY: "20Gi"},
            ),
            Outcome.DENIED,
            Reason.INVALID_ANNOTATION,
            checks=[message_has("16Gi")],
        ),
        id="pinned-memory-above-selected-gpu-denied",
    ),
    pytest.param(
        Case(
            annotated(deployment_pod(nodeSelector={"nvidia.com/gpu.memory": "4096"}), {}),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[allocation_is("400m", "4Gi")],
        ),
        id="memory-capped-at-selected-gpu",
    ),
    pytest.param(
        Case(
            annotated(
                deployment_pod(),
                {keys.POLICY: "real-time-mps", keys.GPU_COMPUTE: "250m", keys.GPU_MEMORY: "10Gi"},
            ),
            Outcome.MUTATED,
            Reason.MUTATED,
            checks=[mps_limits("25", "0=10240M"), mps_wired],
        ),
        id="mps-limits",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_mutation_rules(case: Case) -> None:
    original = copy.deepcopy(case.pod)
    decision = decide(
        request(case.pod, operation=case.operation), MutationContext(namespace=case.ns)
    )
    assert (decision.outcome, decision.reason) == (case.outcome, case.reason), decision.message
    assert case.pod == original, "decide() must not modify its input"
    result: Pod = jsonpatch.apply_patch(case.pod, list(decision.patch))
    if decision.outcome is Outcome.MUTATED:
        assert not has_gpu(result)
        assert result["spec"]["schedulerName"] == keys.SCHEDULER_NAME
        annotations = result["metadata"]["annotations"]
        assert annotations[keys.DECISION] == "req-1"
        assert read_original_resources(annotations) is not None
        assert UUID_ENV in [
            e
            for c in result["spec"].get("containers", []) + result["spec"].get("initContainers", [])
            for e in c.get("env", [])
        ]
        assert decision.demand is not None
        assert decision.compute is not None
        assert decision.compute <= 1000
    elif decision.outcome is Outcome.DENIED:
        assert decision.patch == ()
    for check in case.checks:
        assert check(result, decision) is not False


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if isinstance(c.values[0], Case) and c.values[0].outcome is Outcome.MUTATED],
)
def test_running_on_its_own_output_changes_nothing(case: Case) -> None:
    first = decide(request(case.pod), MutationContext(namespace=case.ns))
    mutated: Pod = jsonpatch.apply_patch(case.pod, list(first.patch))
    again = decide(request(mutated, uid="req-2"), MutationContext(namespace=case.ns))
    assert (again.reason, again.patch) == (Reason.ALREADY_MUTATED, ())


def test_patch_is_deterministic_and_minimal() -> None:
    pod = deployment_pod()
    first = decide(request(pod), MutationContext())
    second = decide(request(pod), MutationContext())
    assert first.patch == second.patch
    paths = [op["path"] for op in first.patch]
    assert paths == [
        "/spec/containers/0/resources/limits/nvidia.com~1gpu",
        "/spec/containers/0/resources/limits/gpupack.io~1gpu-compute-milli",
        "/spec/containers/0/resources/limits/gpupack.io~1gpu-memory",
        "/spec/containers/0/resources/requests",
        "/spec/tolerations",
        "/spec/schedulerName",
        "/metadata/annotations",
        "/spec/containers/0/env",
    ]


CHARGED_TOLERATIONS = [
    {"key": keys.RESOURCE_COMPUTE, "operator": "Exists", "effect": "NoSchedule"},
    {"key": keys.RESOURCE_MEMORY, "operator": "Exists", "effect": "NoSchedule"},
]
GPU_TAINT = {"key": keys.NVIDIA_GPU, "operator": "Exists", "effect": "NoSchedule"}


def extended_resource_toleration(spec: JSON) -> list[JSON]:
    """What the API server's ExtendedResourceToleration leaves as the pod's tolerations:
    for each extended resource a container asks (sorted by name), `<name> Exists
    NoSchedule` appended unless a toleration with that key, operator, value and effect is
    there (Kubernetes' AddOrUpdateTolerationInPod)."""
    tolerations = list(spec.get("tolerations") or [])
    names = sorted(
        {
            name
            for field_name in ("containers", "initContainers")
            for c in spec.get(field_name) or []
            for name in (c.get("resources") or {}).get("requests") or {}
            if "/" in name and not name.startswith("kubernetes.io/")
        }
    )
    for name in names:
        wanted = {"key": name, "operator": "Exists", "effect": "NoSchedule"}
        fields_ = ("key", "operator", "value", "effect")
        if not any(all(t.get(k, "") == wanted.get(k, "") for k in fields_) for t in tolerations):
            tolerations.append(wanted)
    return tolerations


@pytest.mark.parametrize(
    "tolerations",
    [
        pytest.param(None, id="none"),
        pytest.param([GPU_TAINT], id="the-gpu-taints-added-before-the-webhook"),
        pytest.param([GPU_TAINT, CHARGED_TOLERATIONS[1]], id="one-charged-one-already"),
        pytest.param([{**CHARGED_TOLERATIONS[0], "value": ""}], id="an-equal-one-with-empty-value"),
        pytest.param([{"operator": "Exists"}], id="tolerates-everything"),
    ],
)
def test_the_rewritten_pod_tolerates_its_charges_so_the_plugins_second_run_changes_nothing(
    tolerations: list[JSON] | None,
) -> None:
    """Where the API server runs ExtendedResourceToleration it runs again after the
    webhook; had the pod changed then, the API server would call the webhook again."""
    pod = deployment_pod() if tolerations is None else deployment_pod(tolerations=tolerations)
    decision = decide(request(pod), MutationContext())
    stored = jsonpatch.apply_patch(pod, list(decision.patch))
    assert extended_resource_toleration(stored["spec"]) == stored["spec"]["tolerations"]
    matched = [
        [t.get(k, "") for k in ("key", "operator", "value", "effect")]
        for t in stored["spec"]["tolerations"]
    ]
    for toleration in CHARGED_TOLERATIONS:
        assert matched.count([toleration["key"], "Exists", "", "NoSchedule"]) == 1, matched
    assert stored["spec"]["tolerations"][: len(tolerations or [])] == (tolerations or [])


def test_a_pod_charged_nothing_gets_no_tolerations() -> None:
    container = gpu_container()
    container["resources"]["limits"][keys.NVIDIA_GPU] = "0"
    pod = deployment_pod(containers=[container])
    decision = decide(request(pod), MutationContext())
    assert not [op for op in decision.patch if op["path"].startswith("/spec/tolerations")]


def test_keys_needing_json_pointer_escapes() -> None:
    pod = annotated(deployment_pod(), {"a/b~c": "1", keys.GPU_UUID: FORGED})
    decision = decide(request(pod), MutationContext())
    paths = [op["path"] for op in decision.patch]
    assert "/metadata/annotations/gpupack.io~1gpu-uuid" in paths
    assert "/metadata/annotations/gpupack.io~1policy" in paths
    result = jsonpatch.apply_patch(pod, list(decision.patch))
    assert result["metadata"]["annotations"]["a/b~c"] == "1"


def test_only_gpu_entries_are_removed() -> None:
    pod = deployment_pod()
    result = jsonpatch.apply_patch(pod, list(decide(request(pod), MutationContext()).patch))
    assert result["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "2",
        "memory": "8Gi",
        keys.RESOURCE_COMPUTE: "400",
        keys.RESOURCE_MEMORY: "8Gi",
    }
    untouched = ("restartPolicy", "terminationGracePeriodSeconds")
    assert {k: result["spec"][k] for k in untouched} == {k: pod["spec"][k] for k in untouched}
    assert result["metadata"]["labels"] == pod["metadata"]["labels"]


def test_demand_carries_pool_and_workload() -> None:
    pod = deployment_pod(nodeSelector={"pool": "a100"})
    decision = decide(request(pod), MutationContext())
    assert decision.demand is not None
    assert decision.demand.workload == "Deployment/llm"
    # this install runs no memory shim: the pool is one of unenforced shares
    assert decision.demand.scheduling == {"nodeSelector": {"pool": "a100"}, "memory": "unenforced"}
    assert (decision.owner_kind, decision.owner_name) == ("Deployment", "llm")


def test_dry_run_gets_the_same_patch() -> None:
    pod = deployment_pod()
    wet = decide(request(pod), MutationContext())
    dry = decide(request(pod, dry_run=True), MutationContext())
    assert wet.patch == dry.patch


def test_annotation_ops_come_in_sorted_key_order() -> None:
    pod = annotated(deployment_pod(), {"team": "a"})
    decision = decide(request(pod), MutationContext())
    paths = [op["path"] for op in decision.patch if op["path"].startswith("/metadata/annotations/")]
    assert paths == sorted(paths)
    assert len(paths) == 7  # decision, enforcement, compute, memory, original, policy, seal


def mutate_once(pod: Pod, ctx: MutationContext) -> Pod:
    decision = decide(request(pod), ctx)
    assert decision.outcome is Outcome.MUTATED, decision.message
    result: Pod = jsonpatch.apply_patch(pod, list(decision.patch))
    return result


def test_a_forged_decision_on_a_gpu_pod_is_replaced_by_a_sealed_one() -> None:
    forged = annotated(
        deployment_pod(schedulerName="gpupack-scheduler"),
        {keys.DECISION: "forged", keys.SEAL: "v1.1.AAAA", keys.ENFORCEMENT: "accounting"},
    )
    ctx = MutationContext(key=b"k" * 32, now=1_800_000_000)
    result = mutate_once(forged, ctx)
    got = annotations(result)
    assert got[keys.DECISION] == "req-1"
    assert seal.verify(b"k" * 32, "ml", got) == 1_800_000_000


def test_the_seal_verifies_only_with_the_key_namespace_and_annotations_it_was_made_for() -> None:
    ctx = MutationContext(key=b"k" * 32, now=1_800_000_000)
    got = annotations(mutate_once(deployment_pod(), ctx))
    seal.verify(b"k" * 32, "ml", got)
    for key, ns, changed in [
        (b"x" * 32, "ml", {}),
        (b"k" * 32, "other-team", {}),
        (b"k" * 32, "ml", {keys.GPU_COMPUTE: "1m"}),
        (b"k" * 32, "ml", {keys.GPU_MEMORY: "1Mi"}),
        (b"k" * 32, "ml", {keys.ENFORCEMENT: "mps"}),
    ]:
        with pytest.raises(seal.SealError):
            seal.verify(key, ns, {**got, **changed})


def test_reinvocation_is_recognised_only_while_the_seal_is_fresh() -> None:
    ctx = MutationContext(key=b"k" * 32, now=1_800_000_000)
    mutated = mutate_once(deployment_pod(), ctx)
    fresh = MutationContext(key=b"k" * 32, now=1_800_000_000 + seal.REINVOCATION)
    assert decide(request(mutated, uid="req-2"), fresh).reason is Reason.ALREADY_MUTATED
    # A seal of another key is no seal of ours: stripped with the user's values.
    other_key = MutationContext(key=b"o" * 32, now=1_800_000_000)
    again = decide(request(mutated, uid="req-4"), other_key)
    assert again.reason is Reason.NO_GPU
    stripped = annotations(jsonpatch.apply_patch(mutated, list(again.patch)))
    assert keys.SEAL not in stripped
    assert keys.DECISION not in stripped


@pytest.mark.parametrize("skew", [seal.REINVOCATION + 1, -(seal.REINVOCATION + 1), 3600])
def test_a_seal_of_ours_from_too_far_away_in_time_is_denied_naming_copies_and_clocks(
    skew: int,
) -> None:
    """A seal older than 5 minutes (copied from another pod, or from a replica keeping
    its node's time) was once stripped, leaving a pod gpupack-scheduler never places; it
    is now denied with a reason to act on."""
    ctx = MutationContext(key=b"k" * 32, now=1_800_000_000)
    mutated = mutate_once(deployment_pod(), ctx)
    skewed = MutationContext(key=b"k" * 32, now=1_800_000_000 + skew)

    again = decide(request(mutated, uid="req-3"), skewed)

    assert (again.outcome, again.reason) == (Outcome.DENIED, Reason.STALE_SEAL)
    assert "copied from another pod" in again.message
    assert "time sync" in again.message


def test_the_share_is_charged_as_quota_resources_on_the_gpu_container() -> None:
    pod = annotated(deployment_pod(), {keys.GPU_COMPUTE: "250m", keys.GPU_MEMORY: "3Gi"})
    result = mutate_once(pod, MutationContext())
    resources = result["spec"]["containers"][0]["resources"]
    for section in ("limits", "requests"):
        assert resources[section][keys.RESOURCE_COMPUTE] == "250"
        assert resources[section][keys.RESOURCE_MEMORY] == "3Gi"
        assert keys.NVIDIA_GPU not in resources[section]


def mps_pod(**spec: Any) -> Pod:
    pod = annotated(deployment_pod(), {keys.POLICY: "real-time-mps"})
    pod["spec"].update(spec)
    return pod


def test_an_mps_pod_keeps_its_volumes_and_mounts_beside_the_mps_wiring() -> None:
    pod = mps_pod(volumes=[{"name": "model", "emptyDir": {}}])
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "model", "mountPath": "/model"}]
    decision = decide(request(pod), MutationContext())
    result: Pod = jsonpatch.apply_patch(pod, list(decision.patch))

    assert result["spec"]["volumes"] == [{"name": "model", "emptyDir": {}}, MPS_VOLUME]
    mounts = result["spec"]["containers"][0]["volumeMounts"]
    assert mounts == [{"name": "model", "mountPath": "/model"}, *MPS_MOUNTS]
    assert decision.warnings == ()
    kubernetes_validate.validate(result, "1.34", strict=True)


def test_an_mps_pods_own_dev_shm_gives_way_to_the_servers_and_the_decision_says_so() -> None:
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
    pod = mps_pod(volumes=[shm])
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    decision = decide(request(pod), MutationContext())
    result: Pod = jsonpatch.apply_patch(pod, list(decision.patch))

    assert result["spec"]["containers"][0]["volumeMounts"] == MPS_MOUNTS
    assert result["spec"]["volumes"] == [shm, MPS_VOLUME]  # unused now, but not lost
    (warning,) = decision.warnings
    assert "'dshm' is no longer mounted at /dev/shm" in warning
    kubernetes_validate.validate(result, "1.34", strict=True)


def test_a_pod_of_another_policy_gets_no_mps_wiring() -> None:
    pod = annotated(deployment_pod(), {keys.POLICY: "real-time"})
    result: Pod = jsonpatch.apply_patch(pod, list(decide(request(pod), MutationContext()).patch))
    assert "volumes" not in result["spec"]
    assert not any(e["name"].startswith("CUDA_MPS") for e in env_of(result))


def test_an_mps_pods_gpu_init_container_is_wired_too() -> None:
    pod = mps_pod()
    pod["spec"]["initContainers"] = [pod["spec"]["containers"][0]]
    pod["spec"]["containers"] = [{"name": "sidecar", "image": "busybox"}]
    decision = decide(request(pod), MutationContext())
    result: Pod = jsonpatch.apply_patch(pod, list(decision.patch))
    assert result["spec"]["initContainers"][0]["volumeMounts"] == MPS_MOUNTS
    assert "volumeMounts" not in result["spec"]["containers"][0]


def test_with_mps_turned_off_an_mps_pod_keeps_its_whole_gpu_and_the_audit_says_why() -> None:
    pod = mps_pod()
    decision = decide(request(pod), MutationContext(mps=False))
    assert (decision.outcome, decision.reason) == (Outcome.SKIPPED, Reason.MPS_OFF)
    assert "mps.enabled" in decision.message
    result: Pod = jsonpatch.apply_patch(pod, list(decision.patch))
    assert has_gpu(result)
    # Other policies are shared as ever.
    plain = annotated(deployment_pod(), {keys.POLICY: "real-time"})
    assert decide(request(plain), MutationContext(mps=False)).outcome is Outcome.MUTATED


def test_stamping_carries_every_field_it_does_not_set() -> None:
    """`stamped` builds the Decision directly; it must equal `dataclasses.replace`."""
    demand = Demand("uid", "pool", {"nodeSelector": {}}, 300, 2**30, "ns", "Deployment/w", True)
    full = Decision(
        Outcome.MUTATED,
        Reason.MUTATED,
        "message",
        patch=({"op": "add", "path": "/a", "value": 1},),
        annotations={"a": "b"},
        policy="batch",
        policy_source="pod-annotation",
        policy_origin="GPUPolicy",
        compute=300,
        memory=2**30,
        allocation_source="pinned",
        recommendation=Recommendation("ns", "Deployment", "w", "batch", 200, 2**29, 0.9, "t", "r"),
        gpu_request={"container": "c"},
        owner_kind="Deployment",
        owner_name="w",
        stripped=("gpupack.io/gpu-uuid",),
        warnings=("careful",),
        demand=demand,
        slots=(GpuSlot("containers", 0, "c", 1, ("limits",)),),
    )
    assert all(getattr(full, f.name) != f.default for f in fields(Decision))
    changes: dict[str, Any] = {
        "patch": ({"op": "remove", "path": "/b"},),
        "annotations": {"c": "d"},
        "demand": None,
        "warnings": ("other",),
    }

    assert stamped(full, **changes) == replace(full, **changes)
