# Sourced by hack/* scripts: builds the pinned upstream binaries from their published Go
# modules into $GPUPACK_CACHE/bin/<hash>/ (default ~/.cache/gpupack, outside the checkout
# so fresh clones on the same machine reuse it), once; later calls reuse them. The hash
# covers hack/versions.env and this file: changing either rebuilds.
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl   (k8s.io/kubernetes)
#   etcd, etcdctl                                                         (go.etcd.io/etcd)
#   kwok                                                                  (sigs.k8s.io/kwok)
#   helm                                                                  (helm.sh/helm/v3)
set -euo pipefail
: "${repo:?source hack/lib/venv.sh first}"
KUBE_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

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
    go get "${packages[@]/%/@$KUBERNETES_VERSION}" 2>&1 | grep -v "^go: \(added\|upgraded\|downgraded\|finding\|downloading\)" >&2 || true
    go build -trimpath -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION \
      -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)" \
      -o "$out/" "${packages[@]}"
  )
  rm -rf "$work"
}

# etcd's server module replaces its siblings with ../ paths, which `go install pkg@v`
# refuses; built from a scratch module those replaces do not apply.
_build_etcd() {
  local out=$1 work
  work=$(mktemp -d)
  (
    cd "$work"
    go mod init gpupack.local/etcdbuild 2>/dev/null
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" 2>&1 | grep -v "^go: \(added\|upgraded\|downgraded\|finding\|downloading\)" >&2 || true
    go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
  )
  rm -rf "$work"
}

_go_install() {  # module@version and package paths into $out
  local out=$1; shift
  GOBIN="$out" go install -trimpath -ldflags "-s -w" "$@"
}

ensure_binaries() {
  set -a; source "$repo/hack/versions.env"; set +a
  local key dir
  key=$(cat "$repo/hack/versions.env" "$repo/hack/lib/binaries.sh" | sha256sum | cut -c1-12)  # contents only: any clone, any path
  dir="${GPUPACK_CACHE:-$HOME/.cache/gpupack}/bin/$key"
  if [ ! -f "$dir/.complete" ]; then
    ensure_go
    mkdir -p "$dir"
    local started=$SECONDS
    echo "hack: building Kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION and helm $HELM_VERSION from their Go modules into $dir (first time only: 10-30 minutes on 2 cores)" >&2
    [ -x "$dir/kube-apiserver" ] || { echo "hack:   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl" >&2; _build_kubernetes "$dir"; }
    [ -x "$dir/etcd" ] || { echo "hack:   etcd" >&2; _build_etcd "$dir"; }
    [ -x "$dir/kwok" ] || { echo "hack:   kwok" >&2; _go_install "$dir" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"; }
    [ -x "$dir/helm" ] || { echo "hack:   helm" >&2; _go_install "$dir" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"; }
    touch "$dir/.complete"
    echo "hack: binaries built in $((SECONDS - started)) s" >&2
  fi
  export GPUPACK_BIN_DIR="$dir"
  export PATH="$dir:$PATH"
}
