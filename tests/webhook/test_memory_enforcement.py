"""Memory enforcement at admission: who decides it (install, policy, pod), what the pod
gets (the shim's CSI volume and preload, the driver's limit), and what it keeps."""

from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from doubles.pods import TestPod as Pod
from doubles.pods import deployment_pod, request
from gpupack import keys
from gpupack.policy import (
    BUILTIN,
    MemoryEnforcement,
    Policy,
    effective_policies,
    policy_from_object,
)
from gpupack.shares import pool_of
from webhook.decision import Decision, Outcome, Reason
from webhook.mutate import MutationContext, decide

ON = MutationContext(memory_enforcement=True)
VOLUME = {"name": "gpupack-cuda", "csi": {"driver": "cuda.gpupack.io"}}
MOUNTS = [
    {"name": "gpupack-cuda", "mountPath": "/run/gpupack/cuda", "readOnly": True},
    {"name": "gpupack-cuda", "mountPath": "/run/gpupack/cuda/budget", "subPath": "budget"},
    {"name": "gpupack-cuda", "mountPath": "/etc/ld.so.preload", "subPath": "ld.so.preload",
     "readOnly": True},
]  # fmt: skip
DIRECTORY = {"name": "GPUPACK_CUDA_DIR", "value": "/run/gpupack/cuda"}


def pod_with(annotations: dict[str, str] | None = None, **spec: Any) -> Pod:
    pod = deployment_pod()
    pod["metadata"]["annotations"] = {keys.POLICY: "real-time", **(annotations or {})}
    pod["spec"].update(spec)
    return pod


def admitted(pod: Pod, ctx: MutationContext = ON) -> tuple[Decision, Pod]:
    decision = decide(request(pod), ctx)
    assert decision.outcome is Outcome.MUTATED, decision.message
    result: Pod = jsonpatch.apply_patch(pod, list(decision.patch))
    kubernetes_validate.validate(result, "1.34", strict=True)
    return decision, result


def env(pod: Pod, index: int = 0) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][index].get("env", [])}


def test_a_shared_pod_gets_the_shim_its_limit_and_says_so() -> None:
    decision, result = admitted(pod_with({keys.GPU_MEMORY: "10Gi"}))
    assert result["metadata"]["annotations"][keys.ENFORCEMENT] == "memory"
    assert result["spec"]["volumes"] == [VOLUME]
    assert result["spec"]["containers"][0]["volumeMounts"] == MOUNTS
    assert env(result)["NVIDIA_GPU_MEMORY_LIMIT"] == "10240"  # MiB, the toolkit's unit
    assert env(result)["NVIDIA_GPU_MEMORY_REQUEST"] == "10240"
    assert env(result)["GPUPACK_CUDA_DIR"] == "/run/gpupack/cuda"
    assert "enforcement memory" in decision.message


def test_without_the_installs_driver_a_pod_is_accounting_only() -> None:
    decision, result = admitted(pod_with(), MutationContext(memory_enforcement=False))
    assert result["metadata"]["annotations"][keys.ENFORCEMENT] == "accounting"
    assert "volumes" not in result["spec"]
    assert "NVIDIA_GPU_MEMORY_LIMIT" not in env(result)
    assert decision.warnings == ()


def test_a_pod_may_not_opt_out_where_its_policy_does_not_allow_it() -> None:
    decision = decide(request(pod_with({keys.MEMORY_ENFORCEMENT: "off"})), ON)
    assert (decision.outcome, decision.reason) == (Outcome.DENIED, Reason.OPT_OUT_FORBIDDEN)
    assert "allowMemoryEnforcementOptOut" in decision.message
    assert "policy real-time" in decision.message


def test_a_pod_opts_out_where_its_policy_allows_it_and_the_audit_says_so() -> None:
    policies = effective_policies([policy_object(None, opt_out=True)])
    ctx = MutationContext(policy_set=policies, memory_enforcement=True)
    decision, result = admitted(
        pod_with({keys.POLICY: "custom", keys.MEMORY_ENFORCEMENT: "off"}), ctx
    )
    assert result["metadata"]["annotations"][keys.ENFORCEMENT] == "accounting"
    assert "volumes" not in result["spec"]
    assert "NVIDIA_GPU_MEMORY_LIMIT" not in env(result)
    assert any("memory enforcement off" in w for w in decision.warnings)


def test_enforced_and_unenforced_pods_never_share_a_pool() -> None:
    allowed = effective_policies([policy_object(None, opt_out=True)])
    ctx = MutationContext(policy_set=allowed, memory_enforcement=True)
    enforced, _ = admitted(pod_with({keys.POLICY: "custom"}), ctx)
    unenforced, stored = admitted(
        pod_with({keys.POLICY: "custom", keys.MEMORY_ENFORCEMENT: "off"}), ctx
    )
    assert enforced.demand is not None
    assert unenforced.demand is not None
    assert enforced.demand.pool != unenforced.demand.pool
    assert unenforced.demand.pool == pool_of(stored)  # the scheduler keys it the same way


def test_a_pod_asking_for_it_where_the_install_lacks_it_is_told() -> None:
    ctx = MutationContext(memory_enforcement=False)
    decision, result = admitted(pod_with({keys.MEMORY_ENFORCEMENT: "on"}), ctx)
    assert result["metadata"]["annotations"][keys.ENFORCEMENT] == "accounting"
    assert any("memoryEnforcement.enabled" in w for w in decision.warnings)


def test_a_bad_opt_out_value_is_refused_naming_the_annotation() -> None:
    decision = decide(request(pod_with({keys.MEMORY_ENFORCEMENT: "disabled"})), ON)
    assert (decision.outcome, decision.reason) == (Outcome.DENIED, Reason.INVALID_ANNOTATION)
    assert keys.MEMORY_ENFORCEMENT in decision.message
    assert "off or on" in decision.message


def policy_object(memory: str | None, *, opt_out: bool | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "historyWindowSeconds": 3600, "percentile": 90, "computeHeadroom": 0.1,
        "memoryHeadroom": 0.1, "minCompute": "100m", "maxCompute": "1000m",
        "minMemory": "1Gi", "initialCompute": "200m", "initialMemory": "2Gi",
    }  # fmt: skip
    if memory is not None:
        spec["memoryEnforcement"] = memory
    if opt_out is not None:
        spec["allowMemoryEnforcementOptOut"] = opt_out
    return {"metadata": {"name": "custom"}, "spec": spec}


def policy(memory: str | None) -> Policy:
    return policy_from_object(policy_object(memory))


@pytest.mark.parametrize(
    ("field", "install", "annotation", "expected"),
    [
        (None, True, None, "memory"),
        (None, False, None, "accounting"),
        ("Off", True, None, "accounting"),
        ("On", True, None, "memory"),
        ("On", False, None, "accounting"),  # the install has no driver: nothing to load
        ("Off", True, "on", "memory"),
        ("On", True, "off", "accounting"),  # the policy allows it (opt_out below)
        ("On", True, " OFF ", "accounting"),
        ("Off", True, "off", "accounting"),
    ],
)
def test_the_pod_wins_over_its_policy_which_wins_over_the_install(
    field: str | None, install: bool, annotation: str | None, expected: str
) -> None:
    policies = effective_policies([policy_object(field, opt_out=True)])
    ctx = MutationContext(policy_set=policies, memory_enforcement=install)
    annotations = {keys.POLICY: "custom"}
    if annotation is not None:
        annotations[keys.MEMORY_ENFORCEMENT] = annotation
    _, result = admitted(pod_with(annotations), ctx)
    assert result["metadata"]["annotations"][keys.ENFORCEMENT] == expected
    assert ("NVIDIA_GPU_MEMORY_LIMIT" in env(result)) is (expected == "memory")


def test_a_policy_says_on_off_or_nothing() -> None:
    assert policy("Off").memory_enforcement is MemoryEnforcement.OFF
    assert policy("On").memory_enforcement is MemoryEnforcement.ON
    assert policy(None).memory_enforcement is None


def test_a_policy_field_of_another_value_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"spec\.memoryEnforcement"):
        policy("Always")
    with pytest.raises(ValueError, match=r"spec\.allowMemoryEnforcementOptOut"):
        policy_from_object(policy_object(None, opt_out="yes"))  # type: ignore[arg-type]


def test_a_policy_forbids_the_opt_out_unless_an_operator_allows_it() -> None:
    assert not policy(None).allow_memory_opt_out
    assert policy_from_object(policy_object(None, opt_out=True)).allow_memory_opt_out
    assert not any(p.allow_memory_opt_out for p in BUILTIN.values())


def test_builtins_leave_it_to_the_install() -> None:
    assert all(p.memory_enforcement is None for p in BUILTIN.values())


def test_an_mps_pod_gets_both_wirings_in_one_list_of_mounts() -> None:
    _, result = admitted(pod_with({keys.POLICY: "real-time-mps"}))
    assert result["metadata"]["annotations"][keys.ENFORCEMENT] == "mps,memory"
    mounts = result["spec"]["containers"][0]["volumeMounts"]
    assert [m["mountPath"] for m in mounts] == [
        "/run/gpupack/mps", "/dev/shm", "/run/gpupack/cuda", "/run/gpupack/cuda/budget",
        "/etc/ld.so.preload",
    ]  # fmt: skip
    assert [v["name"] for v in result["spec"]["volumes"]] == ["gpupack-mps", "gpupack-cuda"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in env(result)
    assert "NVIDIA_GPU_MEMORY_LIMIT" in env(result)


def test_a_container_with_its_own_preload_keeps_it_and_gets_ld_preload() -> None:
    pod = pod_with(volumes=[{"name": "mine", "configMap": {"name": "preload"}}])
    container = pod["spec"]["containers"][0]
    own = {"name": "mine", "mountPath": "/etc/ld.so.preload", "subPath": "ld.so.preload"}
    container["volumeMounts"] = [own]
    container["env"] = [{"name": "LD_PRELOAD", "value": "/opt/libjemalloc.so"}]
    decision, result = admitted(pod)
    mounts = result["spec"]["containers"][0]["volumeMounts"]
    assert mounts == [own, *MOUNTS[:2]]
    assert env(result)["LD_PRELOAD"] == "/run/gpupack/cuda/libgpupack-cuda.so:/opt/libjemalloc.so"
    assert any("mounts its own /etc/ld.so.preload" in w for w in decision.warnings)


def test_a_container_with_its_own_preload_and_no_ld_preload_gets_one() -> None:
    pod = pod_with(volumes=[{"name": "mine", "emptyDir": {}}])
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "mine", "mountPath": "/etc/ld.so.preload"}
    ]
    _, result = admitted(pod)
    assert env(result)["LD_PRELOAD"] == "/run/gpupack/cuda/libgpupack-cuda.so"


@pytest.mark.parametrize("path", ["/run/gpupack/cuda", "/run/gpupack/cuda/limit"])
def test_a_mount_at_or_below_the_shims_path_gives_way_and_the_decision_says_so(
    path: str,
) -> None:
    pod = pod_with(volumes=[{"name": "mine", "emptyDir": {}}])
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "mine", "mountPath": path}]
    decision, result = admitted(pod)
    assert result["spec"]["containers"][0]["volumeMounts"] == MOUNTS
    assert any(f"no longer mounted at {path}" in w for w in decision.warnings)


def test_a_containers_own_shim_directory_is_replaced_by_gpupacks() -> None:
    pod = pod_with()
    pod["spec"]["containers"][0]["env"] = [{"name": "GPUPACK_CUDA_DIR", "value": "/tmp/mine"}]
    decision, result = admitted(pod)
    assert env(result)["GPUPACK_CUDA_DIR"] == "/run/gpupack/cuda"
    assert any("its GPUPACK_CUDA_DIR is replaced" in w for w in decision.warnings)


def test_a_users_volume_of_the_shims_name_is_replaced() -> None:
    pod = pod_with(volumes=[{"name": "gpupack-cuda", "emptyDir": {}}])
    decision, result = admitted(pod)
    assert result["spec"]["volumes"] == [VOLUME]
    assert any("the name is gpupack's" in w for w in decision.warnings)


def test_every_container_shares_the_pods_budget_and_only_gpu_ones_get_the_limit() -> None:
    pod = pod_with()
    pod["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})
    pod["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    _, result = admitted(pod)
    assert result["spec"]["containers"][1]["volumeMounts"] == MOUNTS
    assert result["spec"]["initContainers"][0]["volumeMounts"] == MOUNTS
    # every container names the shim's directory; the driver's limit is the GPU's own
    assert result["spec"]["containers"][1]["env"] == [DIRECTORY]
    assert result["spec"]["initContainers"][0]["env"] == [DIRECTORY]


def test_a_sidecar_with_its_own_preload_and_no_env_gets_ld_preload() -> None:
    pod = pod_with(volumes=[{"name": "mine", "emptyDir": {}}])
    own = {"name": "mine", "mountPath": "/etc/ld.so.preload"}
    pod["spec"]["containers"].append({"name": "sidecar", "image": "busybox", "volumeMounts": [own]})
    _, result = admitted(pod)
    sidecar = result["spec"]["containers"][1]
    assert sidecar["env"] == [
        DIRECTORY,
        {"name": "LD_PRELOAD", "value": "/run/gpupack/cuda/libgpupack-cuda.so"},
    ]
    assert sidecar["volumeMounts"] == [own, *MOUNTS[:2]]


def test_the_wiring_is_written_once() -> None:
    _, result = admitted(pod_with())
    again = decide(request(result), ON)
    assert again.outcome is Outcome.SKIPPED  # sealed: nothing more to write
