"""Where the recommender reads pods' GPU use: every node's exporter, or Prometheus.

Both sources answer one question, "how much GPU does each pod use now", as per-pod sums
over the pod's containers and GPUs (`PodUsage`), with one error per target that failed
(`Collected`), so an unreachable node costs its pods one sample, never the whole cycle.

- `ExporterScraper` scrapes `/metrics` of every exporter pod concurrently: no other
  dependency, and the history lives in the recommender's own checkpoints.
- `PrometheusSource` asks Prometheus, which already holds the history: compute is the
  mean over the window, memory the peak. Prometheus must keep the exporter's
  `namespace` and `pod` labels (`honor_labels: true` in a Kubernetes scrape config that
  adds its own `pod` label), or the queries find nothing.

The parsing (`parse_exporter_metrics`, `parse_prometheus_vector`) is pure; the fetching
is `gpupack.runtime.http` (HTTP(S) only, without redirects or proxies from the
environment): exporters are reached by pod IP and Prometheus by its in-cluster address.
The metric names are the contract's (`gpupack.metrics`), the ones the exporter writes.
"""

import ipaddress
import json
import math
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, Protocol

from prometheus_client.parser import text_string_to_metric_families

from gpupack.metrics import POD_COMPUTE as COMPUTE_METRIC
from gpupack.metrics import POD_MEMORY_USED as MEMORY_METRIC
from gpupack.metrics import Use
from gpupack.objects import JSON, Pod
from gpupack.runtime import http
from gpupack.shares import is_running


@dataclass(frozen=True, slots=True)
class PodUsage:
    """A pod's GPU use, summed over its containers and GPUs; None when no source said."""

    namespace: str
    pod: str
    compute: float | None  # ratio of one GPU: 1.5 is one and a half GPUs' SMs
    memory: int | None  # bytes


@dataclass(frozen=True, slots=True)
class Collected:
    """One collection: the pods seen, one message per failed target (naming it), and
    how many targets were asked."""

    usage: tuple[PodUsage, ...]
    errors: tuple[str, ...]
    targets: int


class UsageSource(Protocol):
    def collect(self) -> Collected:
        """Pods' current use; failures are errors in the answer, never exceptions."""
        ...

    def describe(self) -> str:
        """For logs: `3 exporters`, `Prometheus at http://...`."""
        ...

    def close(self) -> None:
        """Release threads or connections (at shutdown)."""
        ...


def _usage(sums: Mapping[tuple[str, str], Use]) -> list[PodUsage]:
    return [
        PodUsage(namespace, pod, use.compute, use.memory)
        for (namespace, pod), use in sorted(sums.items())
    ]


def parse_exporter_metrics(text: str) -> list[PodUsage]:
    """Per-pod sums of the exporter's per-container, per-GPU use series, sorted by
    (namespace, pod). Other families are ignored, and so are NaN and infinite samples. Raises
    ValueError when the text is not the Prometheus text format or a use series lacks
    its `namespace` or `pod` label."""
    sums: dict[tuple[str, str], Use] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in (COMPUTE_METRIC, MEMORY_METRIC):
                    continue
                namespace, pod = sample.labels.get("namespace"), sample.labels.get("pod")
                if not namespace or not pod:
                    raise ValueError(f"{sample.name} sample without namespace and pod labels")
                if not math.isfinite(sample.value):
                    continue
                use = sums.setdefault((namespace, pod), Use())
                if sample.name == COMPUTE_METRIC:
                    use.add(float(sample.value), None)
                else:
                    use.add(None, round(sample.value))
    except ValueError as error:
        raise ValueError(f"not Prometheus metrics: {str(error) or 'unreadable'}") from error
    return _usage(sums)


def exporter_targets(pods: Iterable[Pod | JSON], port: int) -> list[str]:
    """`http://<pod IP>:<port>/metrics` of every running exporter pod that is not being
    deleted (IPv6 in brackets), sorted and deduplicated. Pods without a valid IP yet are
    left out."""
    if not 0 < port < 65536:
        raise ValueError(f"exporter port {port!r}: expected 1-65535")
    urls: set[str] = set()
    for pod in pods:
        if not is_running(pod):
            continue
        status = pod.get("status") or {}
        try:
            ip = ipaddress.ip_address(str(status.get("podIP") or ""))
        except ValueError:
            continue
        host = f"[{ip.compressed}]" if ip.version == 6 else ip.compressed
        urls.add(f"http://{host}:{port}/metrics")
    return sorted(urls)


class ExporterScraper(UsageSource):
    """Scrapes every exporter `targets()` names, `workers` at a time; each scrape gets
    `timeout` seconds. `close()` stops the worker threads."""

    def __init__(
        self,
        targets: Callable[[], Sequence[str]],
        *,
        timeout: float = 5.0,
        workers: int = 8,
        max_body: int = http.MAX_BODY,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"scrape timeout {timeout!r}: expected seconds above 0")
        if workers < 1:
            raise ValueError(f"scrape workers {workers!r}: expected at least 1")
        self._targets = targets
        self._timeout = timeout
        self._max_body = max_body
        self._opener = http.opener()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="usage-scrape")

    def _scrape(self, url: str) -> list[PodUsage]:
        body = http.get(self._opener, url, timeout=self._timeout, max_body=self._max_body)
        try:
            text = body.decode()
        except UnicodeDecodeError:
            raise ValueError("not Prometheus metrics: not UTF-8") from None
        return parse_exporter_metrics(text)

    def collect(self) -> Collected:
        urls = list(dict.fromkeys(self._targets()))
        futures = [(url, self._pool.submit(self._scrape, url)) for url in urls]
        sums: dict[tuple[str, str], Use] = {}
        errors: list[str] = []
        for url, future in futures:
            try:
                found = future.result()
            except (http.FetchError, ValueError) as error:
                errors.append(f"{url}: {http.reason(error, self._timeout)}")
                continue
            for use in found:  # a pod in two targets (it should not be) keeps the sum
                sums.setdefault((use.namespace, use.pod), Use()).add(use.compute, use.memory)
        return Collected(tuple(_usage(sums)), tuple(errors), len(urls))

    def describe(self) -> str:
        count = len(set(self._targets()))
        return f"{count} exporter{'' if count == 1 else 's'}"

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "ExporterScraper":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _field(where: Mapping[str, Any], key: str, kind: type, what: str) -> Any:
    value = where.get(key)
    if not isinstance(value, kind):
        raise ValueError(f"{what}: expected {key} to be a {kind.__name__}, got {value!r:.100}")
    return value


def parse_prometheus_vector(payload: object) -> dict[tuple[str, str], float]:
    """{(namespace, pod): value} from an instant-query answer (`/api/v1/query`). Raises
    ValueError naming what is wrong: Prometheus's own error (type and message), another
    result type than a vector, a series without namespace or pod, a malformed value, or
    a series seen twice. NaN and infinite values are skipped."""
    if not isinstance(payload, dict):
        raise ValueError(f"Prometheus answer: expected a JSON object, got {payload!r:.100}")
    status = payload.get("status")
    if status == "error":
        raise ValueError(f"Prometheus error {payload.get('errorType')}: {payload.get('error')}")
    if status != "success":
        raise ValueError(f"Prometheus answer: expected status success, got {status!r:.100}")
    data = _field(payload, "data", dict, "Prometheus answer")
    if data.get("resultType") != "vector":
        raise ValueError(f"Prometheus answer: expected a vector, got {data.get('resultType')!r}")
    values: dict[tuple[str, str], float] = {}
    for index, series in enumerate(_field(data, "result", list, "Prometheus answer")):
        where = f"Prometheus result {index}"
        if not isinstance(series, dict):
            raise ValueError(f"{where}: expected an object, got {series!r:.100}")
        labels = _field(series, "metric", dict, where)
        namespace, pod = labels.get("namespace"), labels.get("pod")
        if not isinstance(namespace, str) or not isinstance(pod, str) or not namespace or not pod:
            raise ValueError(f"{where}: expected namespace and pod labels, got {labels!r:.200}")
        value = series.get("value")
        if (
            not isinstance(value, list)
            or len(value) != 2
            or isinstance(value[0], bool)
            or not isinstance(value[0], int | float)
            or not isinstance(value[1], str)
        ):
            raise ValueError(f'{where}: expected value [timestamp, "number"], got {value!r:.100}')
        try:
            number = float(value[1])
        except ValueError:
            raise ValueError(f"{where}: value {value[1]!r:.50} is not a number") from None
        if (namespace, pod) in values:
            raise ValueError(f"{where}: {namespace}/{pod} appears twice")
        if math.isfinite(number):
            values[namespace, pod] = number
    return values


def merge_vectors(
    compute: Mapping[tuple[str, str], float], memory: Mapping[tuple[str, str], float]
) -> list[PodUsage]:
    """PodUsage for every pod in either vector, sorted; None where a vector lacks it."""
    return [
        PodUsage(
            namespace,
            pod,
            compute.get((namespace, pod)),
            None if (namespace, pod) not in memory else round(memory[namespace, pod]),
        )
        for namespace, pod in sorted(compute.keys() | memory.keys())
    ]


def _prometheus_error(body: bytes) -> str | None:
    """`Prometheus error <type>: <message>` when `body` is Prometheus's error JSON."""
    try:
        parse_prometheus_vector(json.loads(body))
    except ValueError as error:
        return str(error) if str(error).startswith("Prometheus error ") else None
    return None


def _validate_url(url: str) -> str:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as error:
        raise ValueError(f"Prometheus URL {url!r}: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"Prometheus URL {url!r}: expected http(s)://host[:port][/path]")
    if parts.query or parts.fragment:
        raise ValueError(f"Prometheus URL {url!r}: expected no query or fragment")
    return url.rstrip("/")


class PrometheusSource(UsageSource):
    """Two instant queries per collect: each pod's mean compute and peak memory over the
    last `window_seconds`. One Prometheus is one target, so its failures make one error
    (naming the failed queries); when only one query fails the other's values still
    count, and the missing dimension is None."""

    def __init__(
        self,
        url: str,
        *,
        window_seconds: int,
        timeout: float = 10.0,
        bearer_token_file: str | None = None,
    ) -> None:
        self._url = _validate_url(url)
        if isinstance(window_seconds, bool) or window_seconds < 1:
            raise ValueError(f"Prometheus window {window_seconds!r}: expected seconds above 0")
        if timeout <= 0:
            raise ValueError(f"Prometheus timeout {timeout!r}: expected seconds above 0")
        self._timeout = timeout
        self._token_file = bearer_token_file
        self._opener = http.opener()
        window = f"[{window_seconds}s]"
        self.queries: Final = {
            "compute": f"sum by (namespace, pod) (avg_over_time({COMPUTE_METRIC}{window}))",
            "memory": f"sum by (namespace, pod) (max_over_time({MEMORY_METRIC}{window}))",
        }

    def _query(self, query: str, token: str | None) -> dict[tuple[str, str], float]:
        params = urllib.parse.urlencode({"query": query, "timeout": f"{self._timeout:g}s"})
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = f"{self._url}/api/v1/query?{params}"
        try:
            body = http.get(self._opener, url, timeout=self._timeout, headers=headers)
        except http.FetchError as error:
            # Prometheus explains 4xx and 503 in JSON; a proxy in between may not.
            explained = _prometheus_error(error.body) if error.status else None
            if explained is None:
                raise
            raise ValueError(explained) from None
        try:
            payload = json.loads(body)
        except ValueError as error:
            raise ValueError(f"Prometheus answer is not JSON: {error}") from None
        return parse_prometheus_vector(payload)

    def _token(self) -> str | None:
        if self._token_file is None:
            return None
        with open(self._token_file, encoding="utf-8") as file:  # it rotates: read every time
            token = file.read().strip()
        if not token:
            raise ValueError("it is empty")
        return token

    def collect(self) -> Collected:
        try:
            token = self._token()
        except (OSError, ValueError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else error
            message = f"{self.describe()}: bearer token file {self._token_file}: {reason}"
            return Collected((), (message,), 1)
        vectors: dict[str, dict[tuple[str, str], float]] = {}
        failed: list[str] = []
        for name, query in self.queries.items():
            try:
                vectors[name] = self._query(query, token)
            except (http.FetchError, ValueError) as error:
                failed.append(f"{name} query: {http.reason(error, self._timeout)}")
                vectors[name] = {}
        errors = (f"{self.describe()}: {'; '.join(failed)}",) if failed else ()
        usage = merge_vectors(vectors["compute"], vectors["memory"])
        return Collected(tuple(usage), errors, 1)

    def describe(self) -> str:
        return f"Prometheus at {self._url}"

    def close(self) -> None:
        """Nothing to release; here so both sources close alike."""
