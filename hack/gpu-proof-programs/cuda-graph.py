import json

import torch

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
for _ in range(10):
    x.copy_(torch.randn(1024, 1024, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    ok = ok and torch.allclose(y, torch.relu(x @ w), atol=1e-2, rtol=1e-2)
print(json.dumps({"replays": 10, "results_match": bool(ok)}))
