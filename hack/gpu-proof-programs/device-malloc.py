import json

import cupy

free0, total = cupy.cuda.runtime.memGetInfo()
result = {"total": total, "free_before": free0}
try:
    cupy.cuda.runtime.deviceSetLimit(0x02, 16 << 30)  # cudaLimitMallocHeapSize
    result["heap_16gib"] = "granted"
except cupy.cuda.runtime.CUDARuntimeError as e:
    result["heap_16gib"] = str(e)[:200]
cupy.cuda.runtime.deviceSetLimit(0x02, 2 << 30)
kernel = cupy.RawKernel(
    'extern "C" __global__ void grab(int *ok) {'
    "  char *p = (char *)malloc(1 << 20);"
    "  if (p) { p[0] = 1; free(p); atomicAdd(ok, 1); }"
    "}",
    "grab",
)
ok = cupy.zeros(1, dtype=cupy.int32)
kernel((64,), (16,), (ok,))
cupy.cuda.runtime.deviceSynchronize()
free1, _ = cupy.cuda.runtime.memGetInfo()
result.update({"threads_that_allocated": int(ok[0]), "free_after": free1})
print(json.dumps(result))
