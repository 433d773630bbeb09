import json

import torch

torch.cuda.init()
torch.empty(1, device="cuda")
free, total = torch.cuda.mem_get_info()
want = int(0.9 * total)
in_use = total - free
kv = torch.empty(want - in_use, dtype=torch.uint8, device="cuda")
free_after, _ = torch.cuda.mem_get_info()
print(
    json.dumps(
        {
            "total": total,
            "free_at_start": free,
            "target_0.9_total": want,
            "kv_cache_bytes": kv.numel(),
            "free_after": free_after,
        }
    )
)
