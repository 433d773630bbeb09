"""A container the chart renders, run as a local process with the same command line.

The fast tiers run gpupack's components as host processes, and a host process is only a
fair stand-in for the pod if it runs what the pod runs: the chart's `command` and `args`,
read from `helm template`, never flags chosen here. What cannot be the same on a host is
translated, each in one visible way:

- paths under a container's `volumeMounts` become the local folders that hold the same
  files (the TLS Secret, the decision key, the kube-scheduler's ConfigMap);
- `$(VAR)` references are expanded as the kubelet expands them, from the container's
  literal `env` and the downward-API values the caller supplies (`POD_NAME`, ...);
- the command is the console script of the same name from this Python's environment
  (the image's `/opt/gpupack/bin`), or a pinned upstream binary for kube-scheduler;
- ports come from the chart's own values (`--set webhook.port=...`), so two local
  processes do not collide; the caller names them as chart values, not flags.

A harness that needs a file path the chart does not mount, or references a mount it did
not map, fails here with the name of the path, instead of running something else.
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hack.localcluster.chart import SYSTEM_NAMESPACE, render_chart

WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob")
_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass(frozen=True, slots=True)
class Container:
    """One container of a rendered workload: what its process is started with."""

    workload: str
    name: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # literal values only
    mounts: tuple[str, ...] = ()  # mountPaths
    ports: Mapping[str, int] = field(default_factory=dict)  # by port name

    def argv(
        self,
        *,
        mounts: Mapping[str, Path],
        env: Mapping[str, str] = {},
        executables: Mapping[str, str] = {},
    ) -> list[str]:
        """The command line as a local process runs it: `mounts` maps each mountPath the
        arguments use to a local folder, `env` gives the downward-API values `$(VAR)`
        names, `executables` maps a command to its local path."""
        unknown = set(mounts) - set(self.mounts)
        if unknown:
            raise ValueError(f"{self.workload}/{self.name} mounts nothing at {sorted(unknown)}")
        values = {**self.env, **env}
        translated = []
        for given in (*self.command, *self.args):
            word = _expand(given, values, f"{self.workload}/{self.name}")
            for mount_path in sorted(self.mounts, key=len, reverse=True):
                if mount_path in word:
                    if mount_path not in mounts:
                        raise ValueError(
                            f"{self.workload}/{self.name}: {word!r} reads {mount_path}, which "
                            "the harness does not provide"
                        )
                    word = word.replace(mount_path, str(mounts[mount_path]))
                    break
            translated.append(word)
        translated[0] = executables.get(translated[0], translated[0])
        return translated


def _expand(word: str, values: Mapping[str, str], where: str) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ValueError(f"{where}: $({name}) has no value (pass it as env)")
        return values[name]

    return _REFERENCE.sub(value, word)


def pod_spec(workload: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    result: Mapping[str, Any] = spec["template"]["spec"]
    return result


def containers_of(manifests: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], Container]:
    """Every container of every workload in `manifests`, by (workload name, container)."""
    found = {}
    for doc in manifests:
        if not doc or doc.get("kind") not in WORKLOAD_KINDS:
            continue
        spec = pod_spec(doc)
        for item in [*(spec.get("initContainers") or []), *spec["containers"]]:
            container = Container(
                workload=doc["metadata"]["name"],
                name=item["name"],
                command=tuple(item.get("command") or ()),
                args=tuple(str(arg) for arg in item.get("args") or ()),
                env={e["name"]: str(e["value"]) for e in item.get("env") or () if "value" in e},
                mounts=tuple(m["mountPath"] for m in item.get("volumeMounts") or ()),
                ports={p["name"]: int(p["containerPort"]) for p in item.get("ports") or ()},
            )
            found[container.workload, container.name] = container
    return found


def chart_container(
    helm: Path,
    template: str,
    container: str,
    *,
    namespace: str = SYSTEM_NAMESPACE,
    sets: Sequence[str] = (),
) -> Container:
    """The container named `container` of the one workload `template` renders with `sets`."""
    manifests = list(yaml.safe_load_all(render_chart(helm, template, namespace, sets)))
    matches = [c for (_, name), c in containers_of(manifests).items() if name == container]
    if len(matches) != 1:
        raise LookupError(f"{template} renders {len(matches)} containers named {container!r}")
    return matches[0]
