"""The dashboard's PromQL, evaluated by hand over the simulated scrapes: each expression a
drawn panel uses has its Python equivalent beside its text."""

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from hack.dashboard_preview.simulate import ROWS, STEP, Frame, Labels, Sample

# --- PromQL, by hand ----------------------------------------------------------------

Vector = dict[Labels, float]
Evaluate = Callable[[Sequence[Frame], int], Vector]  # all frames, a step -> the result there


def key(labels: Mapping[str, str], names: Iterable[str]) -> Labels:
    return tuple(sorted((name, labels.get(name, "")) for name in names))


def series(frame: Frame, name: str, keep: Callable[[Sample], bool] = lambda _: True) -> Vector:
    """`name`, every label kept (`keep` filters, as a comparison does)."""
    return {key(s[0], s[0]): s[1] for s in frame.get(name, []) if keep(s)}


def aggregate(vector: Vector, names: Sequence[str], how: Callable[[list[float]], float]) -> Vector:
    """`how by (names) (vector)`."""
    groups: dict[Labels, list[float]] = {}
    for labels, value in vector.items():
        groups.setdefault(key(dict(labels), names), []).append(value)
    return {k: how(values) for k, values in groups.items()}


def count(vector: Vector) -> Vector:
    return {(): float(len(vector))} if vector else {}


def binary(a: Vector, b: Vector, op: Callable[[float, float], float | None]) -> Vector:
    """`a op b`, one-to-one on identical labels; None (a division by zero) drops a sample."""
    pairs = ((k, op(v, b[k])) for k, v in a.items() if k in b)
    return {k: v for k, v in pairs if v is not None}


def divide(a: float, b: float) -> float | None:
    return a / b if b else None


def where(vector: Vector, keep: Callable[[float], bool]) -> Vector:
    return {k: v for k, v in vector.items() if keep(v)}


def either(a: Vector, b: Vector) -> Vector:
    """`a or b`."""
    return {**b, **a}


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def on_held(frame: Frame, name: str, keep: Callable[[Sample], bool] = lambda _: True) -> Vector:
    """`name and on (gpu) gpupack_gpu_capacity_pod`."""
    gpus = {labels["gpu"] for labels, _ in frame.get("gpupack_gpu_capacity_pod", [])}
    return series(frame, name, lambda s: s[0]["gpu"] in gpus and keep(s))


def on_leader(frame: Frame, name: str) -> Vector:
    """`name and on (instance) gpupack_scheduler_leader == 1`."""
    leaders = {labels["instance"] for labels, v in frame.get("gpupack_scheduler_leader", []) if v}
    return series(frame, name, lambda s: s[0]["instance"] in leaders)


def over_time(frames: Sequence[Frame], name: str, how: Callable[[list[float]], float]) -> Vector:
    """`<how>_over_time(name[range])` over all of `frames`."""
    seen: dict[Labels, list[float]] = {}
    for frame in frames:
        for labels, value in series(frame, name).items():
            seen.setdefault(labels, []).append(value)
    return {labels: how(values) for labels, values in seen.items()}


def rate(frames: Sequence[Frame], i: int, name: str) -> Vector:
    """`rate(name[5m])`, without Prometheus's extrapolation at the window's edges."""
    back = max(0, i - 300 // STEP)
    before, now = series(frames[back], name), series(frames[i], name)
    return {k: (v - before.get(k, v)) / max(STEP, (i - back) * STEP) for k, v in now.items()}


NS: Final = '{namespace=~"$namespace"}'
LEADER: Final = "and on (instance) gpupack_scheduler_leader == 1"
HELD: Final = "count(gpupack_gpu_capacity_pod)"
ASKED: Final = "count(gpupack_pod_gpu_compute_allocated_ratio)"
POD: Final = ("namespace", "pod")


def held_now(f: Sequence[Frame], i: int) -> Vector:
    return count(series(f[i], "gpupack_gpu_capacity_pod"))


def asked_now(f: Sequence[Frame], i: int) -> Vector:
    return count(series(f[i], "gpupack_pod_gpu_compute_allocated_ratio"))


def by_pod(name: str) -> Evaluate:
    return lambda f, i: aggregate(series(f[i], name), POD, sum)


def over(used: str, allocated: str) -> tuple[str, Evaluate]:
    """Pods over their allocation now."""
    expr = f"sum by (namespace, pod) ({used}{NS}) / sum by (namespace, pod) ({allocated}{NS}) > 1"
    return expr, lambda f, i: where(
        binary(by_pod(used)(f, i), by_pod(allocated)(f, i), divide), lambda v: v > 1
    )


def under(used: str, allocated: str, how: str) -> tuple[str, Evaluate]:
    """Pods under a quarter of their allocation over the dashboard's range."""
    expr = (
        f"(sum by (namespace, pod) ({how}_over_time({used}{NS}[$__range])) "
        f"or 0 * sum by (namespace, pod) ({allocated}{NS})) "
        f"/ sum by (namespace, pod) ({allocated}{NS}) < 0.25"
    )

    def evaluate(f: Sequence[Frame], i: int) -> Vector:
        reduce = mean if how == "avg" else max
        use = aggregate(over_time(f[: i + 1], used, reduce), POD, sum)
        allocation = by_pod(allocated)(f, i)
        idle = dict.fromkeys(allocation, 0.0)
        return where(binary(either(use, idle), allocation, divide), lambda v: v < 0.25)

    return expr, evaluate


def health(name: str) -> tuple[str, Evaluate]:
    return f"max by (instance) ({name})", lambda f, i: aggregate(
        series(f[i], name), ["instance"], max
    )


def problems(f: Sequence[Frame], i: int) -> Vector:
    nvml, kubelet, api = (
        series(f[i], f"gpupack_exporter_{name}_up") for name in ("nvml", "pod_resources", "api")
    )
    product = binary(binary(nvml, kubelet, float.__mul__), api, float.__mul__)
    return either(count(where(product, lambda v: v == 0)), {(): 0.0})


def utilization_by_index(f: Sequence[Frame], i: int) -> Vector:
    index = {(s[0]["instance"], s[0]["gpu"]): s[0]["index"] for s in f[i]["gpupack_gpu_info"]}
    return {
        (*key(labels, ("gpu", "instance")), ("index", index[labels["instance"], labels["gpu"]])): v
        for labels, v in f[i]["gpupack_gpu_utilization_ratio"]
    }


def leader_sum(name: str) -> tuple[str, Evaluate]:
    return f"sum({name} {LEADER})", lambda f, i: aggregate(on_leader(f[i], name), (), sum)


def sm_use(f: Sequence[Frame], i: int) -> Vector:
    return aggregate(on_held(f[i], "gpupack_gpu_utilization_ratio"), (), mean)


def allocated(f: Sequence[Frame], i: int) -> Vector:
    return aggregate(on_leader(f[i], "gpupack_scheduler_allocated_compute_ratio"), (), max)


# Every expression a drawn panel uses, and what it evaluates to here.
CU, CA = "gpupack_pod_gpu_compute_ratio", "gpupack_pod_gpu_compute_allocated_ratio"
MU, MA = "gpupack_pod_gpu_memory_used_bytes", "gpupack_pod_gpu_memory_allocated_bytes"
EVALUATIONS: Final[dict[str, Evaluate]] = dict(
    [
        (HELD, held_now),
        (ASKED, asked_now),
        (f"{ASKED} - {HELD}", lambda f, i: binary(asked_now(f, i), held_now(f, i), float.__sub__)),
        (f"{ASKED} / {HELD}", lambda f, i: binary(asked_now(f, i), held_now(f, i), divide)),
        (f"max(gpupack_scheduler_allocated_compute_ratio {LEADER})", allocated),
        ("avg(gpupack_gpu_utilization_ratio and on (gpu) gpupack_gpu_capacity_pod)", sm_use),
        (
            "count(gpupack_gpu_utilization_ratio > 0.05 and on (gpu) gpupack_gpu_capacity_pod)",
            lambda f, i: count(
                on_held(f[i], "gpupack_gpu_utilization_ratio", lambda s: s[1] > 0.05)
            ),
        ),
        leader_sum("gpupack_scheduler_gpus_in_use"),
        leader_sum("gpupack_scheduler_gpus_coming"),
        *((f"sum by (namespace, pod) ({name}{NS})", by_pod(name)) for name in (CU, CA, MU, MA)),
        over(CU, CA),
        over(MU, MA),
        under(CU, CA, "avg"),
        under(MU, MA, "max"),
        (
            "count((gpupack_exporter_nvml_up * gpupack_exporter_pod_resources_up * "
            "gpupack_exporter_api_up) == 0) or vector(0)",
            problems,
        ),
        (
            "count(gpupack_gpu_healthy == 0) or vector(0)",
            lambda f, i: either(
                count(series(f[i], "gpupack_gpu_healthy", lambda s: s[1] == 0)), {(): 0.0}
            ),
        ),
        *(
            health(f"gpupack_exporter_{name}")
            for name in ("nvml_up", "pod_resources_up", "api_up", "last_sample_age_seconds")
        ),
        (
            "sum by (instance, source) (rate(gpupack_exporter_errors_total[5m]))",
            lambda f, i: aggregate(
                rate(f, i, "gpupack_exporter_errors_total"), ("instance", "source"), sum
            ),
        ),
        (
            "gpupack_gpu_utilization_ratio * on (instance, gpu) group_left (index) "
            "gpupack_gpu_info",
            utilization_by_index,
        ),
        (
            "sum by (source) (gpupack_gpu_unattributed_compute_ratio)",
            lambda f, i: aggregate(
                series(f[i], "gpupack_gpu_unattributed_compute_ratio"), ["source"], sum
            ),
        ),
    ]
)


# --- The dashboard's panels, evaluated ----------------------------------------------

JSON = dict[str, Any]
Results = dict[str, dict[Labels, list[float | None]]]  # refId -> labels -> value per step


def drawn_panels(dashboard: JSON) -> list[JSON]:
    """The panels of the rows in ROWS, top to bottom."""
    row, drawn = "", []
    for panel in sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"])):
        row = panel["title"] if panel["type"] == "row" else row
        if row in ROWS:
            drawn.append(panel)
    return drawn


def evaluate(panel: JSON, frames: Sequence[Frame]) -> Results:
    results: Results = {}
    for target in panel["targets"]:
        run = EVALUATIONS.get(target["expr"])
        if run is None:
            sys.exit(
                f"panel {panel['title']!r}, query {target['refId']}: no evaluation here for\n"
                f"  {target['expr']}\nadd one to EVALUATIONS in hack/dashboard_preview"
            )
        values: dict[Labels, list[float | None]] = {}
        for step in range(len(frames)):
            for labels, value in run(frames, step).items():
                values.setdefault(labels, [None] * len(frames))[step] = value
        results[target["refId"]] = values
    return results
