"""Replicas whose clocks disagree, on a real control plane.

Each skewed component runs with its wall clock moved by libfaketime
(`hack.localcluster.clock`), as on a node whose time sync failed; the API server, etcd
and kube-scheduler keep the machine's. What is at stake, and where:

- seals: a webhook replica seals each pod it rewrites with a time, and a reinvocation
  (another team's webhook changed the pod after ours) may reach another replica, which
  checks the seal's age: both must keep the API server's time, not their nodes';
- certificates: a replica whose clock is behind the one that issued its certificate
  must still find it valid, and the API server's;
- leases: a leader writes renewTime with its clock; a standby whose clock is far ahead
  of it must not take the Lease while the leader renews;
- reservations and leadership of the extender, whose clock runs ahead of
  kube-scheduler's, whose Lease it follows.
"""

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from gpupack import keys, seal
from hack.localcluster import SYSTEM_NAMESPACE, ApiError, Kube, LocalCluster
from hack.localcluster.clock import skewed
from hack.localcluster.processes import routable_address
from ops.audit_reader import parse_lines
from tests.integration.neighbour import TOUCHED, Neighbour
from tests.integration.partition import Partition
from tests.integration.scheduling import (
    FAST,
    FAST_LEASE,
    assert_consistent,
    component_metric,
    create,
    scheduler_metric,
    wait_bound,
)
from tests.integration.tools import webhook_cluster_of_its_own
from tests.integration.workloads import deployment, gpu_pod

pytestmark = pytest.mark.integration
JSON = dict[str, Any]
SHARE = {keys.GPU_COMPUTE: "250m"}
MINUTE = 60


def audit(cluster: LocalCluster, replica: str) -> list[JSON]:
    path = cluster.workdir / "logs" / f"{replica}.audit.log"
    return list(parse_lines(path.read_text().splitlines())) if path.exists() else []


@pytest.fixture(scope="module")
def clock_cluster(
    tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster | None
) -> Iterator[LocalCluster]:
    yield from webhook_cluster_of_its_own(tmp_path_factory, cluster, "clocks")


class Replicas:
    """Webhook replicas behind the webhook's Service, started with their nodes' clocks.
    Each is reached through a relay (`Partition`) whose connections `reset` ends: the
    API server keeps one connection to one endpoint for as long as it lasts, and picks
    an endpoint again only when it opens a new one."""

    def __init__(self, cluster: LocalCluster, stack: ExitStack) -> None:
        self.cluster = cluster
        self.address = routable_address()
        self._stack = stack
        self.relays: dict[str, Partition] = {}

    def start(self, name: str, offset: int) -> None:
        process, port = self.cluster.start_webhook_replica(
            name, self.address, node_env=skewed(offset) if offset else None
        )
        self._stack.callback(process.stop)
        relay = Partition((self.address, port), host=self.address)
        self.relays[name] = self._stack.enter_context(relay)

    def route(self, *names: str) -> None:
        self.cluster.route_webhook([(self.address, self.relays[name].port) for name in names])
        self.cluster.stop_webhook()  # the loopback process install_webhook started

    def reset(self) -> None:
        """End the API server's connections to every replica."""
        for relay in self.relays.values():
            relay.reset()
        time.sleep(0.1)  # until the API server has read their end


def wait_serving(
    kube: Kube, cluster: LocalCluster, ns: str, *replicas: str, neighbour: bool = True
) -> None:
    """Until each of `replicas` has admitted a pod of `ns`, and the neighbour has touched
    one (the API server watches endpoints and registrations, it does not read them)."""

    def serving() -> bool:
        pod = kube.create(
            f"/api/v1/namespaces/{ns}/pods",
            gpu_pod(f"probe-{time.monotonic_ns()}", annotations=SHARE),
        )
        touched = TOUCHED in (pod["metadata"].get("annotations") or {})
        return (touched or not neighbour) and all(audit(cluster, name) for name in replicas)

    kube.wait_for(f"{', '.join(replicas)} to admit pods", serving, timeout=60)


def calls(cluster: LocalCluster, replicas: list[str], pods: list[str]) -> dict[str, list[str]]:
    """Each pod's admissions as `replica:reason`, the first call first (their audit
    times come from clocks that disagree: the reason tells the first call apart)."""
    seen: dict[str, list[str]] = {pod: [] for pod in pods}
    for replica in replicas:
        for line in audit(cluster, replica):
            if line["pod"] in seen:
                seen[line["pod"]].append(f"{replica}:{line['reason']}")
    return {
        pod: sorted(c, key=lambda call: not call.endswith(":mutated")) for pod, c in seen.items()
    }


def crossed(history: list[str]) -> bool:
    """Rewritten by one replica and called again at another."""
    return len({call.split(":")[0] for call in history}) > 1


def issued(cluster: LocalCluster, pod: JSON) -> int:
    """When the pod's seal was issued (Unix seconds), once it verifies with the decision
    key the replicas share."""
    key = seal.load_key(cluster.decision_key_file.read_bytes(), "the decision key")
    meta = pod["metadata"]
    return seal.verify(key, meta["namespace"], meta.get("annotations") or {})


def test_webhook_replicas_twenty_minutes_apart_seal_by_the_api_servers_clock(
    clock_cluster: LocalCluster, tmp_path: Path
) -> None:
    """One replica's node is 10 minutes ahead, the other's 10 minutes behind: four times
    the seal's 5 minutes. A pod sealed by one and called again at the other must be left
    as it is (it was denied as a stale seal while each replica sealed by its own clock),
    and every seal must carry the API server's time."""
    cluster = clock_cluster
    kube = cluster.kube()
    ns = kube.create_namespace("it-clocks", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    with ExitStack() as stack:
        replicas = Replicas(cluster, stack)
        replicas.start("webhook-ahead", +10 * MINUTE)
        replicas.start("webhook-behind", -10 * MINUTE)
        replicas.route("webhook-ahead", "webhook-behind")
        stack.enter_context(Neighbour(kube, ns, tmp_path / "neighbour", replicas.reset))
        wait_serving(kube, cluster, ns, "webhook-ahead", "webhook-behind")

        names = [f"apart-{index}" for index in range(24)]
        denied, late = {}, []
        for name in names:
            try:
                pod = kube.create(f"/api/v1/namespaces/{ns}/pods", gpu_pod(name, annotations=SHARE))
            except ApiError as error:
                denied[name] = error.body
                continue
            annotations = pod["metadata"].get("annotations") or {}
            assert keys.DECISION in annotations, pod["metadata"]
            assert TOUCHED in annotations, pod["metadata"]
            off = issued(cluster, pod) - time.time()  # the API server's clock is this machine's
            if abs(off) > 5:
                late.append(f"{name}: {off:+.0f} s")

        history = calls(cluster, ["webhook-ahead", "webhook-behind"], names)
    assert denied == {}, history
    assert late == [], late
    assert all(len(h) == 2 and h[0].endswith(":mutated") for h in history.values()), history
    assert all(h[1].endswith(":already-mutated") for h in history.values()), history
    across = [pod for pod, h in history.items() if crossed(h)]
    assert across, f"no reinvocation reached the other replica: {history}"
    print(f"20 min apart: {len(across)} of {len(names)} pods called again at the other replica")


def test_a_replica_half_an_hour_behind_its_certificates_issuer_serves_and_admits(
    clock_cluster: LocalCluster,
) -> None:
    """The serving certificate was issued moments ago by a clock 30 minutes ahead of the
    replica's, and so was the API server's: the replica must still find both valid
    (ready, and its watches connected), and rewrite pods."""
    cluster = clock_cluster
    kube = cluster.kube()
    ns = kube.create_namespace("it-clocks-behind", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    with ExitStack() as stack:
        replicas = Replicas(cluster, stack)
        replicas.start("webhook-behind", -30 * MINUTE)  # fails here if it is never ready
        replicas.route("webhook-behind")
        wait_serving(kube, cluster, ns, "webhook-behind", neighbour=False)
        pod = kube.create(f"/api/v1/namespaces/{ns}/pods", gpu_pod("behind", annotations=SHARE))
    assert keys.DECISION in (pod["metadata"].get("annotations") or {}), pod["metadata"]
    # One call: the webhook wrote the tolerations ExtendedResourceToleration would add
    # when run again after it, so nothing changed the pod after the webhook.
    reasons = [
        line["reason"] for line in audit(cluster, "webhook-behind") if line["pod"] == "behind"
    ]
    assert reasons == ["mutated"], reasons


RECOMMENDER_LEASE = (
    f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/gpupack-recommender"
)


def test_a_standby_an_hour_ahead_of_the_leader_waits_while_it_renews_and_takes_over_after(
    local_cluster: LocalCluster,
) -> None:
    """Two recommenders with the chart's Lease timings: the leader's clock an hour
    behind, the standby's an hour ahead. The leader's renewTime looks two hours old to
    the standby, which must still wait while it changes, and take over once it stops."""
    cluster = local_cluster
    kube = cluster.kube()
    behind, ahead = "recommender-behind", "recommender-ahead"
    assert not any(name.startswith("gpupack-recommender") for name in cluster.processes)
    with ExitStack() as stack:
        cluster.install_recommender(name=behind, node_env=skewed(-60 * MINUTE))
        stack.callback(cluster.stop_recommender, behind)
        kube.wait_for(
            "the first recommender leading",
            lambda: kube.get(RECOMMENDER_LEASE)["spec"].get("holderIdentity") == behind,
            timeout=60,
        )
        cluster.install_recommender(name=ahead, node_env=skewed(+60 * MINUTE))
        stack.callback(cluster.stop_recommender, ahead)
        kube.wait_for(
            "the standby serving its metrics",
            lambda: component_metric(cluster, ahead, "gpupack_recommender_leader") is not None,
            timeout=60,
        )
        lease = kube.get(RECOMMENDER_LEASE)["spec"]
        duration = float(lease["leaseDurationSeconds"])
        watched_until = time.monotonic() + duration + 10  # past the standby's first expiry
        renewals = set()
        while time.monotonic() < watched_until:
            spec = kube.get(RECOMMENDER_LEASE)["spec"]
            assert spec["holderIdentity"] == behind, spec
            renewals.add(spec["renewTime"])
            assert component_metric(cluster, ahead, "gpupack_recommender_leader") == 0.0
            time.sleep(1)
        assert component_metric(cluster, behind, "gpupack_recommender_leader") == 1.0
        assert len(renewals) > 3, renewals  # the leader did renew meanwhile

        cluster.processes[behind].kill()  # no release: the Lease must expire
        stopped = time.monotonic()
        kube.wait_for(
            "the standby holding the Lease",
            lambda: kube.get(RECOMMENDER_LEASE)["spec"].get("holderIdentity") == ahead,
            timeout=duration * 3,
        )
        took = time.monotonic() - stopped
        kube.wait_for(
            "the standby reporting that it leads",
            lambda: component_metric(cluster, ahead, "gpupack_recommender_leader") == 1.0,
            timeout=30,
        )
    assert took >= duration - 2, f"took over {took:.1f} s after the leader stopped"
    print(f"Lease {duration:.0f} s: the standby an hour ahead took over {took:.1f} s after")


def test_an_extender_an_hour_ahead_of_kube_scheduler_leads_and_books_each_share_once(
    scheduler: LocalCluster, opted_in_namespace: str
) -> None:
    """The extender follows the Lease of the kube-scheduler beside it, whose renewTime is
    an hour behind the extender's clock, and holds reservations between filter and
    bind: with its clock an hour ahead it must still lead, and place a burst with every
    share booked once. How long a pod has waited compares its creationTimestamp (the API
    server's clock) with now: by the extender's own clock, an hour too long."""
    cluster, ns = scheduler, opted_in_namespace
    kube = cluster.kube()
    began = time.monotonic()  # no pod of this test is older
    cluster.stop_scheduler()
    try:
        cluster.install_scheduler(extra_args=FAST, sets=FAST_LEASE, node_env=skewed(60 * MINUTE))
        kube.wait_for(
            "the extender to lead",
            lambda: scheduler_metric(cluster, "gpupack_scheduler_leader") == 1.0,
            timeout=60,
        )
        create(kube, deployment(ns, "ahead", 24, "250m"))
        pods = wait_bound(kube, ns, "ahead", 24, timeout=120)
        assert_consistent(kube, pods)
        assert scheduler_metric(cluster, "gpupack_scheduler_leader") == 1.0

        stuck = gpu_pod("nowhere", annotations=SHARE)
        stuck["spec"]["nodeSelector"] = {"gpupack.test/no-such-node": "true"}
        kube.create(f"/api/v1/namespaces/{ns}/pods", stuck)
        age = "gpupack_scheduler_oldest_pending_pod_age_seconds"
        kube.wait_for("the pod counted as waiting", lambda: scheduler_metric(cluster, age))
        waited = scheduler_metric(cluster, age) or 0.0
        assert waited <= time.monotonic() - began + 2, f"waited {waited:.0f} s"
        kube.delete(f"/api/v1/namespaces/{ns}/pods/nowhere")
    finally:
        cluster.stop_scheduler()
        cluster.install_scheduler(extra_args=FAST, sets=FAST_LEASE)
