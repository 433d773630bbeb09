"""Compute shares at admission: a policy's `compute` (off, share, cap) becomes a word of
`gpupack.io/enforcement` where the shim is loaded, and the pod mounts its GPU's
`gpu-time` file; where the shim is not, the audit says the share is not applied."""

from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from doubles.pods import TestPod as Pod
from doubles.pods import deployment_pod, request
from gpupack import keys
from gpupack.errors import ContractError
from gpupack.policy import BUILTIN, ComputeShare, effective_policies, policy_from_object
from webhook.decision import Outcome
from webhook.mutate import MutationContext, decide

GPU_TIME_MOUNT = {
    "name": "gpupack-cuda",
    "mountPath": "/run/gpupack/cuda/gpu-time",
    "subPath": "gpu-time",
}


def policy_object(compute: str | None, **more: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "historyWindowSeconds": 3600, "percentile": 90, "computeHeadroom": 0.1,
        "memoryHeadroom": 0.1, "minCompute": "100m", "maxCompute": "1000m",
        "minMemory": "1Gi", "initialCompute": "300m", "initialMemory": "2Gi", **more,
    }  # fmt: skip
    if compute is not None:
        spec["compute"] = compute
    return {"metadata": {"name": "custom"}, "spec": spec}


def admitted(compute: str | None, *, memory: bool = True) -> tuple[Any, Pod]:
    ctx = MutationContext(
        policy_set=effective_policies([policy_object(compute)]),
        memory_enforcement=memory,
    )
    pod = deployment_pod()
    pod["metadata"]["annotations"] = {keys.POLICY: "custom"}
    decision = decide(request(pod), ctx)
    assert decision.outcome is Outcome.MUTATED, decision.message
    result: Pod = jsonpatch.apply_patch(pod, list(decision.patch))
    kubernetes_validate.validate(result, "1.34", strict=True)
    return decision, result


@pytest.mark.parametrize(
    ("compute", "enforcement"),
    [("share", "memory,compute"), ("cap", "memory,compute-cap")],
)
def test_a_paced_policys_pods_say_so_and_mount_their_gpus_file(
    compute: str, enforcement: str
) -> None:
    decision, result = admitted(compute)
    assert result["metadata"]["annotations"][keys.ENFORCEMENT] == enforcement
    assert result["metadata"]["annotations"][keys.GPU_COMPUTE] == "300m"
    assert GPU_TIME_MOUNT in result["spec"]["containers"][0]["volumeMounts"]
    assert f"enforcement {enforcement}" in decision.message


@pytest.mark.parametrize("compute", [None, "off"])
def test_compute_off_is_the_default_and_mounts_nothing_more(compute: str | None) -> None:
    _, result = admitted(compute)
    assert result["metadata"]["annotations"][keys.ENFORCEMENT] == "memory"
    assert GPU_TIME_MOUNT not in result["spec"]["containers"][0]["volumeMounts"]


def test_every_builtin_policy_leaves_compute_off_until_measured_on_a_gpu() -> None:
    assert {policy.compute for policy in BUILTIN.values()} == {ComputeShare.OFF}


def test_without_the_shim_a_compute_share_is_said_to_be_unapplied() -> None:
    decision, result = admitted("share", memory=False)
    assert result["metadata"]["annotations"][keys.ENFORCEMENT] == "accounting"
    assert any("compute: share (policy custom) not applied" in w for w in decision.warnings)


@pytest.mark.parametrize("value", ["fair", "Share", 1, True])
def test_a_compute_field_of_another_form_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ContractError, match=r"spec\.compute"):
        policy_from_object(policy_object(value))  # type: ignore[arg-type]


def test_an_mps_policy_may_not_pace_its_pods_too() -> None:
    with pytest.raises(ContractError, match="off for an mps policy"):
        policy_from_object(policy_object("share", sharing="mps"))
