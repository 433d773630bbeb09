"""The webhook's view of the cluster: five informers and the capacity planner.

`connect` returns None when there is no cluster to talk to (the server then runs without
namespace opt-in lookups, GPUPolicy objects, recommendations and capacity planning).
`Cluster` is what the server uses: `synced`, `namespace(name)`, `policies` (the
PolicySet in force, from the GPUPolicy objects in the system namespace),
`recommendation(namespace, kind, name)` (a workload's GPURecommendation, parsed),
`plan_capacity(demand, dry_run)`, `start`, `stop`. Policies and recommendations are
parsed when their watch caches change (`webhook.rightsizing`), never per admission.
`plan_capacity` plans from the caches on the event loop and answers at once (no API
call): whether the pod's pool holds it, or how many GPUs it lacks. Creating capacity is
gpupack-scheduler's alone (`webhook.capacity`).
"""

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from gpupack import keys
from gpupack.objects import JSON
from gpupack.policy import API_VERSION as POLICY_API_VERSION
from gpupack.policy import PLURAL as POLICY_PLURAL
from gpupack.policy import PolicySet
from gpupack.recommendation import Recommendation, list_path
from gpupack.runtime import config
from gpupack.runtime.api import ApiError
from gpupack.runtime.informer import WATCH_TIMEOUT_SECONDS, Informer
from gpupack.runtime.transport import Transport
from webhook.capacity import (
    DECISION_INDEX,
    POOL_INDEX,
    RESERVATION_TTL,
    CapacityManager,
    capacity_pool,
    decision_of,
    fractional_pool,
    planned,
)
from webhook.decision import CapacityOutcome, Demand
from webhook.kube import KubeClient
from webhook.rightsizing import PolicyCache, RecommendationCache

log = logging.getLogger(__name__)
NAMESPACES_PATH: Final = "/api/v1/namespaces"
# An admission waits at most this for a Namespace its cache may have stale (a replica
# cut off from the API server waits it out, then trusts the API server's selectors).
NAMESPACE_READ_TIMEOUT: Final = 2.0
ALL_PODS_PATH: Final = "/api/v1/pods"


def policies_path(namespace: str) -> str:
    """The GPUPolicy objects of one namespace (the webhook reads the system namespace's)."""
    return f"/apis/{POLICY_API_VERSION}/namespaces/{namespace}/{POLICY_PLURAL}"


class Cluster:
    """Informers for namespaces, capacity pods, fractional pods, GPUPolicy objects and
    GPURecommendations, plus capacity planning."""

    def __init__(
        self,
        client: KubeClient,
        *,
        system_namespace: str = keys.SYSTEM_NAMESPACE,
        reservation_ttl: float = RESERVATION_TTL,
        clock: Callable[[], float] = time.monotonic,
        server_time: Callable[[], float] = time.time,
        watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
    ) -> None:
        self.now = server_time  # the API server's time: `ClusterPort.now`
        self.namespaces = Informer(
            client,
            NAMESPACES_PATH,
            name="namespaces",
            watch_timeout_seconds=watch_timeout_seconds,
        )
        self.capacity_pods = Informer(
            client,
            f"/api/v1/namespaces/{system_namespace}/pods",
            {"labelSelector": f"{keys.ROLE}={keys.ROLE_CAPACITY}"},
            name="capacity-pods",
            indexers={POOL_INDEX: capacity_pool},
            watch_timeout_seconds=watch_timeout_seconds,
            keep=planned,
        )
        self.fractional_pods = Informer(
            client,
            ALL_PODS_PATH,
            {"fieldSelector": f"spec.schedulerName={keys.SCHEDULER_NAME}"},
            name="fractional-pods",
            indexers={POOL_INDEX: fractional_pool, DECISION_INDEX: decision_of},
            watch_timeout_seconds=watch_timeout_seconds,
            keep=planned,
        )
        self.capacity = CapacityManager(
            self.capacity_pods, self.fractional_pods, ttl=reservation_ttl, clock=clock
        )
        self._policies = PolicyCache()
        self.gpupolicies = Informer(
            client,
            policies_path(system_namespace),
            name="gpupolicies",
            watch_timeout_seconds=watch_timeout_seconds,
            on_change=self._policies_changed,
        )
        self._recommendations = RecommendationCache()
        self.gpurecommendations = Informer(
            client,
            list_path(),
            name="gpurecommendations",
            watch_timeout_seconds=watch_timeout_seconds,
            on_change=self._recommendation_changed,
        )
        self._informers = (
            self.namespaces,
            self.capacity_pods,
            self.fractional_pods,
            self.gpupolicies,
            self.gpurecommendations,
        )
        self._client = client

    @property
    def synced(self) -> bool:
        """Every informer has completed its first list, and the policies and recommendations
        have been parsed from it."""
        return (
            all(informer.synced for informer in self._informers)
            and self._policies.ready
            and self._recommendations.ready
        )

    def namespace(self, name: str) -> JSON | None:
        """The Namespace object from the cache, None when unknown (or not synced yet)."""
        return self.namespaces.get(name)

    def read_namespace(self, name: str) -> JSON | None:
        """The Namespace as the API server has it now (within NAMESPACE_READ_TIMEOUT), None
        when it does not exist; raises ApiError when it cannot be read."""
        try:
            return self._client.get(f"{NAMESPACES_PATH}/{name}", timeout=NAMESPACE_READ_TIMEOUT)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    @property
    def policies(self) -> PolicySet:
        """The policies in force: the built-ins overlaid by the valid GPUPolicy objects."""
        return self._policies.current

    def recommendation(self, namespace: str, kind: str, name: str) -> Recommendation | None:
        """The workload's GPURecommendation; None when absent, unparsable or without a value."""
        return self._recommendations.lookup(namespace, kind, name)

    def _policies_changed(self, key: str) -> None:  # on the gpupolicies informer's thread
        self._policies.update(self.gpupolicies.items())

    def _recommendation_changed(self, key: str) -> None:  # on its informer's thread
        if key:
            self._recommendations.changed(key, self.gpurecommendations.get(key))
        else:
            self._recommendations.reset(self.gpurecommendations.items())

    def plan_capacity(self, demand: Demand, dry_run: bool) -> CapacityOutcome:
        return self.capacity.plan(demand, dry_run)

    def start(self) -> None:
        for informer in self._informers:
            informer.start()

    def stop(self, timeout: float = 5.0) -> None:
        for informer in self._informers:
            informer.stop(timeout=0)  # interrupt all first, then wait for each
        for informer in self._informers:
            informer.join(timeout)
        self._client.close()


def connect(
    kubeconfig: str | None,
    *,
    system_namespace: str = keys.SYSTEM_NAMESPACE,
    reservation_ttl: float = RESERVATION_TTL,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> Cluster | None:
    """A (not yet started) Cluster, or None when `gpupack.runtime.config` finds no
    cluster (the webhook then serves without one). Raises ConfigError (a ValueError)
    when a named kubeconfig does not load."""
    loaded = config.load(kubeconfig, environ=environ, home=home)
    if loaded is None:
        return None
    log.info("using %s", loaded.source)
    transport = Transport(loaded.configuration, user_agent="gpupack-webhook")
    return Cluster(
        transport,
        system_namespace=system_namespace,
        reservation_ttl=reservation_ttl,
        server_time=transport.server_clock.now,
    )
