"""JSONPatch (RFC 6902) operations with RFC 6901 pointers, built deterministically.

Keys like `gpupack.io/policy` or `nvidia.com/gpu` contain `/` and must be escaped
(`~1`), as must `~` (`~0`); every path the webhook writes goes through `pointer`.
"""

import functools
from typing import Any

from gpupack.kube import JSON


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
