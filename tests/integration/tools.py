"""Running gpupack's own commands as a user (or a hook Job) would, from the checkout, and
clusters of their own for tests whose cluster-scoped objects would collide with the
session's."""

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hack.localcluster import LocalCluster, NodePool

REPO = Path(__file__).resolve().parents[2]
SMALL = (NodePool("cpu", 1, 0, "none", 0, "16", "64Gi"),)  # one node, no GPUs: fast


@contextmanager
def cluster_of_its_own(
    tmp_path_factory: pytest.TempPathFactory,
    session: LocalCluster | None,
    name: str,
    **options: Any,
) -> Iterator[LocalCluster]:
    """A local control plane of its own (`options` for LocalCluster); skipped when the
    session runs against an external cluster, where none can be started."""
    if session is None:
        pytest.skip(f"{name}: needs a local control plane of its own")
    with LocalCluster(tmp_path_factory.mktemp(name), **options) as local:
        yield local


def webhook_cluster_of_its_own(
    tmp_path_factory: pytest.TempPathFactory, session: LocalCluster | None, name: str
) -> Iterator[LocalCluster]:
    """A control plane of its own with one CPU node and the webhook installed, for tests
    that register the webhook by Service and run replicas of their own."""
    with cluster_of_its_own(tmp_path_factory, session, name, node_pools=SMALL) as local:
        local.install_webhook()
        yield local


def gpupack_certs(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpupack-certs --kubeconfig=KUBECONFIG ARGS...` in a process of its own."""
    return run_module("certs.cli", kubeconfig, *args)


def run_module(module: str, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE --kubeconfig=KUBECONFIG ARGS...`: a gpupack binary as the user
    (or ServiceAccount) that kubeconfig names."""
    return subprocess.run(
        [sys.executable, "-m", module, f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
