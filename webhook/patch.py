"""JSONPatch (RFC 6902) operations with RFC 6901 pointers, built deterministically.

Keys like `gpupack.io/policy` or `nvidia.com/gpu` contain `/` and must be escaped
(`~1`), as must `~` (`~0`); every path the webhook writes goes through `pointer`.
"""

import functools
from typing import Any

from gpupack.objects import JSON


def escape(token: str) -> str:
    if "~" not in token and "/" not in token:
        return token
    return token.replace("~", "~0").replace("/", "~1")


@functools.lru_cache(maxsize=4096)  # the same few paths come up in every admission
def pointer(*tokens: str | int) -> str:
    return "".join("/" + escape(str(token)) for token in tokens)


def add(path: str, value: Any) -> JSON:
    return {"op": "add", "path": path, "value": value}


def replace(path: str, value: Any) -> JSON:
    return {"op": "replace", "path": path, "value": value}


def remove(path: str) -> JSON:
    return {"op": "remove", "path": path}


def volume_ops(spec: Any, volume: JSON) -> tuple[list[JSON], list[str]]:
    """The operations that make `volume` the pod's volume of its name (a pod's own volume
    of that name is replaced: the name is gpupack's), and warnings saying so."""
    name = volume["name"]
    volumes = [v for v in spec.get("volumes") or [] if isinstance(v, dict)]
    wanted = [*(v for v in volumes if v.get("name") != name), volume]
    if spec.get("volumes") is None:
        return [add("/spec/volumes", wanted)], []
    if wanted == spec.get("volumes"):
        return [], []
    warnings = []
    if any(v != volume for v in volumes if v.get("name") == name):
        warnings.append(f"replaced the pod's volume {name!r}: the name is gpupack's")
    return [replace("/spec/volumes", wanted)], warnings
