"""The webhook's HTTP application: `POST /mutate`, `POST /devices`, `GET /healthz`,
`GET /readyz`.

A thin adapter around the pure decision (`webhook.mutate.decide`): read and parse the
AdmissionReview, decide, answer; then, the answer sent, plan capacity through the
cluster port (never an exception into the request), count, audit. Bad input is a 400 or 413
with `{"error": message}`, never a 5xx; a bug in the decision admits the pod unchanged.

Everything the app uses is passed to `create_app`: the cluster port (or None), the audit
log, the metrics, the clocks, the policies without a cluster. With a cluster, the
policies in force and the workloads' recommendations come from its watch caches.
No module-level state, no work at import.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Final, Protocol

import orjson
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from gpupack.errors import ContractError
from gpupack.objects import JSON, labels_of
from gpupack.policy import PolicySet
from gpupack.recommendation import Recommendation
from webhook import scope
from webhook.audit import AuditLog, audit_line
from webhook.decision import CapacityOutcome, Decision, Demand, Outcome, Reason
from webhook.devices import device_env_patch
from webhook.metrics import ErrorKind, WebhookMetrics
from webhook.mutate import MutationContext, process_key
from webhook.mutate import decide as decide_pod
from webhook.plans import PlanCache
from webhook.policies import BUILTIN_POLICIES
from webhook.review import MAX_BODY_BYTES, AdmissionRequest, ReviewError, allow, deny, parse_review

NO_CLUSTER: Final = CapacityOutcome("no-cluster", detail="no cluster access: capacity not planned")
JSON_TYPE: Final = "application/json"

log = logging.getLogger("webhook.app")

Decide = Callable[[AdmissionRequest, MutationContext], Decision]
Work = tuple[float, float]  # an admission's wall-clock and CPU seconds until its answer


class ClusterPort(Protocol):
    """What the server needs from the cluster (implemented by `webhook.cluster`)."""

    @property
    def synced(self) -> bool: ...  # the watch caches have listed; readiness depends on it

    def namespace(self, name: str) -> JSON | None: ...  # from a watch cache; None if unknown

    # The Namespace from the API server now, None if it does not exist; raises when it
    # cannot be read (within a bound of a few seconds). Called off the event loop.
    def read_namespace(self, name: str) -> JSON | None: ...

    @property
    def policies(self) -> PolicySet: ...  # built-ins overlaid by the GPUPolicy objects

    # (namespace, workload kind, workload name) -> its GPURecommendation, parsed; or None
    def recommendation(self, namespace: str, kind: str, name: str) -> Recommendation | None: ...

    # Whether the pod's pool holds it, from the watch caches: no API call, no wait, so it
    # is called on the event loop as it is (a coroutine and a timeout around it cost more
    # than the plan itself).
    def plan_capacity(self, demand: Demand, dry_run: bool) -> CapacityOutcome: ...

    # The API server's time in Unix seconds (`gpupack.runtime.serverclock`): what a seal
    # is issued at and checked against, so replicas on nodes whose clocks disagree agree.
    def now(self) -> float: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


def utc_now() -> datetime:
    return datetime.now(UTC)


def json_response(doc: JSON, status: int = 200) -> Response:
    body = orjson.dumps(doc)
    return Response(body, status_code=status, media_type=JSON_TYPE)


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body; ReviewError(413) as soon as it is known to exceed `limit`.

    Reads the ASGI messages directly: cheaper than Starlette's async-generator stream on
    the hot path, which almost always gets the whole body in one message.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise ReviewError(400, f"Content-Length {declared!r} is not a byte count")
        if int(declared) > limit:
            raise ReviewError(413, f"request body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ReviewError(413, f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def internal_error(exc: Exception) -> Decision:
    return Decision(
        Outcome.SKIPPED,
        Reason.INTERNAL_ERROR,
        f"gpupack internal error ({type(exc).__name__}: {exc}); the pod was admitted unchanged",
    )


def capacity_error(exc: BaseException) -> CapacityOutcome:
    return CapacityOutcome("error", detail=f"capacity check failed: {type(exc).__name__}: {exc}")


@dataclass(kw_only=True)
class Admissions:
    """The `POST /mutate` pipeline; one instance per app."""

    audit: AuditLog
    metrics: WebhookMetrics
    cluster: ClusterPort | None
    policies: PolicySet
    decide: Decide
    clock: Callable[[], datetime]
    timer: Callable[[], float]
    cpu_timer: Callable[[], float]  # CPU time of the calling thread (the event loop's)
    key: bytes  # the decision key pods are sealed with
    mps: bool = True  # MPS pods are shared (the node agents serve the MPS CSI driver)
    memory_enforcement: bool = False  # the node agents serve the memory shim's CSI driver

    async def mutate(self, request: Request) -> Response:
        """The answer, then what the API server need not wait for: the capacity plan, the
        counts and the audit line (`_account`). Where there is a pool to plan they run as
        the response's background task, on the event loop, once the answer is written;
        otherwise (no cluster, or a pod not rewritten) before the answer, cheaper than
        another turn of the loop.

        The admission's own work is two spans, each run without yielding the loop (but
        for the rare live read of a Namespace the cache has behind): from the body read
        to the answer, and `_account`. Their wall-clock time minus the loop thread's CPU
        time over them is what the admission waited for the GIL or a core
        (`WebhookMetrics.work`)."""
        started = self.timer()
        try:
            body = await read_body(request)
            working, cpu = self.timer(), self.cpu_timer()
            review = parse_review(body)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is listening any more
        except ReviewError as exc:
            return self._rejected(exc)
        try:
            namespace = await self._namespace(review)
        except Exception as exc:
            decision = self._failed(review, exc)
        else:
            decision = self._decision(review, namespace)
        decision, response = self._respond(review, decision)
        answered = self.timer()
        work = (answered - working, self.cpu_timer() - cpu)
        if decision.demand is None or self.cluster is None:
            self._account(review, decision, answered - started, work)
        else:
            response.background = BackgroundTask(
                self._after_answer, review, decision, answered - started, work
            )
        return response

    async def _after_answer(
        self, review: AdmissionRequest, decision: Decision, elapsed: float, work: Work
    ) -> None:
        """`_account`, once the loop has turned: a transport that sends what was written
        on the loop's next turn (uvloop's TLS before 0.23) would otherwise hold the answer
        until the plan is done."""
        await asyncio.sleep(0)
        self._account(review, decision, elapsed, work)

    def _account(
        self, review: AdmissionRequest, decision: Decision, elapsed: float, work: Work
    ) -> None:
        """The pod's pool planned (its reservation counts it for the pool's next
        admissions; the plan itself is only for the audit line), the counts, and last
        the audit line. Never raises: each step catches its own failures."""
        resumed, cpu = self.timer(), self.cpu_timer()
        capacity = None
        if decision.demand is not None:
            capacity = self._plan_capacity(decision.demand, review.dry_run)
            self.metrics.capacity(capacity.verdict)
            if capacity.verdict == "error":
                self.metrics.error(ErrorKind.CAPACITY)
        self.metrics.admission(decision.outcome, decision.reason, elapsed)
        if decision.recommendation is not None and decision.outcome is Outcome.MUTATED:
            self.metrics.recommendation_applied()
        self._write_audit(review, decision, capacity, elapsed)
        wall, used = work
        self.metrics.work(wall + self.timer() - resumed, used + self.cpu_timer() - cpu)

    async def devices(self, request: Request) -> Response:
        """`POST /devices`: `NVIDIA_VISIBLE_DEVICES=void` on every container the kubelet
        gives no GPU and that names none (`webhook.devices`). Pure and quick: no cluster
        read, no audit line (every pod of the cluster may come here); counted. A bug
        admits the pod unchanged, and the admission policy `gpupack-pods` then
        refuses it: the boundary fails closed."""
        try:
            review = parse_review(await read_body(request))
        except ClientDisconnect:
            return Response(status_code=400)
        except ReviewError as exc:
            return self._rejected(exc)
        try:
            old = review.old_pod if review.operation == "UPDATE" else None
            patch = device_env_patch(review.pod, old)
        except Exception:
            log.exception("device env failed; admitting the pod as is", extra={"uid": review.uid})
            self.metrics.error(ErrorKind.INTERNAL)
            return json_response(allow(review.uid))
        self.metrics.device_env(len(patch))
        return json_response(allow(review.uid, patch or None))

    def _rejected(self, exc: ReviewError) -> Response:
        """Not a usable AdmissionReview: 400 or 413 naming what was wrong, counted."""
        kind = ErrorKind.BODY_TOO_LARGE if exc.status == 413 else ErrorKind.BAD_REQUEST
        self.metrics.error(kind)
        log.warning("rejected a request", extra={"status": exc.status, "error": exc.message})
        return json_response({"error": exc.message}, exc.status)

    async def _namespace(self, review: AdmissionRequest) -> JSON | None:
        """The pod's Namespace from the cache, or read live where the cache alone would
        keep the pod out (`_behind_the_selectors`)."""
        if self.cluster is None:
            return None
        namespace = self.cluster.namespace(review.namespace)
        if namespace is not None and _behind_the_selectors(review, namespace):
            return await self._read_namespace(review)
        return namespace

    async def _read_namespace(self, review: AdmissionRequest) -> JSON | None:
        """The pod's Namespace from the API server, off the event loop; None (the pod is
        in: the API server's selectors sent it) when it cannot be read in time."""
        assert self.cluster is not None
        self.metrics.error(ErrorKind.NAMESPACE_CACHE)
        try:
            namespace = await asyncio.to_thread(self.cluster.read_namespace, review.namespace)
        except Exception as exc:
            log.warning(
                "the cached namespace says the pod is not opted in, but the API server sent "
                "it and the namespace cannot be read now; trusting the API server's selectors",
                extra={"uid": review.uid, "namespace": review.namespace, "error": str(exc)},
            )
            return None
        log.info(
            "the cached namespace was behind the API server's selectors; read it live",
            extra={"uid": review.uid, "namespace": review.namespace},
        )
        return namespace

    def _decision(self, review: AdmissionRequest, namespace: JSON | None) -> Decision:
        try:
            cluster = self.cluster
            if cluster is None:
                return self.decide(
                    review,
                    MutationContext(
                        None,
                        self.policies,
                        key=self.key,
                        mps=self.mps,
                        memory_enforcement=self.memory_enforcement,
                    ),
                )
            context = MutationContext(
                namespace,
                cluster.policies,
                cluster.recommendation,
                key=self.key,
                now=int(cluster.now()),
                mps=self.mps,
                memory_enforcement=self.memory_enforcement,
            )
            return self.decide(review, context)
        except Exception as exc:
            return self._failed(review, exc)

    def _failed(self, review: AdmissionRequest, exc: Exception) -> Decision:
        log.exception("decision failed; admitting the pod unchanged", extra={"uid": review.uid})
        self.metrics.error(ErrorKind.INTERNAL)
        return internal_error(exc)

    def _respond(self, review: AdmissionRequest, decision: Decision) -> tuple[Decision, Response]:
        """The AdmissionReview response; a decision that cannot be encoded (a bug) admits
        the pod unchanged, like a decision that raised."""
        try:
            if decision.outcome is Outcome.DENIED:
                return decision, json_response(deny(review.uid, decision.message))
            patch, warnings = list(decision.patch), list(decision.warnings)
            return decision, json_response(allow(review.uid, patch or None, warnings or None))
        except Exception as exc:
            log.exception("cannot encode the decision; admitting the pod unchanged")
            self.metrics.error(ErrorKind.INTERNAL)
            return internal_error(exc), json_response(allow(review.uid))

    def _plan_capacity(self, demand: Demand, dry_run: bool) -> CapacityOutcome:
        """The cluster's capacity outcome, or an "error" outcome; never raises."""
        if self.cluster is None:
            return NO_CLUSTER
        try:
            return self.cluster.plan_capacity(demand, dry_run)
        except Exception as exc:
            return capacity_error(exc)

    def _write_audit(
        self,
        review: AdmissionRequest,
        decision: Decision,
        capacity: CapacityOutcome | None,
        elapsed: float,
    ) -> None:
        try:
            self.audit.write(audit_line(review, decision, capacity, elapsed, self.clock()))
        except Exception:
            log.exception("cannot write the audit line", extra={"uid": review.uid})
            self.metrics.error(ErrorKind.AUDIT)


def _behind_the_selectors(review: AdmissionRequest, namespace: JSON) -> bool:
    """Whether the cached `namespace` alone keeps the pod out: its labels say it is not
    opted in, and the pod's own label does not opt it in. The chart's selectors send the
    webhook only opted-in pods, so the cache is then behind the API server (a replica
    whose watch is cut off, or a label added a moment ago), or the webhook is registered
    for more pods than the chart registers it for; reading the Namespace tells which."""
    labels = labels_of(review.pod)
    try:
        return scope.opt_in(labels, namespace) is not None and scope.opt_in(labels, None) is None
    except ContractError:
        return False  # an unusable label: the decision says so


class TlsProblem(Protocol):
    """`CertificateReloader.problem`: why the served certificate is unusable, or None."""

    def __call__(self, *, check_files: bool = True) -> str | None: ...


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


def create_app(
    *,
    audit: AuditLog,
    metrics: WebhookMetrics,
    cluster: ClusterPort | None = None,
    policies: PolicySet = BUILTIN_POLICIES,
    decide: Decide | None = None,
    clock: Callable[[], datetime] = utc_now,
    timer: Callable[[], float] = time.perf_counter,
    cpu_timer: Callable[[], float] = time.thread_time,
    tls_problem: TlsProblem | None = None,
    key: bytes | None = None,
    mps: bool = True,
    memory_enforcement: bool = False,
) -> Starlette:
    """The webhook's ASGI app. `cluster` None: no namespace lookups, no capacity plan, no
    recommendations, and `policies` are the policies in force. `key`: the decision key
    (`gpupack.seal`); by default one random to this process (`process_key`), which the
    scheduler does not share. `decide`: by default `webhook.mutate.decide` with its plans
    memoized per pod template (`webhook.plans`)."""
    if decide is None:
        decide = partial(decide_pod, plan=PlanCache(counted=metrics.plan_lookup))
    admissions = Admissions(
        audit=audit,
        metrics=metrics,
        cluster=cluster,
        policies=policies,
        decide=decide,
        clock=clock,
        timer=timer,
        cpu_timer=cpu_timer,
        mps=mps,
        memory_enforcement=memory_enforcement,
        key=process_key() if key is None else key,
    )

    def unready(check_files: bool) -> str | None:
        """Why this replica must not get admissions, or None."""
        problem = None if tls_problem is None else tls_problem(check_files=check_files)
        if problem is not None:
            return problem
        if cluster is not None and not cluster.synced:
            return "cluster caches not synced"
        return None

    async def readyz(request: Request) -> Response:
        reason = unready(check_files=True)
        if reason is not None:
            return json_response({"ready": False, "reason": reason}, 503)
        return json_response({"ready": True})

    metrics.readiness(lambda: unready(check_files=False) is None)

    return Starlette(
        routes=[
            Route("/mutate", admissions.mutate, methods=["POST"]),
            Route("/devices", admissions.devices, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
        ]
    )
