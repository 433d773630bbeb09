import pytest

from gpupack.errors import ContractError
from gpupack.objects import PodSpec
from gpupack.policy import BUILTIN, GiB, Policy, Sharing
from gpupack.pool import metadata_key, pool_key, scheduling_metadata

SPEC: PodSpec = {
    "containers": [{"name": "c", "image": "x"}],
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "zone": "a"},
    "tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists"},
    ],
    "priorityClassName": "high",
    "affinity": {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}},
        "podAntiAffinity": {"x": 1},
    },
}


def test_scheduling_metadata_keeps_only_inherited_fields() -> None:
    inherited = scheduling_metadata(SPEC)
    assert set(inherited) == {"nodeSelector", "tolerations", "priorityClassName", "affinity"}
    assert inherited["affinity"] == {"nodeAffinity": SPEC["affinity"]["nodeAffinity"]}


def test_pool_key_is_stable_and_ignores_set_order() -> None:
    reordered: PodSpec = {
        **SPEC,
        "tolerations": list(reversed(SPEC["tolerations"])),
        "nodeSelector": {"zone": "a", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        "containers": [{"name": "other", "image": "y"}],
    }
    assert pool_key(SPEC) == pool_key(reordered)
    assert len(pool_key(SPEC)) == 16
    # The value is part of the contract between webhook and scheduler across releases.
    assert pool_key({"containers": []}) == "44136fa355b3678a"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"nodeSelector": {"zone": "b"}}, id="node-selector"),
        pytest.param({"priorityClassName": "low"}, id="priority"),
        pytest.param({"runtimeClassName": "nvidia"}, id="runtime-class"),
        pytest.param({"tolerations": []}, id="tolerations"),
    ],
)
def test_pool_key_changes_with_inherited_metadata(change: PodSpec) -> None:
    assert pool_key({**SPEC, **change}) != pool_key(SPEC)


def test_the_tolerations_the_api_server_adds_for_gpupacks_shares_leave_the_pool_as_it_was() -> None:
    """ExtendedResourceToleration runs again after the webhook: the stored pod then
    tolerates taints named after the shares gpupack charged it, which the webhook never
    saw. The pool, and what capacity pods inherit, stay what the webhook planned."""
    added = [
        {"key": key, "operator": "Exists", "effect": "NoSchedule"}
        for key in ("gpupack.io/gpu-compute-milli", "gpupack.io/gpu-memory")
    ]
    stored: PodSpec = {**SPEC, "tolerations": [*SPEC["tolerations"], *added]}
    assert pool_key(stored) == pool_key(SPEC)
    assert scheduling_metadata(stored)["tolerations"] == SPEC["tolerations"]
    alone: PodSpec = {"containers": [], "tolerations": added}
    assert "tolerations" not in scheduling_metadata(alone)
    assert pool_key(alone) == pool_key({"containers": []})
    # A toleration of another shape, or of a taint a node may have, is the user's.
    for own in (
        {"key": "gpupack.io/gpu-memory", "operator": "Exists", "effect": "NoExecute"},
        {"key": "gpupack.io/gpu-memory", "operator": "Equal", "value": "x", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ):
        assert pool_key({"containers": [], "tolerations": [own]}) != pool_key({"containers": []})


def test_six_builtin_policies_with_one_mps() -> None:
    assert sorted(BUILTIN) == sorted(
        ["real-time", "real-time-mps", "near-real-time", "batch", "training", "build"]
    )
    assert [p.name for p in BUILTIN.values() if p.sharing is Sharing.MPS] == ["real-time-mps"]
    for policy in BUILTIN.values():
        assert policy.initial_memory <= 12 * GiB  # fits a T4 without knowing the device


def test_policy_rejects_inconsistent_bounds() -> None:
    with pytest.raises(ContractError, match="policy bad"):
        Policy("bad", "", 1, 90, 0.1, 0.1, 500, 1000, GiB, None, 100, GiB)


def test_policy_clamps() -> None:
    policy = BUILTIN["build"]
    assert policy.clamp_compute(2000) == policy.max_compute
    assert policy.clamp_compute(1) == policy.min_compute
    assert policy.clamp_memory(100 * GiB) == policy.max_memory


def test_the_key_leaves_the_metadata_it_was_given_as_it_was() -> None:
    spec: PodSpec = {
        "containers": [],
        "tolerations": [  # out of canonical order, and unseen by the memo
            {"key": "z-only-in-this-test", "operator": "Exists"},
            {"key": "a-only-in-this-test", "operator": "Exists"},
        ],
    }
    inherited = scheduling_metadata(spec)
    before = repr(inherited)
    assert metadata_key(inherited) == pool_key(spec)
    assert repr(inherited) == before  # tolerations keep the user's order


def test_an_mps_pool_is_a_pool_of_its_own_and_other_pools_keep_their_keys() -> None:
    assert pool_key(SPEC, mps=True) != pool_key(SPEC)
    assert pool_key(SPEC, mps=False) == pool_key(SPEC)
    # Existing pools keep their keys across the upgrade that added MPS pools.
    assert pool_key({"containers": []}, mps=True) != "44136fa355b3678a"
    assert scheduling_metadata(SPEC, mps=True)["sharing"] == "mps"
