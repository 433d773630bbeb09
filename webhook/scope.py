"""Which pods the webhook takes over: the GPU request rules and the opt-in rules.

Pure functions over the pod (and the Namespace, when the webhook could read it). Each
returns either what it found or a (Reason, message) saying why the pod stays as it is.
"""

from gpupack import keys
from gpupack.codec import read_optimize
from gpupack.errors import ContractError
from gpupack.gpu_request import GpuScan
from gpupack.objects import JSON, PodSpec, labels_of
from webhook.decision import Reason


def gpu_out_of_scope(scan: GpuScan) -> tuple[Reason, str] | None:
    if scan.other:
        return Reason.OTHER_GPU_RESOURCE, (
            f"asks for {', '.join(scan.other)}; gpupack only shares whole {keys.NVIDIA_GPU} GPUs"
        )
    if scan.total == 0:
        return Reason.NO_GPU, f"no container asks for {keys.NVIDIA_GPU}"
    if scan.total > 1:
        return Reason.MULTIPLE_GPUS, (
            f"asks for {scan.total} GPUs in total; gpupack shares pods that ask for exactly one"
        )
    return None


def opt_in(pod_labels: dict[str, str], namespace: JSON | None) -> tuple[Reason, str] | None:
    """None when the pod is opted in; otherwise why not.

    The pod's own label wins over its namespace's. When the Namespace could not be read,
    the API server's selectors already sent only opted-in pods, so the pod is in.
    Raises ContractError for a label value other than enabled/disabled.
    """
    pod_choice = read_optimize(pod_labels)
    if pod_choice is False:
        return Reason.OPTED_OUT, f"the pod is labelled {keys.OPTIMIZE}={keys.OPTIMIZE_DISABLED}"
    if pod_choice is True or namespace is None:
        return None
    try:
        ns_choice = read_optimize(labels_of(namespace))
    except ContractError as exc:
        return Reason.NOT_OPTED_IN, f"the namespace's label is not usable: {exc}"
    if ns_choice is True:
        return None
    if ns_choice is False:
        return Reason.OPTED_OUT, (
            f"the namespace is labelled {keys.OPTIMIZE}={keys.OPTIMIZE_DISABLED}"
        )
    return Reason.NOT_OPTED_IN, (
        f"neither the pod nor its namespace is labelled {keys.OPTIMIZE}={keys.OPTIMIZE_ENABLED}"
    )


def scheduling_out_of_scope(spec: PodSpec) -> tuple[Reason, str] | None:
    node_name = spec.get("nodeName")
    if node_name:
        return Reason.NODE_NAME_SET, f"spec.nodeName is already set to {node_name!r}"
    scheduler = spec.get("schedulerName") or keys.DEFAULT_SCHEDULER
    if scheduler not in (keys.DEFAULT_SCHEDULER, keys.SCHEDULER_NAME):
        return Reason.OTHER_SCHEDULER, f"spec.schedulerName names another scheduler: {scheduler!r}"
    return None
