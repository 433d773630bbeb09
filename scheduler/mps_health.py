"""The health of the MPS daemons: one per `real-time-mps` GPU, in its capacity pod.

An MPS pool's capacity pod runs `gpupack-mps-daemon` (`scheduler.manifest`), whose
probes ask the daemon whether it answers. The scheduler reads what the kubelet reports:

- a daemon that is not ready makes its GPU unhealthy for placement
  (`scheduler.translate`): a pod placed there could not reach its MPS server;
- a daemon that restarted took the MPS server of every pod on its GPU with it: the
  leader writes one Warning Event, `MPSDaemonRestarted`, on the capacity pod and on each
  pod it hosts, saying what happened and what it means for them;
- `gpupack_scheduler_mps_daemons{state}` counts the daemons ready and not ready.

Restarts are counted from the container's `restartCount`; one that happened while no
scheduler was running is not reported (the count is taken as the baseline).
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from gpupack.capacity import CONTAINER_NAME, runs_mps_daemon
from gpupack.objects import JSON

RESTARTED: Final = "MPSDaemonRestarted"


def _status(pod: JSON) -> JSON:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == CONTAINER_NAME), {})


def daemon_ready(pod: JSON) -> bool:
    """Whether an MPS capacity pod's daemon answers its probe (True for other pods)."""
    if not runs_mps_daemon(pod):
        return True
    return _running(pod) and bool(_status(pod).get("ready"))


def _running(pod: JSON) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def restarts(pod: JSON) -> int:
    count = _status(pod).get("restartCount", 0)
    return count if isinstance(count, int) else 0


def last_exit(pod: JSON) -> str:
    """How the daemon's last run ended, as the kubelet says it."""
    ended = (_status(pod).get("lastState") or {}).get("terminated") or {}
    if not ended:
        return "its end was not reported"
    return f"{ended.get('reason') or 'exited'} with status {ended.get('exitCode', '?')}"


def note(pod: JSON, hosted: Iterable[str]) -> str:
    """The Event's text, the same on the capacity pod and on the pods it hosts."""
    name = (pod.get("metadata") or {}).get("name", "")
    pods = sorted(hosted)
    on = f"{len(pods)} pods on its GPU ({', '.join(pods)})" if pods else "no pod on its GPU"
    return (
        f"the MPS control daemon of capacity pod {name} restarted (restart "
        f"{restarts(pod)}; {last_exit(pod)}); {on} lost their MPS server: their CUDA "
        f"processes fail and must start again (a container exits and restarts per its "
        f"restartPolicy). See `kubectl logs -n {(pod.get('metadata') or {}).get('namespace')} "
        f"{name} --previous`."
    )


@dataclass(frozen=True, slots=True)
class Restart:
    pod: JSON  # the capacity pod
    count: int


class MpsHealth:
    """Which MPS daemons restarted since they were last seen."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}  # capacity pod UID -> restartCount

    def restarted(self, capacity_pods: Iterable[JSON]) -> list[Restart]:
        """The MPS capacity pods whose daemon restarted since the last call (the first
        sight of a pod only sets its baseline); forgets pods that are gone."""
        fresh, live = [], set()
        for pod in capacity_pods:
            if not runs_mps_daemon(pod):
                continue
            uid = str((pod.get("metadata") or {}).get("uid", ""))
            live.add(uid)
            count, before = restarts(pod), self._seen.get(uid)
            if before is not None and count > before:
                fresh.append(Restart(pod, count))
            self._seen[uid] = count
        for uid in set(self._seen) - live:
            del self._seen[uid]
        return fresh


def daemons(capacity_pods: Iterable[JSON]) -> tuple[int, int]:
    """(running MPS daemons, of which ready): `gpupack_scheduler_mps_daemons`."""
    running = [p for p in capacity_pods if runs_mps_daemon(p) and _running(p)]
    return len(running), sum(1 for p in running if daemon_ready(p))


def notices(
    restarts: Iterable[Restart],
    gpu_of: Callable[[str], str | None],
    naming: Callable[[str], Sequence[str]],
    pod: Callable[[str], JSON | None],
) -> list[tuple[JSON, str]]:
    """(object, text) of each Event a restart makes: on the capacity pod (`gpu_of` its
    name: its GPU) and on each pod booked on that GPU (`naming` of the GPU: the pods'
    keys, `Ledger.naming`; `pod` of each key)."""
    out: list[tuple[JSON, str]] = []
    for restart in restarts:
        gpu = gpu_of(str(restart.pod["metadata"].get("name", "")))
        hosted = list(naming(gpu)) if gpu is not None else []
        text = note(restart.pod, hosted)
        out.extend((p, text) for p in [restart.pod, *filter(None, map(pod, hosted))])
    return out
