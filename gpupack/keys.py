"""Every label, annotation, name and resource gpupack reads or writes (DESIGN.md's contract).

One place so a typo is a NameError, not a silently ignored key.
"""

from typing import Final

DOMAIN: Final = "gpupack.io"

# Labels.
OPTIMIZE: Final = f"{DOMAIN}/optimize"  # on Namespace, pod template or pod: enabled|disabled
ROLE: Final = f"{DOMAIN}/role"  # on capacity pods: "capacity"
POOL: Final = f"{DOMAIN}/pool"  # on capacity pods: the pool key
ROLE_CAPACITY: Final = "capacity"
OPTIMIZE_ENABLED: Final = "enabled"
OPTIMIZE_DISABLED: Final = "disabled"

# Annotations written by the user (optional) or the webhook.
POLICY: Final = f"{DOMAIN}/policy"
GPU_COMPUTE: Final = f"{DOMAIN}/gpu-compute"
GPU_MEMORY: Final = f"{DOMAIN}/gpu-memory"
ORIGINAL_RESOURCES: Final = f"{DOMAIN}/original-resources"
DECISION: Final = f"{DOMAIN}/decision"
# The webhook's seal over its decision (`gpupack.seal`): proof that gpupack admitted the
# pod, checked by the webhook at reinvocation and by the scheduler before placing it.
SEAL: Final = f"{DOMAIN}/seal"
# How the shares are enforced: accounting, or what applies of mps and memory
# (`gpupack.cuda.enforcement_value`).
ENFORCEMENT: Final = f"{DOMAIN}/enforcement"
# Written by the user (optional): `off` takes one workload out of memory enforcement,
# `on` asks for it where its policy says Off.
MEMORY_ENFORCEMENT: Final = f"{DOMAIN}/memory-enforcement"

# Annotations only the scheduler (on fractional pods) or the exporter (on capacity pods)
# may write. The webhook strips user-supplied values at CREATE.
GPU_UUID: Final = f"{DOMAIN}/gpu-uuid"
CAPACITY_POD: Final = f"{DOMAIN}/capacity-pod"
SCHEDULER_ONLY: Final = (GPU_UUID, CAPACITY_POD)
# Written by the webhook alone: a user-supplied value is stripped at CREATE unless the
# pod carries a valid, fresh seal (a reinvocation of the same admission).
WEBHOOK_ONLY: Final = (DECISION, SEAL, ORIGINAL_RESOURCES, ENFORCEMENT)
# A condition on a fractional pod the extender refused, set by the scheduler when a GPU
# the pod may use has room again (a share freed, a reservation expired, a capacity pod
# became usable); its lastTransitionTime says when. kube-scheduler retries a pod it
# parked after its extender refused it on any update of that pod, and this is one.
REQUEUE_CONDITION: Final = f"{DOMAIN}/GPUWithRoom"
# On a capacity pod, by the exporter: why its GPU is unhealthy (lost, a critical XID);
# absent while it is healthy. The scheduler places no new pod on such a GPU.
GPU_UNHEALTHY: Final = f"{DOMAIN}/gpu-unhealthy"
# On a capacity pod, by the scheduler: when consolidation began to empty its GPU (an
# RFC 3339 time). The scheduler places no new pod on it; once its pods have moved, the
# capacity pod is deleted. Removed again when the drain is given up.
DRAINING: Final = f"{DOMAIN}/draining"
# On a fractional pod of a ReplicaSet, by the scheduler: the pod-deletion-cost it last
# wrote there. The scheduler keeps managing the cost only while the two agree, so a cost
# the user sets is left alone.
DELETION_COST: Final = f"{DOMAIN}/deletion-cost"
# Kubernetes' own: the ReplicaSet controller deletes pods with a lower cost first.
POD_DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"

# On a Deployment's or StatefulSet's pod template: set by the recommender (updateMode
# Auto) to roll the workload's pods onto a new recommendation, as `kubectl rollout
# restart` sets kubectl.kubernetes.io/restartedAt.
RESTARTED_AT: Final = f"{DOMAIN}/restarted-at"
# On a capacity pod, by the scheduler: "true" while fractional pods use its GPU. The
# chart's admission policy refuses to delete such a pod and its PodDisruptionBudget
# refuses to evict it, so a GPU stays held while anything runs on it.
HOSTING: Final = f"{DOMAIN}/hosting"

SCHEDULER_NAME: Final = "gpupack-scheduler"
# The second profile of gpupack's kube-scheduler: it places capacity pods, packing GPU
# nodes (NodeResourcesFit MostAllocated on nvidia.com/gpu) where the default scheduler
# would spread them.
CAPACITY_SCHEDULER_NAME: Final = "gpupack-capacity"
SYSTEM_NAMESPACE: Final = "gpupack-system"
DEFAULT_SCHEDULER: Final = "default-scheduler"

# Extended resources.
NVIDIA_GPU: Final = "nvidia.com/gpu"
# What the webhook charges a rewritten pod's GPU container, so a ResourceQuota binds:
# compute in thousandths of a GPU (extended resources are whole numbers), memory in
# bytes. kube-scheduler ignores them (the extender's managedResources), kubelets drop
# them (no node advertises them), quota admission charges them.
RESOURCE_COMPUTE: Final = f"{DOMAIN}/gpu-compute-milli"
RESOURCE_MEMORY: Final = f"{DOMAIN}/gpu-memory"
NVIDIA_PREFIX: Final = "nvidia.com/"
# NVIDIA's DRA driver for GPUs: where a node's GPUs are DRA devices, its ResourceSlices
# name this driver, and a whole GPU is a device whose `type` attribute is "gpu" (its
# `uuid` attribute the GPU's UUID, its `memory` capacity the GPU's memory).
DRA_DRIVER: Final = "gpu.nvidia.com"
DRA_GPU_TYPE: Final = "gpu"
DRA_API: Final = "resource.k8s.io/v1"  # ResourceSlices and ResourceClaims, GA from 1.34
OTHER_GPU_PREFIXES: Final = ("amd.com/", "gpu.intel.com/", "habana.ai/")

# On a GPU node, by gpupack-scheduler: a name for the node that capacity pods can exclude
# in required node affinity (`gpupack.io/node NotIn [...]`) where Karpenter refuses
# `kubernetes.io/hostname`. Written once, when absent; never changed after
# (`scheduler.exclusion.node_label_value`).
NODE: Final = f"{DOMAIN}/node"

# GPU Feature Discovery node labels.
GFD_PRODUCT: Final = "nvidia.com/gpu.product"
GFD_MEMORY_MIB: Final = "nvidia.com/gpu.memory"  # per-GPU memory in MiB
GFD_COUNT: Final = "nvidia.com/gpu.count"

# Cluster autoscaler and Karpenter: do not evict a capacity pod that hosts workloads.
CA_SAFE_TO_EVICT: Final = "cluster-autoscaler.kubernetes.io/safe-to-evict"
KARPENTER_DO_NOT_DISRUPT: Final = "karpenter.sh/do-not-disrupt"
# Taints an autoscaler puts on a node it has decided to remove (Karpenter while it
# disrupts one, Cluster Autoscaler while it scales one down): gpupack puts nothing new
# there and gives back the GPUs it holds there that host nothing.
AUTOSCALER_REMOVAL_TAINTS: Final = frozenset(
    {"karpenter.sh/disrupted", "ToBeDeletedByClusterAutoscaler"}
)

# Container environment.
ENV_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_DRIVER_CAPABILITIES: Final = "NVIDIA_DRIVER_CAPABILITIES"
ENV_MPS_THREAD_PERCENTAGE: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_MEMORY_LIMIT: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
DEFAULT_DRIVER_CAPABILITIES: Final = "compute,utility"
