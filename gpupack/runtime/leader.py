"""Leader election through a coordination.k8s.io/v1 Lease (client-go's algorithm).

A candidate reads the Lease; it takes it when it is free, already its own, or expired,
writing with the resourceVersion it read, so two candidates racing produce a Conflict
and one winner. Expiry is judged by the candidate's own clock: a Lease whose record has
not changed for `lease_duration` seconds since this candidate first saw it is expired,
so clock skew between machines does not matter. The leader renews every `retry_period`;
if it cannot renew for `renew_deadline` seconds it stops leading (the process then
exits and restarts as a candidate, as kube-scheduler does). On a clean shutdown the
leader releases the Lease so a standby takes over at its next retry, not after expiry.
"""

import argparse
import datetime
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from gpupack.objects import JSON
from gpupack.runtime.api import ApiError
from gpupack.runtime.args import format_duration, positive_seconds

log = logging.getLogger(__name__)


class LeaseClient(Protocol):
    """The verbs on coordination.k8s.io/v1 Leases an elector needs (get, create, update
    in its namespace: the RBAC of every leader-elected binary)."""

    def get(self, path: str) -> JSON: ...

    def create(self, path: str, body: JSON) -> JSON: ...

    def update(self, path: str, body: JSON) -> JSON: ...


LEASE_API: Final = "/apis/coordination.k8s.io/v1"


@dataclass(frozen=True, slots=True)
class Timing:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry-period < renew-deadline < lease-duration, got "
                f"{self.retry_period} / {self.renew_deadline} / {self.lease_duration}"
            )


def add_arguments(parser: argparse.ArgumentParser, lease_name: str) -> None:
    """The leader-election options every leader-elected gpupack binary takes, spelt as
    Kubernetes' own components spell them (`--leader-elect-lease-duration=15s`); the
    shorter names of earlier releases still work."""
    election = parser.add_argument_group("leader election")
    election.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="elect a leader through a Lease; turn off only for a single replica",
    )
    election.add_argument(
        "--leader-elect-resource-name",
        "--lease-name",
        dest="lease_name",
        default=lease_name,
        help="the Lease, in --namespace (default: %(default)s)",
    )
    election.add_argument(
        "--identity",
        default=f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        help="this replica's name in the Lease (default: hostname and a random suffix)",
    )
    for flag, old, default, meaning in (
        ("lease-duration", "--lease-duration", 15.0, "how long a Lease holds without renewal"),
        ("renew-deadline", "--renew-deadline", 10.0, "how long the leader keeps trying to renew"),
        ("retry-period", "--retry-period", 2.0, "how often candidates and the leader try"),
    ):
        election.add_argument(
            f"--leader-elect-{flag}",
            old,
            dest=flag.replace("-", "_"),
            type=positive_seconds,
            default=default,
            metavar="DURATION",
            help=f"{meaning} (default: {format_duration(default)})",
        )


def timing_of(args: argparse.Namespace) -> Timing:
    """The Timing `add_arguments`' options describe; ValueError when inconsistent."""
    return Timing(args.lease_duration, args.renew_deadline, args.retry_period)


def _micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(slots=True)
class Record:
    """When a Lease's record last changed, by this process's clock: the expiry judgement
    shared by a candidate (`Elector`) and a process that only follows a leader."""

    version: str = ""
    since: float = 0.0
    duration: float = 15.0  # the Lease's leaseDurationSeconds, last seen

    def expired(self, lease: JSON, now: float, default_duration: float) -> bool:
        """Observe `lease`; True when its record has not changed for its duration."""
        version = str((lease.get("metadata") or {}).get("resourceVersion", ""))
        if version != self.version:
            self.version, self.since = version, now
        spec = lease.get("spec") or {}
        self.duration = float(spec.get("leaseDurationSeconds") or default_duration)
        return now - self.since >= self.duration


class Elector:
    def __init__(
        self,
        kube: LeaseClient,
        namespace: str,
        name: str,
        identity: str,
        timing: Timing | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._path = f"{LEASE_API}/namespaces/{namespace}/leases/{name}"
        self._collection = f"{LEASE_API}/namespaces/{namespace}/leases"
        self._name = name
        self._namespace = namespace
        self.identity = identity
        self.timing = timing or Timing()
        self._clock = clock
        self._record = Record()

    def _spec(self, old: JSON | None) -> JSON:
        now = _micro_time()
        spec = dict((old or {}).get("spec") or {})
        transitions = int(spec.get("leaseTransitions") or 0)
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = transitions + (1 if old is not None else 0)
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = max(1, round(self.timing.lease_duration))
        spec["renewTime"] = now
        return spec

    def try_acquire(self) -> bool:
        """One attempt to take or renew the Lease; True while we hold it."""
        try:
            lease = self._kube.get(self._path)
        except ApiError as error:
            if error.status != 404:
                log.warning("reading lease %s failed: %s", self._name, error)
                return False
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": self._spec(None),
            }
            try:
                self._kube.create(self._collection, body)
            except ApiError as create_error:
                log.info("creating lease %s failed: %s", self._name, create_error)
                return False
            return True
        holder = (lease.get("spec") or {}).get("holderIdentity") or ""
        expired = self._record.expired(lease, self._clock(), self.timing.lease_duration)
        if holder and holder != self.identity and not expired:
            return False
        body = {**lease, "spec": self._spec(lease)}
        try:
            self._kube.update(self._path, body)
        except ApiError as error:
            log.info("taking lease %s failed: %s", self._name, error)
            return False
        return True

    def release(self) -> None:
        """Give the Lease up (clean shutdown) so a standby need not wait for expiry."""
        try:
            lease = self._kube.get(self._path)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1}
            self._kube.update(self._path, {**lease, "spec": spec})
        except ApiError as error:
            log.warning("releasing lease %s failed: %s", self._name, error)

    def run(self, lead: Callable[[threading.Event], None], stop: threading.Event) -> bool:
        """Campaign until elected, then call `lead(lost)` in a thread while renewing.

        Returns True when `stop` ended it (the Lease is released), False when leadership
        was lost (the caller should exit so nothing acts on a stale belief)."""
        while not self.try_acquire():
            if stop.wait(self.timing.retry_period):
                return True
        log.info("became the leader", extra={"lease": self._name, "identity": self.identity})
        lost = threading.Event()
        worker = threading.Thread(target=lead, args=(lost,), name="leader", daemon=True)
        worker.start()
        last_renewal = self._clock()
        clean = True
        while not stop.wait(self.timing.retry_period):
            if self.try_acquire():
                last_renewal = self._clock()
            elif self._clock() - last_renewal > self.timing.renew_deadline:
                log.error("lost the lease %s", self._name)
                clean = False
                break
        lost.set()
        worker.join(timeout=30)
        if clean:
            self.release()
        return clean
