#!/usr/bin/env bash
# The kind path, for machines with Docker (it cannot run where Docker does not: our CI
# machines use the local control plane of hack/localcluster/ instead).
#
#   hack/kind.sh up      create a kind cluster with 2 workers advertising fake GPUs,
#                        build the image, load it, and helm install the chart
#   hack/kind.sh test    run the integration suite against it (GPUPACK_TEST_KUBECONFIG)
#   hack/kind.sh down    delete the cluster
#
# Needs docker, kind, kubectl and helm on PATH.
set -euo pipefail
source "$(dirname "$0")/lib/venv.sh"
cd "$repo"
name=${KIND_CLUSTER_NAME:-gpupack}
work="$repo/.cache/kind"
kubeconfig="$work/kubeconfig"

need() { command -v "$1" >/dev/null || { echo "hack/kind.sh: $1 is needed on PATH" >&2; exit 1; }; }

up() {
  need docker; need kind; need kubectl; need helm
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
  docker build -t "gpupack:kind" "$repo"
  kind load docker-image "gpupack:kind" --name "$name"
  helm upgrade --install gpupack "$repo/charts/gpupack" --namespace gpupack-system --create-namespace \
    --set image.repository=gpupack --set image.tag=kind --set image.pullPolicy=Never --wait
  echo "kind cluster $name is up with gpupack installed; export KUBECONFIG=$kubeconfig"
}

down() {
  command -v kind >/dev/null && kind delete cluster --name "$name" || true
}

case "${1:-}" in
  up) up ;;
  test) ensure_venv; GPUPACK_TEST_KUBECONFIG=$kubeconfig exec python -m pytest tests/integration "${@:2}" ;;
  down) down ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac
