"""The pods the cluster benchmarks create: a pause container asking a little CPU and
memory, one whole GPU where asked, and gpupack's share where given (policy `batch`, so
the webhook takes the share as written)."""

from collections.abc import Mapping
from typing import Any, Final

from gpupack import keys

PAUSE: Final = "registry.k8s.io/pause:3.10"


def pause_pod(
    name: str, app: str, *, gpu: bool, share: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Pod `name` labelled `app`; `share`: the gpupack annotations (compute, memory)."""
    limits = {"cpu": "10m", "memory": "16Mi", **({keys.NVIDIA_GPU: "1"} if gpu else {})}
    annotations = {**share, keys.POLICY: "batch"} if share else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}, "annotations": annotations},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": PAUSE, "resources": {"limits": limits}}],
        },
    }
