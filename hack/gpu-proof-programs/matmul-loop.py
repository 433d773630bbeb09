import json
import sys
import time

import torch

# argv: FROM TO (time.time() seconds) [SIZE]: matmuls until TO, counted from FROM.
start, end = float(sys.argv[1]), float(sys.argv[2])
size = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
a = torch.randn(size, size, device="cuda")
b = torch.randn(size, size, device="cuda")
done = 0
while time.time() < end:
    for _ in range(4):
        a @ b
    torch.cuda.synchronize()
    if time.time() >= start:
        done += 4
print(json.dumps({"iterations": done, "window_s": end - start}))
