"""Running gpupack's own commands as a user (or a hook Job) would, from the checkout."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def gpupack_certs(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpupack-certs --kubeconfig=KUBECONFIG ARGS...` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "certs.cli", f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
