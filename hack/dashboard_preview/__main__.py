"""`python -m hack.dashboard_preview [--out docs/dashboard.png]`: needs the pinned
prometheus and promtool (`GPUPACK_BIN_DIR`, which hack/lib/binaries.sh sets)."""

import argparse
import functools
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hack.dashboard_preview.draw import draw
from hack.dashboard_preview.query import evaluate, prometheus_over
from hack.dashboard_preview.simulate import DASHBOARD, OUT, simulate


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Draw docs/dashboard.png: a preview of the Grafana dashboard."
    )
    parser.add_argument(
        "--out", type=Path, default=OUT, help="the PNG to write (default: %(default)s)"
    )
    parser.add_argument(
        "--bin-dir",
        type=Path,
        default=Path(os.environ.get("GPUPACK_BIN_DIR", "")),
        help="where prometheus and promtool are (default: $GPUPACK_BIN_DIR)",
    )
    args = parser.parse_args(argv)
    if not (args.bin_dir / "prometheus").is_file():
        parser.error(
            "no prometheus in --bin-dir: run `source hack/lib/venv.sh && source "
            "hack/lib/binaries.sh && ensure_binaries` first, or pass --bin-dir"
        )
    with prometheus_over(simulate(), args.bin_dir) as prometheus:
        draw(json.loads(DASHBOARD.read_text()), functools.partial(evaluate, prometheus), args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
