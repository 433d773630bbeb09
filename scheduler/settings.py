"""The scheduler's settings (from the command line)."""

from dataclasses import dataclass

from gpupack import keys
from gpupack.capacity import DEFAULT_IMAGE


@dataclass(frozen=True, slots=True)
class Settings:
    identity: str = "gpupack-scheduler"
    scheduler_name: str = keys.SCHEDULER_NAME
    namespace: str = keys.SYSTEM_NAMESPACE
    grace_period: float = 15.0  # seconds an empty capacity pod no headroom needs stays
    headroom_pods: int = 1  # room a pool keeps: this many more of its largest share
    unused_grace: float = 30.0  # ... one that never held a share since it was created
    orphan_grace: float = 30.0  # seconds before a pod on a vanished GPU is evicted
    capacity_image: str = DEFAULT_IMAGE
    mps_image: str | None = None  # MPS pools' capacity pods
    workers: int = 8  # threads for capacity writes
    housekeeping_interval: float = 2.0
    reservation_timeout: float = 60.0  # seconds a GPU share is held from filter for a bind
    consolidation_interval: float = 30.0  # seconds between consolidation rounds; 0: never
    drain_timeout: float = 300.0  # seconds a GPU may stay draining before it is given back
    budgets_configmap: str = ""  # where consolidation budgets outlive a leader; "": nowhere
    deletion_cost: bool = True  # keep ReplicaSet pods' pod-deletion-cost = their GPU's fill
    autoscaler: str = "auto"  # scheduler.exclusion.Autoscaler: how avoided nodes are named
