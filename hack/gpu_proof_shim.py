"""The memory shim on a real GPU: `python3 -m hack.gpu_proof_shim OUTDIR` (hack/gpu-proof).

Builds libgpupack-cuda.so and the C probe with the machine's compiler, gives a pretend
pod an 8 GiB share (a budget directory), and runs each case in fresh processes under
LD_PRELOAD, as /etc/ld.so.preload loads the shim in a pod: PyTorch (default allocator
and expandable segments), CUDA graphs, JAX's preallocation, CuPy's pool, vLLM-style
sizing, PyTorch's cudaMallocAsync backend, a kernel's device malloc, VMM handles released
while mapped, a graph's memory node, a captured allocation, many threads allocating
(ending with the budget at NVML's figure), two processes of one budget and a SIGKILL,
nvidia-smi, an MPS client, the context's cost, and the overhead (a small transformer's
training step, and allocation calls a second). Needs PyTorch, JAX and CuPy; a case whose
framework is missing says so. Prints one line a case and writes OUTDIR/shim.json. Exit
status 1 if a case failed.
"""

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpupack.budget import read_budget  # the standard library only: no dependencies
from hack import gpu_proof_compute
from hack.gpu_proof_cases import CASES

GIB = 1 << 30
MIB = 1 << 20


def command(args: list[str], **options: Any) -> "subprocess.CompletedProcess[str]":
    """A program this proof chose, with arguments it made (never a user's input)."""
    options.setdefault("capture_output", "input" not in options)
    return subprocess.run(args, check=False, text=True, **options)  # noqa: S603


def start(args: list[str], env: dict[str, str]) -> "subprocess.Popen[str]":
    return subprocess.Popen(  # noqa: S603 (our interpreter and case)
        args,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


LIMIT = 8 * GIB
ROOT = Path(__file__).resolve().parent.parent


def build(out: Path) -> tuple[Path, Path | None]:
    """The shim and the probe, from this checkout, with the machine's C compiler."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"
    shim, probe = out / "libgpupack-cuda.so", out / "probe"
    flags = ["-g", "-Wall", "-Wextra"]
    shim_built = command(
        [
            cc,
            *(ROOT / "cuda-shim" / "build-flags").read_text().split(),  # the image's
            *flags,
            "-o",
            str(shim),
            *sorted(str(path) for path in (ROOT / "cuda-shim").glob("*.c")),
            "-ldl",
            "-lpthread",
        ],
    )
    if shim_built.returncode != 0:
        raise SystemExit(f"the shim did not build:\n{shim_built.stderr}")
    libdirs = ["/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"]
    found = [d for d in libdirs if (Path(d) / "libcuda.so.1").exists()]
    built = command(
        [
            cc,
            "-O2",
            *flags,
            "-o",
            str(probe),
            str(ROOT / "tests/cuda_shim/probe.c"),
            *[f"-L{d}" for d in found],
            "-Wl,--no-as-needed",
            "-l:libcuda.so.1",
            "-ldl",
            "-lpthread",
        ],
    )
    if built.returncode != 0:
        print(f"the probe did not build (no allocation-call benchmark): {built.stderr[-500:]}")
        return shim, None
    return shim, probe


def budget_used(pod: Path, pid: int | None = None) -> int:
    """What the budget file says the pod's processes (or one of them) hold, all GPUs."""
    if not (pod / "budget").exists():
        return 0
    budget = read_budget((pod / "budget").read_bytes())
    return sum(sum(slot.held.values()) for slot in budget.slots if pid is None or slot.pid == pid)


def filled_to_the_share(r: dict[str, Any]) -> bool:
    """TORCH_FILL's result: the share as the total, allocated to within 2 GiB of it, then
    PyTorch's own out-of-memory error, and memory back once freed."""
    return (
        r.get("total") == LIMIT
        and LIMIT - 2 * GIB < r.get("allocated_to_oom", 0) <= LIMIT
        and "out of memory" in r.get("oom_error", "").lower()
        and r.get("after_free_1gib_ok") is True
    )


class Proof:
    def __init__(self, out: Path, shim: Path, probe: Path | None) -> None:
        self.out, self.shim, self.probe = out, shim, probe
        self.scratch = Path(tempfile.mkdtemp(prefix="gpupack-shim-"))
        self.results: dict[str, Any] = {}
        self.failed: list[str] = []

    def pod(self, name: str, limit: int = LIMIT) -> Path:
        pod = self.scratch / name
        pod.mkdir(parents=True, exist_ok=True)
        (pod / "limit").write_text(f"{limit}\n")
        return pod

    def env(self, pod: Path | None, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD",)}
        if pod is not None:
            env.update(LD_PRELOAD=str(self.shim), GPUPACK_CUDA_DIR=str(pod))
        env.update(extra)
        return env

    def program(self, name: str, pod: Path | None, *args: str, **extra: str) -> dict[str, Any]:
        done = command(
            [sys.executable, "-c", CASES[name], *args],
            env=self.env(pod, **extra),
            timeout=180,
        )
        lines = done.stdout.strip().splitlines()
        shim_lines = [line for line in done.stderr.splitlines() if line.startswith("gpupack-cuda")]
        if done.returncode != 0 or not lines:
            return {
                "error": f"exit {done.returncode}: {done.stderr.strip()[-800:]}",
                "shim": shim_lines[:6],
            }
        result: dict[str, Any] = json.loads(lines[-1])
        result["shim"] = shim_lines[:4]
        return result

    def check(self, name: str, result: dict[str, Any], ok: bool, why: str) -> None:
        result["passed"], result["expect"] = bool(ok), why
        self.results[name] = result
        if not ok:
            self.failed.append(name)
        shown = {k: v for k, v in result.items() if k not in ("shim", "expect", "passed")}
        print(f"{'PASS' if ok else 'FAIL'} {name}: {why}\n     {json.dumps(shown)}", flush=True)
        for line in result.get("shim", [])[:3]:
            print(f"     | {line}", flush=True)

    def lookups(self) -> None:
        """How PyTorch's runtime reached the driver: every cuGetProcAddress of a wrapped name."""
        done = command(
            [
                sys.executable,
                "-c",
                "import torch; torch.empty(1, device='cuda'); torch.cuda.mem_get_info()",
            ],
            env=self.env(self.pod("lookups"), GPUPACK_CUDA_DEBUG="1"),
            timeout=120,
        )
        lines = [line for line in done.stderr.splitlines() if "cuGetProcAddress(" in line]
        (self.out / "getprocaddress.log").write_text("\n".join(lines) + "\n")
        alone = [line for line in lines if "left alone" in line]
        result = {
            "lookups": len(lines),
            "by_address": sum("by address" in x for x in lines),
            "by_version": sum("by version" in x for x in lines),
            "left_alone": alone[:10],
        }
        self.check(
            "lookups",
            result,
            done.returncode == 0 and len(lines) > 0 and not alone,
            "the runtime's cuGetProcAddress lookups of wrapped names all reach the shim",
        )

    def run_all(self) -> None:
        self.lookups()
        for alloc_conf, name in (
            ("", "torch-default"),
            ("expandable_segments:True", "torch-expandable"),
        ):
            r = self.program(name, self.pod(name), PYTORCH_CUDA_ALLOC_CONF=alloc_conf)
            self.check(
                name,
                r,
                filled_to_the_share(r),
                "total = 8 GiB, allocates to within 2 GiB of it, then an out-of-memory error",
            )
        r = self.program("cuda-graph", self.pod("graph"))
        self.check(
            "cuda-graph",
            r,
            r.get("results_match") is True,
            "capture and 10 replays give the eager result",
        )
        r = self.program("jax-preallocate", self.pod("jax"))
        self.check(
            "jax-preallocate",
            r,
            abs((r.get("bytes_limit") or 0) - 0.75 * LIMIT) <= 0.05 * LIMIT,
            "JAX's pool is 75 % of the 8 GiB share (not of the GPU)",
        )
        r = self.program("cupy-pool", self.pod("cupy"))
        self.check(
            "cupy-pool",
            r,
            r.get("total") == LIMIT and LIMIT - 2 * GIB < r.get("allocated_to_oom", 0) <= LIMIT,
            "CuPy sees 8 GiB and its pool stops there",
        )
        r = self.program("vllm-sizing", self.pod("vllm"))
        self.check(
            "vllm-sizing",
            r,
            r.get("total") == LIMIT and r.get("kv_cache_bytes", 0) > 0,
            "0.9 x the reported total (8 GiB) allocates",
        )
        r = self.program("torch-default", self.pod("torch-async"),
                         PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")  # fmt: skip
        self.check(
            "torch-async",
            r,
            filled_to_the_share(r),
            "backend:cudaMallocAsync (a pool that keeps all it frees) stops at the share too",
        )
        r = self.program("device-malloc", self.pod("heap"))
        self.check(
            "device-malloc",
            r,
            r.get("heap_16gib") != "granted"
            and r.get("threads_that_allocated") == 64 * 16
            and r.get("free_after", LIMIT) <= r.get("free_before", 0) - (2 << 30) + (8 << 20),
            "a 16 GiB device heap refused; a 2 GiB one charged, and a kernel's malloc works",
        )
        self.driver_cases()
        self.two_processes()
        self.nvidia_smi()
        self.context_cost()
        self.mps_client()
        self.overhead()
        self.compute_shares()

    def two_processes(self) -> None:
        pod = self.pod("two")
        holder = start([sys.executable, "-c", CASES["hold"], str(5 * GIB)], self.env(pod))
        assert holder.stdout is not None
        line = holder.stdout.readline()
        first = self.program("try-alloc", pod, str(4 * GIB))
        second = self.program("try-alloc", pod, str(1 * GIB))
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        time.sleep(1)
        after = self.program("try-alloc", pod, str(6 * GIB))
        result = {
            "holder": line.strip(),
            "4GiB_beside_5GiB": first,
            "1GiB_beside_5GiB": second,
            "6GiB_after_SIGKILL": after,
            "budget_after": budget_used(pod),
        }
        self.check(
            "two-processes",
            result,
            first.get("granted") is False
            and second.get("granted") is True
            and after.get("granted") is True,
            "one budget: 4 GiB refused beside 5 GiB (and two contexts), 1 GiB granted; "
            "6 GiB granted once the holder is SIGKILLed",
        )

    def probe_run(self, name: str, *ops: str) -> tuple[dict[str, Any], int, int | None]:
        """The probe in a pod of its own, held after its ops: its lines as {op: rc or
        fields}, what the budget charged it, and NVML's used memory for its process."""
        assert self.probe is not None
        pod = self.pod(name)
        proc = start([str(self.probe), "linked", *ops, "hold"], self.env(pod))
        assert proc.stdout is not None
        lines: dict[str, Any] = {}
        for line in proc.stdout:
            if line.strip() == "holding":
                break
            op, _, rest = line.strip().partition(" ")
            fields = dict(part.split("=", 1) for part in rest.split() if "=" in part)
            lines[op] = int(fields["rc"]) if list(fields) == ["rc"] else fields
        charged = budget_used(pod, proc.pid)
        nvml = self.nvml_process_used(proc.pid)
        proc.kill()
        _, err = proc.communicate()
        lines["shim"] = [x for x in err.splitlines() if x.startswith("gpupack-cuda")][:4]
        return lines, charged, nvml

    def nvml_process_used(self, pid: int) -> int | None:
        query = [
            "nvidia-smi",
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ]
        done = command(query, env=self.env(None))
        for line in done.stdout.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
                return int(fields[1]) << 20
        return None

    def driver_cases(self) -> None:
        """What frameworks do not exercise, through the driver API itself (the probe)."""
        if self.probe is None:
            self.check("driver-api", {"error": "no probe"}, False, "the probe builds")
            return
        six = 6 * GIB
        rounds = [op for n in range(3) for op in (f"vmm:{six}=r{n}", f"release:r{n}")]
        r, charged, nvml = self.probe_run("vmm", "ctx", *rounds)
        r.update(budget=charged, nvml_process_used=nvml)
        self.check(
            "vmm-release-while-mapped",
            r,
            r.get(f"vmm:{six}=r0") == 0
            and r.get(f"vmm:{six}=r1") == 2
            and r.get(f"vmm:{six}=r2") == 2
            and nvml is not None
            and nvml <= LIMIT + 64 * MIB,
            "6 GiB created, mapped, released: still charged, so a second is refused",
        )
        r, charged, nvml = self.probe_run(
            "graph", "ctx", f"graph:{16 * GIB}=big", "launch:big", f"graph:{4 * GIB}=g",
            "launch:g", "info",
        )  # fmt: skip
        r.update(budget=charged, nvml_process_used=nvml)
        self.check(
            "graph-memory-node",
            r,
            r.get("launch:big") == 2
            and r.get("launch:g") == 0
            and int(r.get("info", {}).get("free", LIMIT)) <= LIMIT - 4 * GIB,
            "a 16 GiB allocation node refused at launch; a 4 GiB one charged as reserved",
        )
        r, charged, nvml = self.probe_run(
            "capture", "ctx", f"capture:{6 * GIB}=k", "launch:k", f"alloc:{3 * GIB}"
        )
        r.update(budget=charged, nvml_process_used=nvml)
        self.check(
            "captured-allocation",
            r,
            r.get(f"capture:{6 * GIB}=k") == 0
            and r.get("launch:k") == 0
            and r.get(f"alloc:{3 * GIB}") == 2,
            "a captured 6 GiB cuMemAllocAsync is charged at launch: 3 GiB more refused",
        )
        r, charged, nvml = self.probe_run("stress", "ctx", f"hammer:16:2000:{16 * MIB}", "info")
        r.update(budget=charged, nvml_process_used=nvml)
        self.check(
            "stress",
            r,
            nvml is not None and abs(charged - nvml) <= 32 * MIB,
            "16 threads of alloc/free (addresses reused): the budget ends at what NVML says "
            "the process holds",
        )

    def nvidia_smi(self) -> None:
        query = [
            "nvidia-smi",
            "--query-gpu=memory.total,memory.used,memory.free",
            "--format=csv,noheader,nounits",
        ]
        plain = command(query, env=self.env(None))
        shimmed = command(query, env=self.env(self.pod("smi")))
        table = command(["nvidia-smi"], env=self.env(self.pod("smi")))
        total = shimmed.stdout.split(",")[0].strip() if shimmed.returncode == 0 else None
        mib_line = next((line for line in table.stdout.splitlines() if "MiB /" in line), "")
        result = {
            "without_shim": plain.stdout.strip(),
            "with_shim": shimmed.stdout.strip(),
            "table_line": mib_line.strip(),
            "stderr": shimmed.stderr.strip()[-300:],
        }
        self.check(
            "nvidia-smi",
            result,
            total == str(LIMIT >> 20),
            "memory.total under the shim = 8192 MiB",
        )

    def context_cost(self) -> None:
        pod = self.pod("context")
        before = self.nvml_used()
        proc = start([sys.executable, "-c", CASES["context"]], self.env(pod))
        assert proc.stdout is not None
        seen = json.loads(proc.stdout.readline() or "{}")
        after = self.nvml_used()
        charged = budget_used(pod)
        proc.kill()
        proc.wait()
        result = {
            "nvml_used_delta": after - before if before is not None and after is not None else None,
            "budget_charged": charged,
            "free_seen": seen.get("free"),
            "total_seen": seen.get("total"),
        }
        self.check(
            "context",
            result,
            charged > 0 and seen.get("free", LIMIT) <= LIMIT - charged,
            "a process's context is charged to the budget (NVML's used before and after)",
        )

    def nvml_used(self) -> int | None:
        done = command(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            env=self.env(None),
        )
        return (
            int(done.stdout.split()[0]) << 20
            if done.returncode == 0 and done.stdout.strip()
            else None
        )

    def mps_client(self) -> None:
        if not shutil.which("nvidia-cuda-mps-control"):
            self.check(
                "mps-client",
                {"error": "no nvidia-cuda-mps-control"},
                False,
                "an MPS client under the shim",
            )
            return
        mps = self.scratch / "mps"
        (mps / "pipe").mkdir(parents=True)
        (mps / "log").mkdir()
        env = self.env(
            None, CUDA_MPS_PIPE_DIRECTORY=str(mps / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(mps / "log")
        )
        started = command(["nvidia-cuda-mps-control", "-d"], env=env)
        try:
            pod = self.pod("mps")
            extra = {
                "CUDA_MPS_PIPE_DIRECTORY": str(mps / "pipe"),
                "CUDA_MPS_LOG_DIRECTORY": str(mps / "log"),
            }
            r = self.program("torch-default", pod, **extra)
            r["daemon_started"] = started.returncode == 0
            servers = command(["pgrep", "-f", "nvidia-cuda-mps-server"])
            r["mps_server_running"] = bool(servers.stdout.strip())
            self.check(
                "mps-client",
                r,
                r.get("total") == LIMIT
                and LIMIT - 2 * GIB < r.get("allocated_to_oom", 0) <= LIMIT
                and r["mps_server_running"],
                "a client of an MPS daemon sees 8 GiB and is stopped there",
            )
        finally:
            command(["nvidia-cuda-mps-control"], input="quit\n", env=env, timeout=30)

    def overhead(self) -> None:
        steps = {"without": [], "with": []}  # type: dict[str, list[float]]
        for _ in range(3):
            for which, pod in (("without", None), ("with", self.pod("train", 64 * GIB))):
                r = self.program("train-step", pod, "30", GPUPACK_CUDA_QUIET="1")
                if "median_step_s" in r:
                    steps[which].append(r["median_step_s"])
        calls: dict[str, float] = {}
        for which, pod in (("without", None), ("with", self.pod("calls", 64 * GIB))):
            rates: list[float] = []
            if self.probe is None:
                break
            for _ in range(3):
                done = command(
                    [str(self.probe), "linked", "ctx", "bench:20000:1048576"],
                    env=self.env(pod, GPUPACK_CUDA_QUIET="1"),
                    timeout=120,
                )
                for line in done.stdout.splitlines():
                    if line.startswith("bench rc=0"):
                        rates.append(float(line.rsplit("=", 1)[1]))
            calls[which] = statistics.median(rates) if rates else 0.0
        ratio = (
            statistics.median(steps["with"]) / statistics.median(steps["without"])
            if steps["with"] and steps["without"]
            else None
        )
        result = {
            "train_step_s": steps,
            "train_step_ratio": ratio,
            "alloc_free_pairs_per_s": calls,
            "alloc_call_ratio": calls["with"] / calls["without"] if calls.get("without") else None,
        }
        self.check(
            "overhead",
            result,
            ratio is not None and ratio <= 1.02,
            "training step with/without <= 1.02",
        )

    def compute_shares(self) -> None:
        gpu_proof_compute.run(self)


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "gpu-proof-out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    shim, probe = build(out)
    proof = Proof(out, shim, probe)
    only = (
        os.environ.get("GPU_PROOF_CASES", "").split(",")
        if os.environ.get("GPU_PROOF_CASES")
        else None
    )
    if only:
        for name in only:
            getattr(proof, name.replace("-", "_"))()
    else:
        proof.run_all()
    (out / "shim.json").write_text(json.dumps(proof.results, indent=2))
    passed = len(proof.results) - len(proof.failed)
    print(
        f"memory shim on a real GPU: {passed} of {len(proof.results)} passed"
        + (f"; failed: {', '.join(proof.failed)}" if proof.failed else "")
    )
    return 1 if proof.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
