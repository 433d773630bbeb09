"""The cache: informer objects folded into the snapshot, and rebuilt from them alone."""

import random
from typing import Any

from gpupack import keys
from gpupack.pool import pool_key
from scheduler.cache import Cache, Dirty
from scheduler.ledger import Request
from scheduler.placement import Placement, place, why_unfit
from scheduler.score import PackingScorer
from scheduler.translate import request_of

JSON = dict[str, Any]
GiB = 2**30
UUIDS = [f"GPU-00000000-0000-4000-8000-00000000000{i}" for i in range(4)]
SPEC: JSON = {"tolerations": [{"key": "t", "operator": "Exists"}]}
POOL = pool_key(SPEC)  # type: ignore[arg-type]


class Store:
    def __init__(self) -> None:
        self.objects: dict[str, JSON] = {}

    def get(self, key: str) -> JSON | None:
        return self.objects.get(key)

    def items(self) -> list[JSON]:
        return list(self.objects.values())


def node(name: str) -> JSON:
    return {
        "metadata": {"name": name, "labels": {keys.GFD_MEMORY_MIB: "81920"}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def capacity(index: int, node_name: str = "n1") -> JSON:
    return {
        "metadata": {
            "name": f"cap-{index}",
            "namespace": keys.SYSTEM_NAMESPACE,
            "labels": {keys.ROLE: keys.ROLE_CAPACITY, keys.POOL: POOL},
            "annotations": {keys.GPU_UUID: UUIDS[index]},
        },
        "spec": {
            "nodeName": node_name,
            **SPEC,
            "containers": [{"resources": {"requests": {"cpu": "1m"}}}],
        },
        "status": {"phase": "Running"},
    }


def fractional(name: str, compute: str, *, gpu: int | None = None, gated: bool = False) -> JSON:
    annotations = {keys.DECISION: f"uid-{name}", keys.GPU_COMPUTE: compute}
    spec: JSON = {
        "schedulerName": keys.SCHEDULER_NAME,
        **SPEC,
        "containers": [{"resources": {"requests": {"cpu": "100m"}}}],
    }
    if gpu is not None:
        annotations |= {keys.GPU_UUID: UUIDS[gpu], keys.CAPACITY_POD: f"cap-{gpu}"}
        spec["nodeName"] = "n1"
    if gated:
        spec["schedulingGates"] = [{"name": "wait"}]
    return {
        "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def cache_with(*pods: JSON) -> tuple[Cache, Store]:
    nodes, store = Store(), Store()
    nodes.objects["n1"] = node("n1")
    for pod in pods:
        store.objects[f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"] = pod
    cache = Cache(nodes, store, Dirty())
    cache.refresh()
    return cache, store


def test_a_rebuilt_ledger_books_exactly_what_the_annotations_say() -> None:
    cache, _ = cache_with(
        capacity(0), capacity(1), fractional("a", "600m", gpu=0), fractional("b", "300m", gpu=1)
    )

    gpus = cache.ledger.gpus
    assert (gpus[UUIDS[0]].used_compute, gpus[UUIDS[1]].used_compute) == (600, 300)
    assert cache.ledger.nodes["n1"].used_cpu == 2 + 200  # two capacity pods, two fractional
    assert cache.pending == {}


def test_pods_seen_before_their_capacity_pod_are_charged_when_it_appears() -> None:
    cache, store = cache_with(fractional("a", "600m", gpu=0))
    store.objects["gpupack-system/cap-0"] = capacity(0)
    cache.dirty.pod("gpupack-system/cap-0")
    cache.refresh()

    assert cache.ledger.gpus[UUIDS[0]].used_compute == 600
    # So a new 500m pod cannot land there: no double booking.
    result = place(cache.ledger, request_of(fractional("n", "500m")), PackingScorer())  # type: ignore[arg-type]
    assert not isinstance(result, Placement)


def test_unbound_pods_addressed_to_us_queue_unless_gated() -> None:
    cache, _ = cache_with(
        capacity(0), fractional("free", "100m"), fractional("gated", "100m", gated=True)
    )

    assert set(cache.pending) == {"ml/free"}


def test_a_deleted_capacity_pod_leaves_its_pods_orphaned() -> None:
    cache, store = cache_with(capacity(0), fractional("a", "600m", gpu=0))
    del store.objects["gpupack-system/cap-0"]
    cache.dirty.pod("gpupack-system/cap-0")
    cache.refresh()

    assert [b.request.key for b in cache.orphans()] == ["ml/a"]


def test_a_replaced_capacity_pod_keeps_its_gpu_when_the_old_one_goes_after_it() -> None:
    # The GPU's id is the device's: a replacement on the same device claims the same id,
    # and the old pod's deletion may reach the cache after the new pod took the GPU.
    cache, store = cache_with(capacity(0), fractional("a", "600m", gpu=0))
    new = capacity(0)
    new["metadata"]["name"] = "cap-0-new"
    store.objects["gpupack-system/cap-0-new"] = new
    cache.dirty.pod("gpupack-system/cap-0-new")
    cache.refresh()
    del store.objects["gpupack-system/cap-0"]
    cache.dirty.pod("gpupack-system/cap-0")
    cache.refresh()

    gpu = cache.ledger.gpus[UUIDS[0]]
    assert (gpu.holder, gpu.used_compute) == ("cap-0-new", 600)
    assert list(cache.orphans()) == []
    assert cache.coming(POOL) == []


def test_a_node_deleted_and_made_again_gets_its_gpus_back() -> None:
    nodes, store = Store(), Store()
    for pod in (capacity(0), fractional("a", "600m", gpu=0)):
        store.objects[f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"] = pod
    cache = Cache(nodes, store, Dirty())
    nodes.objects["n1"] = node("n1")
    cache.refresh()
    saved = nodes.objects.pop("n1")
    cache.dirty.node("n1")
    cache.refresh()

    assert UUIDS[0] not in cache.ledger.gpus
    assert cache.coming(POOL) == []  # a GPU whose node is gone is not coming either

    nodes.objects["n1"] = saved
    cache.dirty.node("n1")
    cache.refresh()

    assert cache.ledger.gpus[UUIDS[0]].used_compute == 600


def test_an_assumed_pod_survives_a_relist_until_the_informer_shows_it_bound() -> None:
    cache, store = cache_with(capacity(0), fractional("a", "600m"))
    request = request_of(store.objects["ml/a"])
    assert isinstance(request, Request)
    cache.ledger.assume(request, "n1", (UUIDS[0],))
    cache.assumed.add("ml/a")
    cache.pending.pop("ml/a")

    cache.dirty.pod("")  # relist
    cache.refresh()

    assert cache.ledger.gpus[UUIDS[0]].used_compute == 600
    assert "ml/a" not in cache.pending


def booked_on(cache: Cache, index: int) -> tuple[int, int]:
    gpu = cache.ledger.gpus[UUIDS[index]]
    return gpu.used_compute, gpu.used_memory


def test_pods_the_objects_put_beyond_a_gpu_are_reported_not_booked() -> None:
    # Two pods bound to one GPU with 1,200m between them (a race, an edited object).
    cache, store = cache_with(
        capacity(0), fractional("a", "700m", gpu=0), fractional("b", "500m", gpu=0)
    )

    gpu = cache.ledger.gpus[UUIDS[0]]
    assert gpu.used_compute <= gpu.compute
    assert [b.request.key for b in cache.ledger.overcommitted()] == ["ml/b"]
    assert gpu.pods == 2  # both still count as hosted: the capacity pod stays
    # The GPU takes nothing new while it is over-committed, even what would fit its books.
    request = request_of(fractional("n", "100m"))
    assert isinstance(request, Request)
    result = place(cache.ledger, request, PackingScorer())
    assert not isinstance(result, Placement)
    assert "over-committed" in why_unfit(cache.ledger, request, PackingScorer()).message

    # The first pod goes: the second now fits and is booked for real.
    del store.objects["ml/a"]
    cache.dirty.pod("ml/a")
    cache.refresh()
    assert booked_on(cache, 0)[0] == 500
    assert cache.ledger.overcommitted() == []
    assert gpu.over == 0


def test_gpu_memory_is_never_over_booked_either() -> None:
    big = [fractional(n, "100m", gpu=0) for n in ("a", "b")]
    for pod in big:
        pod["metadata"]["annotations"][keys.GPU_MEMORY] = str(50 * GiB)
    cache, _ = cache_with(capacity(0), *big)

    assert booked_on(cache, 0) == (100, 50 * GiB)  # 80 GiB GPU: the second does not fit
    assert len(cache.ledger.overcommitted()) == 1


def test_pods_seen_before_their_gpu_are_booked_only_up_to_it() -> None:
    cache, store = cache_with(*(fractional(n, "400m", gpu=0) for n in "abc"))
    store.objects["gpupack-system/cap-0"] = capacity(0)
    cache.dirty.pod("gpupack-system/cap-0")
    cache.refresh()

    assert booked_on(cache, 0)[0] == 800
    assert [b.request.key for b in cache.ledger.overcommitted()] == ["ml/c"]  # first come


def test_whatever_the_objects_say_the_books_hold_and_add_up() -> None:
    rng = random.Random(15)
    cache, store = cache_with(capacity(0), capacity(1))
    for step in range(400):
        name = f"p{rng.randrange(12)}"
        key = f"ml/{name}"
        if key in store.objects and rng.random() < 0.4:
            del store.objects[key]
        elif rng.random() < 0.05:
            index = rng.randrange(2)
            store.objects.pop(f"gpupack-system/cap-{index}", None)
            cache.dirty.pod(f"gpupack-system/cap-{index}")
            if rng.random() < 0.5:
                store.objects[f"gpupack-system/cap-{index}"] = capacity(index)
        else:
            pod = fractional(
                name, f"{rng.choice([100, 250, 500, 700, 1000])}m", gpu=rng.randrange(2)
            )
            pod["metadata"]["annotations"][keys.GPU_MEMORY] = str(rng.choice([10, 30, 60]) * GiB)
            store.objects[key] = pod
        cache.dirty.pod(key)
        if rng.random() < 0.1:
            cache.dirty.pod("")  # relist
        cache.refresh()

        for gpu in cache.ledger.gpus.values():
            booked = [b for b in cache.ledger.bookings.values() if gpu.uuid in b.gpus]
            over = [b for b in cache.ledger.bookings.values() if gpu.uuid in b.over]
            assert gpu.used_compute == sum(b.request.compute for b in booked) <= gpu.compute, step
            assert gpu.used_memory == sum(b.request.gpu_memory for b in booked) <= gpu.memory
            assert gpu.over == len(over), step
            # An over-committed pod would not fit: nothing is left out that has room.
            assert all(not gpu.fits(b.request) for b in over), step


def test_a_capacity_pod_that_is_going_keeps_its_name_taken_until_it_is_gone() -> None:
    """A deleting capacity pod holds no GPU, but its name is taken on the API server: a
    new capacity pod under that name would be refused (AlreadyExists), not created."""
    going = capacity(0)
    going["metadata"]["deletionTimestamp"] = "2026-11-25T00:00:00Z"
    cache, store = cache_with(going)

    assert "cap-0" not in cache.capacity
    assert cache.leaving == {"cap-0"}

    del store.objects[f"{keys.SYSTEM_NAMESPACE}/cap-0"]
    cache.dirty.pod(f"{keys.SYSTEM_NAMESPACE}/cap-0")
    cache.refresh()

    assert cache.leaving == set()


def test_the_nodes_offering_whole_gpus_follow_the_node_events() -> None:
    nodes = Store()
    nodes.objects["n1"] = node("n1")
    cache = Cache(nodes, Store(), Dirty())
    cache.refresh()
    assert cache.gpu_nodes == {}

    gpu = node("n2")
    gpu["status"]["allocatable"][keys.NVIDIA_GPU] = "8"
    nodes.objects["n2"] = gpu
    cache.dirty.node("n2")
    cache.refresh()
    assert cache.gpu_nodes == {"n2": 81920 * 2**20}  # and its GPUs' memory (the GFD label)

    gpu["status"]["allocatable"][keys.NVIDIA_GPU] = "0"  # the device plugin went away
    cache.dirty.node("n2")
    cache.refresh()
    assert cache.gpu_nodes == {}

    gpu["status"]["allocatable"][keys.NVIDIA_GPU] = "8"
    cache.dirty.node("n2")
    cache.refresh()
    del nodes.objects["n2"]
    cache.dirty.node("n2")
    cache.refresh()
    assert cache.gpu_nodes == {}


def dra_slice(node_name: str, *devices: JSON, driver: str = keys.DRA_DRIVER) -> JSON:
    """A ResourceSlice as NVIDIA's DRA driver publishes one."""
    return {
        "metadata": {"name": f"{node_name}-{driver}"},
        "spec": {"driver": driver, "nodeName": node_name, "devices": list(devices)},
    }


def dra_device(name: str, kind: str = "gpu", memory: str | None = "80Gi") -> JSON:
    device: JSON = {"name": name, "attributes": {"type": {"string": kind}}}
    if memory is not None:
        device["capacity"] = {"memory": {"value": memory}}
    return device


def test_a_node_whose_gpus_are_dra_devices_offers_them_while_its_slices_list_them() -> None:
    """NVIDIA's DRA driver: no `nvidia.com/gpu` in allocatable, the GPUs in ResourceSlices
    (their memory from the devices where GFD labels none)."""
    nodes, slices = Store(), Store()
    bare = node("n1")
    del bare["metadata"]["labels"][keys.GFD_MEMORY_MIB]
    nodes.objects["n1"] = bare
    nodes.objects["n2"] = node("n2")  # GFD's label says 80 GiB
    slices.objects["n1-gpu.nvidia.com"] = dra_slice("n1", dra_device("gpu-0"), dra_device("gpu-1"))
    cache = Cache(nodes, Store(), Dirty(), slices=slices)
    cache.refresh()
    assert cache.gpu_nodes == {"n1": 80 * GiB}
    changes = cache.gpu_nodes_changed

    slices.objects["n2-gpu.nvidia.com"] = dra_slice("n2", dra_device("gpu-0", memory="40Gi"))
    cache.dirty.slice("n2-gpu.nvidia.com")
    cache.refresh()
    assert cache.gpu_nodes == {"n1": 80 * GiB, "n2": 80 * GiB}  # the label first

    del slices.objects["n1-gpu.nvidia.com"]  # the driver went away
    cache.dirty.slice("n1-gpu.nvidia.com")
    cache.refresh()
    assert cache.gpu_nodes == {"n2": 80 * GiB}
    assert cache.gpu_nodes_changed == changes + 2  # n2 came, n1 went


def test_mig_devices_other_drivers_and_unknown_memory_are_no_whole_gpus_of_known_size() -> None:
    nodes, slices = Store(), Store()
    for name in ("mig", "other", "unknown"):
        nodes.objects[name] = node(name)
        del nodes.objects[name]["metadata"]["labels"][keys.GFD_MEMORY_MIB]
    for obj in (
        dra_slice("mig", dra_device("gpu-0-mig-1g", kind="mig")),
        dra_slice("other", dra_device("gpu-0"), driver="gpu.example.com"),
        dra_slice("unknown", dra_device("gpu-0"), dra_device("gpu-1", memory=None)),
    ):
        slices.objects[obj["metadata"]["name"]] = obj
    cache = Cache(nodes, Store(), Dirty(), slices=slices)
    cache.refresh()
    assert cache.gpu_nodes == {"unknown": 0}  # a GPU node, its GPUs' memory not said
