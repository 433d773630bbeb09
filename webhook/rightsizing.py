"""The rightsizing objects as the admission path reads them: parsed once per change.

`PolicyCache` holds the policies in force (`gpupack.policy.effective_policies` of the
GPUPolicy objects), recomputed when the GPUPolicy watch cache changes, never per
admission. `RecommendationCache` holds each GPURecommendation parsed, by its cache key
(`namespace/name`), updated per watch event. Both are fed by `webhook.cluster` from the
informers' `on_change` hook (one informer thread each) and read by admissions on the
event loop: a reader gets an immutable value or one dict lookup, never a parse.

An object that does not parse is logged once per resourceVersion, as a warning with the
ContractError's message, and never fails an admission: an invalid GPUPolicy leaves the
built-in of its name in force (the pods that use it get a warning), an invalid
GPURecommendation counts as absent.
"""

import logging
from collections.abc import Iterable

from gpupack.errors import ContractError
from gpupack.objects import JSON
from gpupack.policy import PolicySet, effective_policies
from gpupack.recommendation import Recommendation, object_name, recommendation_from_object
from gpupack.runtime.informer import object_key
from webhook.policies import BUILTIN_POLICIES

log = logging.getLogger(__name__)


def _version(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


class PolicyCache:
    """The PolicySet in force; `update` with every GPUPolicy object after each change (the
    first one after the informer's first list makes it `ready`)."""

    def __init__(self) -> None:
        self._current: PolicySet = BUILTIN_POLICIES
        self._logged: dict[str, str] = {}  # invalid policy name -> resourceVersion logged
        self.ready = False  # updated from a complete list at least once

    @property
    def current(self) -> PolicySet:
        return self._current

    def update(self, objects: Iterable[JSON]) -> PolicySet:
        objects = list(objects)
        policies = effective_policies(objects)
        versions = {
            str((obj.get("metadata") or {}).get("name", "")): _version(obj) for obj in objects
        }
        logged: dict[str, str] = {}
        for name, why in sorted(policies.invalid.items()):
            version = versions.get(name, "")
            if self._logged.get(name) != version:
                instead = "the built-in applies" if name in policies.policies else "ignored"
                log.warning("invalid GPUPolicy %s (%s): %s", name, instead, why)
            logged[name] = version
        self._logged = logged
        self._current = policies  # one assignment: readers see the old set or the new one
        self.ready = True
        return policies


class RecommendationCache:
    """Parsed GPURecommendations by cache key; None for one without a usable value."""

    def __init__(self) -> None:
        self._parsed: dict[str, Recommendation | None] = {}
        self._logged: dict[str, str] = {}  # key -> resourceVersion of the logged failure
        self.ready = False  # reset from a complete list at least once

    def _parse(self, key: str, obj: JSON) -> Recommendation | None:
        try:
            return recommendation_from_object(obj)
        except ContractError as exc:
            version = _version(obj)
            if self._logged.get(key) != version:
                log.warning("ignoring GPURecommendation %s: %s", key, exc)
                self._logged[key] = version
            return None

    def changed(self, key: str, obj: JSON | None) -> None:
        """One object was added or modified (`obj`) or deleted (None)."""
        if obj is None:
            self._parsed.pop(key, None)
            self._logged.pop(key, None)
            return
        self._parsed[key] = self._parse(key, obj)

    def reset(self, objects: Iterable[JSON]) -> None:
        """After a (re)list: every object may have changed."""
        parsed = {}
        for obj in objects:
            key = object_key(obj)
            parsed[key] = self._parse(key, obj)
        self._logged = {k: v for k, v in self._logged.items() if k in parsed}
        self._parsed = parsed  # one assignment: readers see the old dict or the new one
        self.ready = True

    def lookup(self, namespace: str, kind: str, name: str) -> Recommendation | None:
        """The recommendation for workload `kind/name` in `namespace`, if it has a value and
        is really for that workload (a hand-made object may name another one)."""
        rec = self._parsed.get(f"{namespace}/{object_name(kind, name)}")
        if rec is None or rec.kind != kind or rec.workload != name:
            return None
        return rec

    def __len__(self) -> int:
        return len(self._parsed)
