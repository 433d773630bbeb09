"""Test builders: realistic pods and AdmissionRequests (pure data, no fakes of behaviour)."""

import copy
from typing import Any, cast

from gpupack.objects import JSON, Pod
from webhook.review import AdmissionRequest

# Tests build pods as plain dicts; the webhook's TypedDicts describe only what it reads.
TestPod = JSON


def gpu_container(name: str = "main", gpus: Any = "1", **extra: Any) -> JSON:
    container: JSON = {
        "name": name,
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "resources": {"limits": {"nvidia.com/gpu": gpus, "cpu": "2", "memory": "8Gi"}},
    }
    container.update(extra)
    return container


def deployment_pod(**spec_extra: Any) -> TestPod:
    """A pod as the ReplicaSet controller of Deployment `llm` creates it."""
    pod: TestPod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "llm-6d5f8b9c7-",
            "namespace": "ml",
            "labels": {"app": "llm", "pod-template-hash": "6d5f8b9c7"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "llm-6d5f8b9c7",
                    "uid": "0b6c0c4e-1d7a-4d53-9d1f-3f1c1b1d2e3f",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [gpu_container()],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
        },
    }
    pod["spec"].update(spec_extra)
    return pod


def vllm_pod() -> TestPod:
    """A pod as the ReplicaSet controller of Deployment `llm-server` creates it, after the
    API server's defaulting: about what kube-apiserver sends a mutating webhook."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "llm-server-7d9f8b6c5d-",
            "namespace": "ml",
            "labels": {"app.kubernetes.io/name": "llm-server", "pod-template-hash": "7d9f8b6c5d"},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8000"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "llm-server-7d9f8b6c5d",
                    "uid": "6f1c2b9e-8a47-4c3e-9b1d-2f5e7a9c0d11",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "server",
                    "image": "vllm/vllm-openai:v0.6.3",
                    "args": ["--model", "/models/llama-3-8b", "--port", "8000"],
                    "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                    "env": [{"name": "HF_HOME", "value": "/models/cache"}],
                    "resources": {
                        "limits": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "24Gi"},
                        "requests": {"nvidia.com/gpu": "1", "cpu": "2", "memory": "16Gi"},
                    },
                    "volumeMounts": [{"name": "models", "mountPath": "/models"}],
                    "readinessProbe": {
                        "httpGet": {"path": "/health", "port": 8000, "scheme": "HTTP"},
                        "periodSeconds": 10,
                    },
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}}],
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "schedulerName": "default-scheduler",
            "securityContext": {},
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0,
        },
    }


def request(
    pod: TestPod, *, operation: str = "CREATE", dry_run: bool = False, uid: str = "req-1"
) -> AdmissionRequest:
    meta = pod.get("metadata") or {}
    return AdmissionRequest(
        uid=uid,
        operation=operation,
        namespace=str(meta.get("namespace", "ml")),
        name=str(meta.get("name", "")),
        dry_run=dry_run,
        pod=cast(Pod, copy.deepcopy(pod)),
    )


def namespace(
    labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "ml", "labels": labels or {}, "annotations": annotations or {}},
    }


def review(pod: TestPod, uid: str = "req-1", dry_run: bool = False) -> JSON:
    meta = pod.get("metadata") or {}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": meta.get("namespace", "ml"),
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def as_the_api_server_sends_it(pod: dict[str, Any], suffix: str) -> dict[str, Any]:
    """What the API server makes of one pod of a template before any webhook: a
    service-account token volume of its own name, mounted in every container, and the
    time it was written in its managed fields."""
    pod = copy.deepcopy(pod)
    token = f"kube-api-access-{suffix}"
    spec = pod.setdefault("spec", {})
    spec["volumes"] = [*(spec.get("volumes") or []), {"name": token, "projected": {}}]
    for container in spec.get("containers") or []:
        if isinstance(container, dict):
            mount = {"name": token, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
            container["volumeMounts"] = [*(container.get("volumeMounts") or []), mount]
    meta = pod.setdefault("metadata", {})
    meta["managedFields"] = [{"manager": "kube-controller-manager", "time": suffix}]
    return pod
