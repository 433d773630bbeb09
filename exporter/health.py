"""The exporter's own health: the state of each thing it depends on, and its errors.

Sources are `nvml`, `pod-resources` and `api`. Each is up or down with the last error's
text; a change of state is logged once (not on every failed retry), and every failure
counts towards `errors_total` by source. The exporter keeps serving whatever still
works; `/metrics` shows the states so an operator can see what is wrong.
"""

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

log = logging.getLogger(__name__)

NVML: Final = "nvml"
POD_RESOURCES: Final = "pod-resources"
API: Final = "api"
SOURCES: Final = (NVML, POD_RESOURCES, API)


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    up: Mapping[str, bool]  # sources that have reported at least once
    errors: Mapping[str, int]  # failures by source since start
    messages: Mapping[str, str]  # the last error of each source that is down


class Health:
    """Thread-safe state per source. Logs on transitions only."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self._log = logger
        self._lock = threading.Lock()
        self._up: dict[str, bool] = {}
        self._errors: dict[str, int] = dict.fromkeys(SOURCES, 0)
        self._messages: dict[str, str] = {}

    def ok(self, source: str) -> None:
        with self._lock:
            was = self._up.get(source)
            self._up[source] = True
            self._messages.pop(source, None)
        if was is False:
            self._log.info("%s recovered", source, extra={"source": source})

    def failed(self, source: str, error: str) -> None:
        with self._lock:
            changed = self._up.get(source) is not False or self._messages.get(source) != error
            self._up[source] = False
            self._messages[source] = error
            self._errors[source] = self._errors.get(source, 0) + 1
        if changed:
            self._log.warning("%s: %s", source, error, extra={"source": source})

    def snapshot(self) -> HealthSnapshot:
        with self._lock:
            return HealthSnapshot(dict(self._up), dict(self._errors), dict(self._messages))
