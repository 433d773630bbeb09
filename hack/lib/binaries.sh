# Sourced by hack/* scripts: builds the pinned upstream binaries from their published Go
# modules, once, and puts them on PATH. Each tool is cached on its own, in
# $GPUPACK_CACHE/tools/<tool>-<version>-<recipe hash>/ (default ~/.cache/gpupack, outside
# the checkout so fresh clones on the same machine reuse it): changing one tool's version
# or build recipe rebuilds that tool alone. $GPUPACK_BIN_DIR is one folder of links to
# the whole set.
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
#   kubelet, kube-proxy (the real node)                                 (k8s.io/kubernetes)
#   etcd                                                                  (go.etcd.io/etcd)
#   kwok                                                                  (sigs.k8s.io/kwok)
#   helm                                                                  (helm.sh/helm/v3)
#   prometheus, promtool                                (github.com/prometheus/prometheus)
#   karpenter-kwok, and its CRDs in crds/               (sigs.k8s.io/karpenter/kwok)
# ensure_kube_versions builds the Kubernetes binaries of each of KUBERNETES_SMOKE_VERSIONS
# the same way, and a folder of links per version: the set above with that release's.
set -euo pipefail
: "${repo:?source hack/lib/venv.sh first}"
KUBE_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
_GO_NOISE='^go: \(added\|upgraded\|downgraded\|finding\|downloading\)'

ensure_go() {
  if ! command -v go >/dev/null 2>&1; then
    echo "hack: Go is needed to build the Kubernetes binaries; installing Debian's golang" >&2
    apt-get update -qq && apt-get install -y -qq golang-go >/dev/null
  fi
}

# The module graph of k8s.io/kubernetes points its staging modules (k8s.io/api, ...) at
# ./staging; a consumer replaces each with its published v0.X.Y twin.
_kube_replaces() {
  local version=$1 gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$gomod" |
    while read -r module; do echo "replace $module => $module v0${version#v1}"; done
}

_build_kubernetes() {
  local out=$1 work
  work=$(mktemp -d)
  (
    cd "$work"
    go mod init gpupack.local/kubebuild 2>/dev/null
    _kube_replaces "$KUBERNETES_VERSION" >>go.mod
    local cmd packages=()
    for cmd in "${KUBE_COMMANDS[@]}"; do packages+=("k8s.io/kubernetes/cmd/$cmd"); done
    go get "${packages[@]/%/@$KUBERNETES_VERSION}" 2>&1 | grep -v "$_GO_NOISE" >&2 || true
    go build -trimpath -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION \
      -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)" \
      -o "$out/" "${packages[@]}"
  )
  rm -rf "$work"
}

# etcd's server module and Prometheus replace some of their dependencies, which
# `go install pkg@v` refuses; built from a scratch module those replaces do not apply.
_build_in_scratch_module() {  # version "go build flags" packages...
  local version=$1 flags=$2 work
  shift 2
  work=$(mktemp -d)
  (
    cd "$work"
    go mod init gpupack.local/build 2>/dev/null
    go get "${@/%/@$version}" 2>&1 | grep -v "$_GO_NOISE" >&2 || true
    # shellcheck disable=SC2086  # flags are words
    go build -trimpath -ldflags "-s -w" $flags "$@"
  )
  rm -rf "$work"
}

_build_etcd() { _build_in_scratch_module "$ETCD_VERSION" "-o $1/etcd" go.etcd.io/etcd/server/v3; }

_build_kwok() { GOBIN="$1" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"; }

_build_helm() { GOBIN="$1" go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"; }

# The harness scrapes fixed targets, so no service-discovery plugin is linked
# (remove_all_sd), and the API is all the tests read, so the web UI's assets are not
# embedded. promtool is the same module's rule tester.
_build_prometheus() {
  _build_in_scratch_module "$PROMETHEUS_VERSION" "-tags remove_all_sd -o $1/" \
    github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool
}

# Karpenter's kwok provider, the real autoscaler the tests start on demand. Its binary is
# named kwok like the simulator, so it is installed as karpenter-kwok; the CRDs it needs
# (NodePool, NodeClaim, NodeOverlay from kwok/charts/crds, KWOKNodeClass from
# kwok/apis/crds: the copies under pkg/apis/crds refuse the kwok labels) go beside it.
_build_karpenter() {
  local module
  GOBIN="$1/gobin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/karpenter/kwok@$KARPENTER_VERSION"
  mv "$1/gobin/kwok" "$1/karpenter-kwok" && rmdir "$1/gobin"
  module=$(go mod download -json "sigs.k8s.io/karpenter@$KARPENTER_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  mkdir -p "$1/crds"
  cp "$module"/kwok/charts/crds/karpenter.sh_*.yaml "$module"/kwok/apis/crds/*.yaml "$1/crds/"
  chmod -R u+w "$1/crds"
}

# tool  version variable  binaries it provides
_TOOLS=(
  "kubernetes KUBERNETES_VERSION ${KUBE_COMMANDS[*]}"
  "etcd ETCD_VERSION etcd"
  "kwok KWOK_VERSION kwok"
  "helm HELM_VERSION helm"
  "prometheus PROMETHEUS_VERSION prometheus promtool"
  "karpenter KARPENTER_VERSION karpenter-kwok"
)

_tool_dir() {  # cache tool version binaries: where that build of the tool lives
  local recipe key
  recipe=$(declare -f "_build_$2")
  [[ $recipe != *_build_in_scratch_module* ]] || recipe+=$(declare -f _build_in_scratch_module)
  key=$(echo "$2 $3 $4 $recipe" | sha256sum | cut -c1-12)
  echo "$1/tools/$2-$3-$key"
}

_ensure_tool() {  # dir tool version (not in $(...): a failed build must stop the script)
  local dir=$1 tool=$2 version=$3 started
  [ -f "$dir/.complete" ] && return
  ensure_go
  rm -rf "$dir" && mkdir -p "$dir"
  started=$SECONDS
  echo "hack: building $tool $version from its Go module into $dir (first time only)" >&2
  "_build_$tool" "$dir" >&2
  touch "$dir/.complete"
  echo "hack:   $tool built in $((SECONDS - started)) s" >&2
}

ensure_binaries() {
  set -a; source "$repo/hack/versions.env"; set +a
  local cache="${GPUPACK_CACHE:-$HOME/.cache/gpupack}" entry tool var binaries dir dirs=() key bin
  for entry in "${_TOOLS[@]}"; do
    read -r tool var binaries <<<"$entry"
    dir=$(_tool_dir "$cache" "$tool" "${!var}" "$binaries")
    _ensure_tool "$dir" "$tool" "${!var}"
    for bin in $binaries; do
      [ -x "$dir/$bin" ] || { echo "hack: building $tool left no $bin in $dir" >&2; return 1; }
    done
    dirs+=("$dir")
  done
  key=$(printf '%s\n' "${dirs[@]}" | sha256sum | cut -c1-12)
  local links="$cache/bin/$key"
  if [ ! -f "$links/.complete" ]; then
    mkdir -p "$links"
    for entry in "${_TOOLS[@]}"; do
      read -r tool var binaries <<<"$entry"
      dir=$(_tool_dir "$cache" "$tool" "${!var}" "$binaries")
      for bin in $binaries; do ln -sfn "$dir/$bin" "$links/$bin"; done
    done
    touch "$links/.complete"
  fi
  export GPUPACK_BIN_DIR="$links"
  export PATH="$links:$PATH"
}

# The smoke tier's releases (hack/versions.env: the chart's floor and the newest): each
# one's Kubernetes binaries, cached per version like the pinned one, and a folder of links
# like $GPUPACK_BIN_DIR but with that release's. Needs ensure_binaries. Sets
# KUBE_VERSION_BIN_DIRS: "version=folder" words, in the order of the versions.
ensure_kube_versions() {
  local cache="${GPUPACK_CACHE:-$HOME/.cache/gpupack}" version dir links bin key
  KUBE_VERSION_BIN_DIRS=()
  for version in $KUBERNETES_SMOKE_VERSIONS; do
    dir=$(_tool_dir "$cache" kubernetes "$version" "${KUBE_COMMANDS[*]}")
    KUBERNETES_VERSION=$version _ensure_tool "$dir" kubernetes "$version"
    key=$( (echo "$GPUPACK_BIN_DIR"; echo "$dir") | sha256sum | cut -c1-12)
    links="$cache/bin/$key"
    if [ ! -f "$links/.complete" ]; then
      mkdir -p "$links"
      for bin in "$GPUPACK_BIN_DIR"/*; do ln -sfn "$(readlink "$bin")" "$links/${bin##*/}"; done
      for bin in "${KUBE_COMMANDS[@]}"; do ln -sfn "$dir/$bin" "$links/$bin"; done
      touch "$links/.complete"
    fi
    KUBE_VERSION_BIN_DIRS+=("$version=$links")
  done
}
