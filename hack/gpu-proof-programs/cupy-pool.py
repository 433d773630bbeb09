import json

import cupy

free, total = cupy.cuda.runtime.memGetInfo()
pool, held, blocks, error = cupy.get_default_memory_pool(), 0, [], ""
try:
    while True:
        blocks.append(cupy.empty(256 << 20, dtype=cupy.uint8))
        held += 256 << 20
except cupy.cuda.memory.OutOfMemoryError as e:
    error = str(e)[:300]
print(
    json.dumps(
        {
            "free": free,
            "total": total,
            "allocated_to_oom": held,
            "pool_total": pool.total_bytes(),
            "oom_error": error,
        }
    )
)
