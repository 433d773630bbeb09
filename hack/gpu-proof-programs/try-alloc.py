import json
import sys

import torch

free, total = torch.cuda.mem_get_info()
try:
    x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
    ok, error = True, ""
except torch.OutOfMemoryError as e:
    ok, error = False, str(e).splitlines()[0][:200]
print(
    json.dumps(
        {"free": free, "total": total, "asked": int(sys.argv[1]), "granted": ok, "error": error}
    )
)
