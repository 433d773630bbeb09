"""Which ResourceSlices count: NVIDIA's driver's, each pool's newest generation."""

from typing import Any

from exporter.discovery import claim_gpu_uuids
from gpupack import keys
from gpupack.dra import current_slices
from scheduler.translate import dra_gpus

OLD = "GPU-00000000-0000-4000-8000-000000000001"
NEW = "GPU-00000000-0000-4000-8000-000000000002"


def slice_(
    pool: str, generation: Any, *devices: tuple[str, str], driver: str = keys.DRA_DRIVER
) -> Any:
    return {
        "spec": {
            "driver": driver,
            "nodeName": "gpu-1",
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": name,
                    "attributes": {"type": {"string": keys.DRA_GPU_TYPE}, "uuid": {"string": uuid}},
                    "capacity": {"memory": {"value": "80Gi"}},
                }
                for name, uuid in devices
            ],
        }
    }


def test_only_the_newest_generation_of_each_pool_of_nvidias_driver_counts() -> None:
    stale = slice_("gpu-1", 1, ("gpu-0", OLD), ("gpu-1", OLD))
    fresh = slice_("gpu-1", 2, ("gpu-0", NEW))
    other_pool = slice_("gpu-1-extra", 1, ("gpu-7", NEW))
    foreign = slice_("gpu-1", 9, ("gpu-0", OLD), driver="example.com/fpga")
    assert current_slices([stale, fresh, other_pool, foreign, None]) == [fresh, other_pool]
    assert dra_gpus([stale, fresh, foreign]).count == 1  # not 3: the old generation lingers


def test_a_claim_names_the_gpu_of_the_newest_generation_only() -> None:
    claim = {
        "metadata": {"name": "cap"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": keys.DRA_DRIVER, "pool": "gpu-1", "device": "gpu-0"},
        ]}}},
    }  # fmt: skip
    stale = slice_("gpu-1", 1, ("gpu-0", OLD))
    fresh = slice_("gpu-1", 2, ("gpu-0", NEW))
    assert claim_gpu_uuids(claim, {"gpu"}, [fresh, stale]) == ((NEW,), "")
    assert claim_gpu_uuids(claim, {"gpu"}, [stale, fresh]) == ((NEW,), "")
    foreign = slice_("gpu-1", 3, ("gpu-0", OLD), driver="example.com/fpga")
    uuids, why = claim_gpu_uuids(claim, {"gpu"}, [foreign])
    assert uuids == ()
    assert "no ResourceSlice of this node gives device gpu-0" in why
