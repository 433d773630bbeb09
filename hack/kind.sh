#!/usr/bin/env bash
# The kind path, for machines with Docker (it cannot run where Docker does not: our CI
# machines use the local control plane of hack/localcluster.py instead).
#
#   hack/kind.sh up      create a kind cluster with 2 workers advertising fake GPUs, run
#                        the webhook on this host and register it with the cluster
#   hack/kind.sh test    run the integration suite against it (GPUPACK_TEST_KUBECONFIG)
#   hack/kind.sh down    delete the cluster and stop the webhook
#
# Until the Helm chart lands (it will build and load the image and install the chart
# here), the webhook runs as a host process that kind's nodes reach at the Docker
# network's gateway address. Needs: docker, kind, kubectl on PATH.
set -euo pipefail
source "$(dirname "$0")/lib/venv.sh"
cd "$repo"
name=${KIND_CLUSTER_NAME:-gpupack}
work="$repo/.cache/kind"
kubeconfig="$work/kubeconfig"
port=${GPUPACK_WEBHOOK_PORT:-9443}

need() { command -v "$1" >/dev/null || { echo "hack/kind.sh: $1 is needed on PATH" >&2; exit 1; }; }

up() {
  need docker; need kind; need kubectl
  ensure_venv
  mkdir -p "$work"
  cat >"$work/kind.yaml" <<YAML
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
    labels: {nvidia.com/gpu.present: "true", nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB, nvidia.com/gpu.memory: "81920", nvidia.com/gpu.count: "8"}
  - role: worker
    labels: {nvidia.com/gpu.present: "true", nvidia.com/gpu.product: NVIDIA-L4, nvidia.com/gpu.memory: "23034", nvidia.com/gpu.count: "2"}
YAML
  kind get clusters | grep -qx "$name" || kind create cluster --name "$name" --config "$work/kind.yaml" --kubeconfig "$kubeconfig"
  export KUBECONFIG=$kubeconfig
  # Advertise fake GPUs: an extended resource patched into the node status (no device
  # plugin, so kubelet admits pods asking for it without giving them a device).
  for node in $(kubectl get nodes -l nvidia.com/gpu.present=true -o name); do
    count=$(kubectl get "$node" -o jsonpath='{.metadata.labels.nvidia\.com/gpu\.count}')
    kubectl patch "$node" --subresource=status --type=json \
      -p "[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"$count\"}]" >/dev/null
  done
  gateway=$(docker network inspect kind -f '{{range .IPAM.Config}}{{.Gateway}} {{end}}' | tr ' ' '\n' | grep -m1 '\.')
  python - "$work" "$gateway" "$port" <<'PY'
import sys
from pathlib import Path
from hack.localcluster import Kube, webhook_configuration, webhook_rbac
from certs import pem
from datetime import UTC, datetime
work, gateway, port = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
now = datetime.now(UTC)
ca = pem.new_ca("gpupack-kind-ca", now=now)
leaf = pem.issue(ca, "gpupack-webhook", now=now, names=[gateway, "127.0.0.1"])
(work / "ca.crt").write_bytes(ca.cert_pem)
(work / "tls.crt").write_bytes(leaf.cert_pem)
(work / "tls.key").write_bytes(leaf.key_pem)
kube = Kube.from_kubeconfig(work / "kubeconfig")
kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpupack-system"}})
kube.apply(webhook_configuration(f"https://{gateway}:{port}/mutate", ca.cert_pem))
PY
  nohup gpupack-webhook serve --host 0.0.0.0 --port "$port" --metrics-port 0 \
    --tls-cert-file "$work/tls.crt" --tls-private-key-file "$work/tls.key" \
    --kubeconfig "$kubeconfig" --audit-file "$work/audit.log" >"$work/webhook.log" 2>&1 &
  echo $! >"$work/webhook.pid"
  echo "kind cluster $name is up; KUBECONFIG=$kubeconfig; webhook log $work/webhook.log"
}

down() {
  [ -f "$work/webhook.pid" ] && kill "$(cat "$work/webhook.pid")" 2>/dev/null || true
  rm -f "$work/webhook.pid"
  command -v kind >/dev/null && kind delete cluster --name "$name" || true
}

case "${1:-}" in
  up) up ;;
  test) ensure_venv; GPUPACK_TEST_KUBECONFIG=$kubeconfig exec python -m pytest tests/integration "${@:2}" ;;
  down) down ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac
