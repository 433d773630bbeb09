import pytest

from gpupack import keys
from gpupack.codec import (
    OriginalResources,
    read_compute,
    read_gpu_uuid,
    read_memory,
    read_optimize,
    read_original_resources,
    read_policy,
    write_original_resources,
)
from gpupack.errors import ContractError


def test_absent_keys_read_as_none() -> None:
    assert read_optimize({}) is None
    assert read_policy({}) is None
    assert read_compute({}) is None
    assert read_memory({}) is None
    assert read_gpu_uuid({}) is None
    assert read_original_resources({}) is None


@pytest.mark.parametrize(("value", "expected"), [("enabled", True), ("disabled", False)])
def test_optimize_label_values(value: str, expected: bool) -> None:
    assert read_optimize({keys.OPTIMIZE: value}) is expected


def test_optimize_label_rejects_other_values_naming_the_label() -> None:
    with pytest.raises(ContractError, match="gpupack.io/optimize: invalid value 'yes'"):
        read_optimize({keys.OPTIMIZE: "yes"})


@pytest.mark.parametrize("name", ["batch", "real-time-mps", "my-policy-1"])
def test_policy_names_are_dns_labels(name: str) -> None:
    assert read_policy({keys.POLICY: name}) == name


@pytest.mark.parametrize("name", ["Batch", "-x", "a_b", "", "x" * 64])
def test_policy_name_errors_name_the_annotation(name: str) -> None:
    with pytest.raises(ContractError, match=r"gpupack.io/policy: invalid value"):
        read_policy({keys.POLICY: name})


def test_compute_and_memory_annotations() -> None:
    annotations = {keys.GPU_COMPUTE: "0.3", keys.GPU_MEMORY: "12288Mi"}
    assert read_compute(annotations) == 300
    assert read_memory(annotations) == 12 * 2**30


def test_gpu_uuid_must_look_like_an_nvidia_uuid() -> None:
    good = "GPU-4c2f8f3e-1b2a-4d3c-9e8f-0a1b2c3d4e5f"
    assert read_gpu_uuid({keys.GPU_UUID: good}) == good
    with pytest.raises(ContractError, match="gpupack.io/gpu-uuid"):
        read_gpu_uuid({keys.GPU_UUID: "all"})


def test_original_resources_round_trip() -> None:
    original = OriginalResources(
        containers={"main": {"limits": {"nvidia.com/gpu": "1"}}},
        init_containers={"warm": {"requests": {"nvidia.com/gpu": 1}}},
        scheduler_name="default-scheduler",
    )
    text = write_original_resources(original)
    assert read_original_resources({keys.ORIGINAL_RESOURCES: text}) == original


@pytest.mark.parametrize("text", ["{", "[]", '{"containers": []}', '{"schedulerName": 3}'])
def test_original_resources_errors_name_the_annotation(text: str) -> None:
    with pytest.raises(ContractError, match="gpupack.io/original-resources"):
        read_original_resources({keys.ORIGINAL_RESOURCES: text})
