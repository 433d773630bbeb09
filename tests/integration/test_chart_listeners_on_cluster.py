"""Every server gpupack runs, started with the arguments the chart renders (the harness
reads them from `helm template`, hack/localcluster/containers.py), answers over IPv4 and
IPv6 loopback alike: a pod's probes and Services reach it whatever the cluster's family.

The chart once started the webhook without `--host`, and uvicorn's listener on `::` was
IPv6-only: on an IPv4 cluster the kubelet's probes never passed. Only the extender's
filter/bind port is loopback-IPv4 by design (the chart passes `--address=127.0.0.1`:
only the kube-scheduler beside it may call it, and every pod has 127.0.0.1); its
metrics and probes port is dual-stack like the rest. The MPS daemon's probes are exec
probes (`gpupack-mps-daemon --check`): it has no port."""

import http.client
import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from gpupack.runtime.endpoints import ANY, listen_family
from hack.localcluster import LocalCluster, chart
from tests.exporter.podresources_server import short_tempdir

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        listen_family(ANY)[0] != socket.AF_INET6, reason="this machine's kernel has no IPv6"
    ),
]
LOOPBACKS = ("127.0.0.1", "::1")


def status(host: str, port: int, path: str, context: ssl.SSLContext | None = None) -> int:
    connection = (
        http.client.HTTPSConnection(host, port, context=context, timeout=10)
        if context
        else http.client.HTTPConnection(host, port, timeout=10)
    )
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    except OSError as error:
        return -error.errno if error.errno else -1
    finally:
        connection.close()


@pytest.fixture(scope="module")
def components(scheduler: LocalCluster) -> Iterator[tuple[LocalCluster, dict[str, int]]]:
    """The webhook (session), the scheduler (module), a recommender, an exporter and the
    MPS CSI driver beside it, each as the chart runs it, and their metrics ports."""
    scheduler.install_recommender(name="listeners-recommender")
    with short_tempdir() as directory:
        _, exporter_port = scheduler.install_exporter(
            "listeners-node", pod_resources_socket=directory / "kubelet.sock"
        )
        _, csi_port = scheduler.install_mps_csi("listeners-node", directory / "csi")
        ports = {
            "extender": scheduler.metrics_targets[chart.SCHEDULER_NAME].port,
            "recommender": scheduler.metrics_targets["listeners-recommender"].port,
            "exporter": exporter_port,
            "mps-csi": csi_port,
        }
        for port in ports.values():  # started: answering on either family
            deadline = time.monotonic() + 60
            while all(status(host, port, "/healthz") < 0 for host in LOOPBACKS):
                assert time.monotonic() < deadline, f"nothing listens on port {port}"
                time.sleep(0.2)
        try:
            yield scheduler, ports
        finally:
            scheduler.stop_exporter("listeners-node")
            scheduler.stop_mps_csi("listeners-node")
            scheduler.stop_recommender("listeners-recommender")


@pytest.mark.parametrize("host", LOOPBACKS)
def test_the_webhook_answers_https_and_metrics_on_both_families(
    components: tuple[LocalCluster, dict[str, int]], host: str
) -> None:
    cluster, _ = components
    context = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
    context.check_hostname = False  # the certificate names the Service; this is the socket
    assert status(host, cluster.webhook_port, "/healthz", context) == 200
    assert status(host, cluster.webhook_metrics_port, "/metrics") == 200


@pytest.mark.parametrize("host", LOOPBACKS)
@pytest.mark.parametrize("component", ["extender", "recommender", "exporter", "mps-csi"])
def test_each_component_serves_metrics_and_probes_on_both_families(
    components: tuple[LocalCluster, dict[str, int]], component: str, host: str
) -> None:
    _, ports = components
    assert status(host, ports[component], "/metrics") == 200
    assert status(host, ports[component], "/healthz") == 200


def test_the_extender_verbs_answer_on_loopback_ipv4_only(
    components: tuple[LocalCluster, dict[str, int]],
) -> None:
    cluster, _ = components
    (port,) = [
        int(arg.split("=", 1)[1])
        for arg in cluster.processes[chart.SCHEDULER_NAME].args
        if arg.startswith("--port=")
    ]
    assert status("127.0.0.1", port, "/healthz") in (200, 404)
    assert status("::1", port, "/healthz") < 0  # refused: not listening there
