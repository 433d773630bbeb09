"""The programs `hack.gpu_proof_shim` runs under the memory shim on a real GPU, by name.

Each is a Python file in `hack/gpu-proof-programs/`, run in a fresh process of a pretend
pod; it prints one JSON object on its last line (what the proof checks). They need the
framework they drive (PyTorch, JAX, CuPy) and nothing of gpupack's; the proof's C probe
is `tests/cuda_shim/probe.c`, which the shim's tests build too.
"""

from pathlib import Path
from typing import Final

PROGRAMS: Final = Path(__file__).resolve().parent / "gpu-proof-programs"

# Case name -> its program (two cases run one program under different settings).
FILES: Final = {
    "torch-default": "torch-fill.py",
    "torch-expandable": "torch-fill.py",
    "cuda-graph": "cuda-graph.py",
    "jax-preallocate": "jax-preallocate.py",
    "cupy-pool": "cupy-pool.py",
    "vllm-sizing": "vllm-sizing.py",
    "hold": "hold.py",
    "try-alloc": "try-alloc.py",
    "context": "context.py",
    "train-step": "train-step.py",
    "device-malloc": "device-malloc.py",
    "matmul-loop": "matmul-loop.py",
    "latency-loop": "latency-loop.py",
}

CASES: Final = {name: (PROGRAMS / file).read_text() for name, file in FILES.items()}
