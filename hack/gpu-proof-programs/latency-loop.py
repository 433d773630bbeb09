import json
import sys
import time

import torch

# argv: FROM TO (time.time() seconds): requests of 16 small matmuls each, until TO; the
# latency of those that start after FROM (an inference server's, in miniature).
start, end = float(sys.argv[1]), float(sys.argv[2])
x = torch.randn(512, 512, device="cuda")
w = torch.randn(512, 512, device="cuda")
latencies = []
while time.time() < end:
    began = time.perf_counter()
    y = x
    for _ in range(16):
        y = torch.tanh(y @ w)
    torch.cuda.synchronize()
    if time.time() >= start:
        latencies.append(time.perf_counter() - began)
    time.sleep(0.002)  # the next request arrives
latencies.sort()
n = len(latencies)
print(
    json.dumps(
        {
            "requests": n,
            "p50_ms": latencies[n // 2] * 1e3 if n else None,
            "p99_ms": latencies[n * 99 // 100] * 1e3 if n else None,
        }
    )
)
