"""The harness cleans up after itself: after `stop()`, and when its process is killed."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hack.localcluster import Kube, LocalCluster, NodePool

pytestmark = pytest.mark.integration
ONE_NODE = (NodePool("gpu-t4", 1, 1, "Tesla-T4", 15360, "8", "32Gi"),)
CHILD = """
import json, sys, time
from pathlib import Path
from hack.localcluster import LocalCluster, NodePool
cluster = LocalCluster(Path(sys.argv[1]), node_pools=(NodePool("gpu-t4", 1, 1, "Tesla-T4", 15360, "8", "32Gi"),))
cluster.start()
ports = [cluster.api_port, int(cluster.etcd_url.rsplit(":", 1)[1])]
print(json.dumps({"pids": [p.pid for p in cluster.processes.values()], "ports": ports}), flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone for our purposes
        return stat.read().split(") ")[1][0] != "Z"


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def settle(check: object, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_stop_ends_every_process_and_frees_every_port(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, node_pools=ONE_NODE).start()
    pids = [p.pid for p in cluster.processes.values()]
    ports = [cluster.api_port, int(cluster.etcd_url.rsplit(":", 1)[1])]
    assert all(alive(pid) for pid in pids)
    cluster.stop()
    assert not [pid for pid in pids if alive(pid)]
    assert all(port_free(port) for port in ports)


def test_killing_the_owner_takes_the_cluster_down_with_it(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert child.stdout is not None
    started = json.loads(child.stdout.readline())
    assert all(alive(pid) for pid in started["pids"])
    child.send_signal(signal.SIGKILL)  # no finalizer runs: only the kernel can clean up
    child.wait()
    child.stdout.close()
    assert settle(lambda: not any(alive(pid) for pid in started["pids"]))
    assert settle(lambda: all(port_free(port) for port in started["ports"]))


def test_a_component_that_exits_on_its_own_is_started_again(
    local_cluster: LocalCluster, kube: Kube, plain_namespace: str
) -> None:
    """kube-scheduler exits when it finds its cache corrupted (an event missed while the
    API server restarted): the kubelet restarts its static pod, and so does the local
    cluster. The restarted one schedules the next pod."""
    scheduler = local_cluster.processes["kube-scheduler"]
    before = scheduler.pid
    os.killpg(before, signal.SIGKILL)
    assert settle(lambda: scheduler.alive() and scheduler.pid != before)

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "after-restart", "namespace": plain_namespace},
        "spec": {
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            "terminationGracePeriodSeconds": 0,
        },
    }
    kube.create(f"/api/v1/namespaces/{plain_namespace}/pods", pod)
    bound = kube.wait_for(
        "the restarted kube-scheduler to bind the pod",
        lambda: kube.get(f"/api/v1/namespaces/{plain_namespace}/pods/after-restart")["spec"].get(
            "nodeName"
        ),
        timeout=60,
    )
    assert bound
