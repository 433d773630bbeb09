# Sourced by hack/* scripts (after venv.sh, binaries.sh and image.sh): what the local
# cluster's real node needs besides the kubelet and kube-proxy binaries: Debian's
# containerd, runc, CNI plugins (in /usr/lib/cni), iptables and conntrack, and the images
# it runs (ensure_node_images); and libfaketime, for the tests of nodes whose clocks are
# off. Exports GPUPACK_NODE_IMAGES.
set -euo pipefail
: "${repo:?source hack/lib/venv.sh first}"

ensure_node() {
  local missing=() tool package
  for tool in containerd:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins \
    iptables:iptables conntrack:conntrack; do
    package=${tool#*:}
    tool=${tool%%:*}
    command -v "$tool" >/dev/null 2>&1 || [ -x "$tool" ] || missing+=("$package")
  done
  # libfaketime: the clock-skew tests run components with their node's clock off.
  compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || missing+=(libfaketime)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "hack: installing Debian's ${missing[*]} for the real node and the clock tests" >&2
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  ensure_node_images
}
