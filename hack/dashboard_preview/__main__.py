"""`python -m hack.dashboard_preview [--out docs/dashboard.png]`."""

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from hack.dashboard_preview.draw import draw
from hack.dashboard_preview.simulate import DASHBOARD, OUT, simulate


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Draw docs/dashboard.png: a preview of the Grafana dashboard."
    )
    parser.add_argument(
        "--out", type=Path, default=OUT, help="the PNG to write (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    draw(json.loads(DASHBOARD.read_text()), simulate(), args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
