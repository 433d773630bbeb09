import json
import sys
import time

import torch

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
    t = time.perf_counter()
    step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"median_step_s": times[len(times) // 2]}))
