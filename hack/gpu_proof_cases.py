"""The programs `hack.gpu_proof_shim` runs under the memory shim on a real GPU, by name.

Each is a Python source run in a fresh process of a pretend pod; it prints one JSON object
on its last line (what the proof checks). They need the framework they drive (PyTorch,
JAX, CuPy) and nothing of gpupack's.
"""

CASES: dict[str, str] = {}


def case(name: str, source: str) -> None:
    CASES[name] = source


# Each case is a program run under the shim; it prints one JSON object on its last line.
TORCH_FILL = """
import json, os, torch
free, total = torch.cuda.mem_get_info()
chunks, held, error = [], 0, ""
try:
    while True:
        chunks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
        held += 256 << 20
except torch.OutOfMemoryError as e:
    error = str(e).splitlines()[0][:300]
reserved = torch.cuda.memory_reserved()
del chunks
torch.cuda.empty_cache()
again = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
print(json.dumps({"free": free, "total": total, "allocated_to_oom": held,
                  "reserved_at_oom": reserved, "oom_error": error,
                  "after_free_1gib_ok": again.numel() == 1 << 30}))
"""
case("torch-default", TORCH_FILL)
case("torch-expandable", TORCH_FILL)

case(
    "cuda-graph",
    """
import json, torch
x = torch.randn(1024, 1024, device="cuda")
w = torch.randn(1024, 1024, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        y = torch.relu(x @ w)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = torch.relu(x @ w)
ok = True
for i in range(10):
    x.copy_(torch.randn(1024, 1024, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    ok = ok and torch.allclose(y, torch.relu(x @ w), atol=1e-2, rtol=1e-2)
print(json.dumps({"replays": 10, "results_match": bool(ok)}))
""",
)

case(
    "jax-preallocate",
    """
import json, jax, jax.numpy as jnp
x = jnp.ones((1024, 1024)) @ jnp.ones((1024, 1024))
x.block_until_ready()
stats = jax.devices()[0].memory_stats() or {}
print(json.dumps({"bytes_limit": stats.get("bytes_limit"), "pool_bytes": stats.get("pool_bytes"),
                  "bytes_reserved": stats.get("bytes_reserved")}))
""",
)

case(
    "cupy-pool",
    """
import json, cupy
free, total = cupy.cuda.runtime.memGetInfo()
pool, held, blocks, error = cupy.get_default_memory_pool(), 0, [], ""
try:
    while True:
        blocks.append(cupy.empty(256 << 20, dtype=cupy.uint8))
        held += 256 << 20
except cupy.cuda.memory.OutOfMemoryError as e:
    error = str(e)[:300]
print(json.dumps({"free": free, "total": total, "allocated_to_oom": held,
                  "pool_total": pool.total_bytes(), "oom_error": error}))
""",
)

case(
    "vllm-sizing",
    """
import json, torch
torch.cuda.init()
torch.empty(1, device="cuda")
free, total = torch.cuda.mem_get_info()
want = int(0.9 * total)
in_use = total - free
kv = torch.empty(want - in_use, dtype=torch.uint8, device="cuda")
free_after, _ = torch.cuda.mem_get_info()
print(json.dumps({"total": total, "free_at_start": free, "target_0.9_total": want,
                  "kv_cache_bytes": kv.numel(), "free_after": free_after}))
""",
)

case(
    "hold",
    """
import json, sys, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(json.dumps({"holding": x.numel()}), flush=True)
sys.stdin.read()
""",
)

case(
    "try-alloc",
    """
import json, sys, torch
free, total = torch.cuda.mem_get_info()
try:
    x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
    ok, error = True, ""
except torch.OutOfMemoryError as e:
    ok, error = False, str(e).splitlines()[0][:200]
print(json.dumps({"free": free, "total": total, "asked": int(sys.argv[1]), "granted": ok,
                  "error": error}))
""",
)

case(
    "context",
    """
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
ctx = ctypes.c_void_p()
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
free, total = ctypes.c_size_t(), ctypes.c_size_t()
assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
print(json.dumps({"free": free.value, "total": total.value}), flush=True)
import sys; sys.stdin.read()
""",
)

case(
    "train-step",
    """
import json, sys, time, torch
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 6).cuda()
opt = torch.optim.AdamW(model.parameters(), 1e-4)
x = torch.randn(32, 256, 512, device="cuda")
def step():
    opt.zero_grad(set_to_none=True)
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
for _ in range(10):
    step()
torch.cuda.synchronize()
times = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter(); step(); torch.cuda.synchronize(); times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"median_step_s": times[len(times) // 2]}))
""",
)


case(
    "device-malloc",
    """
import json, cupy
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
    '  char *p = (char *)malloc(1 << 20);'
    '  if (p) { p[0] = 1; free(p); atomicAdd(ok, 1); }'
    '}',
    "grab",
)
ok = cupy.zeros(1, dtype=cupy.int32)
kernel((64,), (16,), (ok,))
cupy.cuda.runtime.deviceSynchronize()
free1, _ = cupy.cuda.runtime.memGetInfo()
result.update({"threads_that_allocated": int(ok[0]), "free_after": free1})
print(json.dumps(result))
""",
)
