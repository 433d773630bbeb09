"""Whether the kube-scheduler beside this extender leads: the extender's once-only work
(scale down, autoscaler marks, orphan evictions) follows that leadership.

kube-scheduler elects its leader through a Lease (`leaderElection` in the configuration
the chart renders) and names the holder `<hostname>_<random>`; in a pod the hostname is
the pod's name, which the extender gets as `--identity`. Only the leader's kube-scheduler
calls its extender, so filter and bind need no check; housekeeping does, or a standby
would delete capacity the leader just reserved. The extender never writes the Lease.

Expiry is judged by this process's clock, as `gpupack.runtime.leader` judges it: a
holder whose record has not changed for the Lease's duration since we first saw it is
no longer leading (its kube-scheduler died without releasing), whatever the clocks of
the machines say.
"""

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from gpupack.objects import JSON
from gpupack.runtime.api import ApiError
from gpupack.runtime.leader import LEASE_API, Record

log = logging.getLogger(__name__)


class LeaseReader(Protocol):
    def get(self, path: str) -> JSON: ...


class Follower:
    def __init__(
        self,
        kube: LeaseReader,
        namespace: str,
        name: str,
        identity: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._path = f"{LEASE_API}/namespaces/{namespace}/leases/{name}"
        self.identity = identity
        self._clock = clock
        self._record = Record()
        self.leading = False

    def mine(self, holder: str) -> bool:
        return holder == self.identity or holder.startswith(self.identity + "_")

    def check(self) -> bool:
        """Read the Lease; True while our kube-scheduler holds a live one."""
        now = self._clock()
        try:
            lease = self._kube.get(self._path)
        except ApiError as error:
            if error.status == 404:
                return self._set(False)
            log.warning("could not read the scheduler's Lease: %s", error)
            # Keep the last answer until the record would have expired anyway.
            return self._set(self.leading and now - self._record.since < self._record.duration)
        expired = self._record.expired(lease, now, self._record.duration)
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        return self._set(not expired and self.mine(holder))

    def _set(self, leading: bool) -> bool:
        if leading != self.leading:
            log.info(
                "the kube-scheduler beside this extender %s",
                "leads" if leading else "does not lead",
                extra={"identity": self.identity},
            )
        self.leading = leading
        return leading

    def run(self, on_change: Callable[[bool], None], stop: threading.Event, period: float) -> None:
        """Check every `period` seconds until `stop`, telling `on_change` each answer."""
        while not stop.is_set():
            on_change(self.check())
            stop.wait(period)
