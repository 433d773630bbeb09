"""Where a pod may run: node selector, required node affinity, taints and tolerations.

Pure. `Constraints` is built once per pod from its spec and is hashable, so the
placement core caches the nodes that pass it (labels and taints change rarely; pods
arrive often). The semantics follow kube-scheduler's NodeAffinity and TaintToleration
plugins: the selector and every term's expressions are ANDed, the terms are ORed, and a
taint with effect NoSchedule or NoExecute must be tolerated (PreferNoSchedule is a
preference, not a filter).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, cast

from gpupack.kube import JSON

Requirement = tuple[str, str, tuple[str, ...]]  # key, operator, values
Term = tuple[tuple[Requirement, ...], tuple[Requirement, ...]]  # expressions, fields

FILTERED_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""  # empty with operator Exists: tolerates everything
    operator: str = "Equal"
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True, slots=True)
class Constraints:
    node_selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[Term, ...] = ()  # required node affinity; empty: no constraint
    tolerations: tuple[Toleration, ...] = ()

    def reject(self, name: str, labels: Mapping[str, str], taints: tuple[Taint, ...]) -> str | None:
        """Why a node with these labels and taints cannot take the pod, or None."""
        for key, value in self.node_selector:
            if labels.get(key) != value:
                return "node selector mismatch"
        if self.terms and not any(_term_matches(t, name, labels) for t in self.terms):
            return "node affinity mismatch"
        for taint in taints:
            if taint.effect in FILTERED_EFFECTS and not any(
                t.tolerates(taint) for t in self.tolerations
            ):
                return f"untolerated taint {taint.key}"
        return None


NONE: Final = Constraints()


def _requirement_matches(req: Requirement, value: str | None) -> bool:
    _, operator, values = req
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _term_matches(term: Term, name: str, labels: Mapping[str, str]) -> bool:
    expressions, fields = term
    if not expressions and not fields:
        return False  # an empty term matches no node (as in kube-scheduler)
    if not all(_requirement_matches(r, labels.get(r[0])) for r in expressions):
        return False
    return all(_requirement_matches(r, name if r[0] == "metadata.name" else None) for r in fields)


def _requirements(items: object) -> tuple[Requirement, ...]:
    out: list[Requirement] = []
    for item in cast(list[JSON], items or []):
        values = tuple(sorted(str(v) for v in item.get("values") or ()))
        out.append((str(item.get("key", "")), str(item.get("operator", "")), values))
    return tuple(sorted(out))


def taints_of(node: JSON) -> tuple[Taint, ...]:
    return tuple(
        Taint(str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
        for t in cast(list[JSON], (node.get("spec") or {}).get("taints") or [])
    )


def constraints_of(spec: JSON) -> Constraints:
    """The filter a pod spec asks for. Preferred affinity is scoring, not filtering."""
    selector = tuple(sorted((str(k), str(v)) for k, v in (spec.get("nodeSelector") or {}).items()))
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = tuple(
        (_requirements(t.get("matchExpressions")), _requirements(t.get("matchFields")))
        for t in cast(list[JSON], required.get("nodeSelectorTerms") or [])
    )
    tolerations = tuple(
        Toleration(
            str(t.get("key") or ""),
            str(t.get("operator") or "Equal"),
            str(t.get("value") or ""),
            str(t.get("effect") or ""),
        )
        for t in cast(list[JSON], spec.get("tolerations") or [])
    )
    return Constraints(selector, terms, tolerations)
