"""NVIDIA's DRA driver's ResourceSlices as gpupack reads them, for the scheduler (how many
GPUs a node has) and the node agent (which GPU a claim was given) alike."""

from collections.abc import Iterable

from gpupack import keys
from gpupack.objects import JSON


def current_slices(slices: Iterable[JSON | None]) -> list[JSON]:
    """NVIDIA's DRA driver's slices (`keys.DRA_DRIVER`) of each pool's newest generation:
    a driver republishing a pool leaves the older generation's slices behind for a while
    (they must not count a GPU twice, nor name an old device), and another driver's
    devices are not GPUs gpupack shares."""
    ours = [s for s in slices if s and (s.get("spec") or {}).get("driver") == keys.DRA_DRIVER]

    def pool_of(obj: JSON) -> tuple[str, int]:
        pool = (obj.get("spec") or {}).get("pool") or {}
        generation = pool.get("generation", 0)
        return str(pool.get("name", "")), generation if isinstance(generation, int) else -1

    newest: dict[str, int] = {}
    for obj in ours:
        name, generation = pool_of(obj)
        newest[name] = max(newest.get(name, generation), generation)
    return [obj for obj in ours if pool_of(obj)[1] == newest[pool_of(obj)[0]]]
