import json

import torch

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
print(
    json.dumps(
        {
            "free": free,
            "total": total,
            "allocated_to_oom": held,
            "reserved_at_oom": reserved,
            "oom_error": error,
            "after_free_1gib_ok": again.numel() == 1 << 30,
        }
    )
)
