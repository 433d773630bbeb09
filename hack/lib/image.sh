# Sourced by hack/* scripts (after venv.sh): builds gpupack's image from the repository's
# Dockerfile without Docker, and caches it.
#
#   base    a Python base image made from Debian's packages (debootstrap: bookworm,
#           minbase, python3 + venv), the local stand-in for python:3.X-slim-bookworm;
#           no container registry is reachable here. Rebuilt when its recipe changes.
#   image   `buildah build` of ./Dockerfile with PYTHON_IMAGE=<base>, as `docker build`
#           would run it; written as an OCI archive. Rebuilt when anything the Dockerfile
#           copies changes (its inputs' hash names the archive).
#
# Both live in $GPUPACK_CACHE/image/ (default ~/.cache/gpupack/image): buildah's storage
# (vfs: no overlay-on-overlay needed), the base's root file system and the archives.
# Exports GPUPACK_IMAGE_ARCHIVE (the archive) and GPUPACK_IMAGE (its name and tag).
set -euo pipefail
: "${repo:?source hack/lib/venv.sh first}"
DEBIAN_SUITE=bookworm
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
IMAGE_REPOSITORY=ghcr.io/gpupack/gpupack  # the chart's image.repository

_image_tools() {
  local missing=()
  command -v buildah >/dev/null || missing+=(buildah)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v umoci >/dev/null || missing+=(umoci)  # the tests unpack the image and run it
  command -v runc >/dev/null || missing+=(runc)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "hack: installing Debian's ${missing[*]} to build and run the image without Docker" >&2
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

_buildah() { buildah --root "$_image_cache/storage" --runroot "$_image_cache/run" --storage-driver vfs "$@"; }

# This machine may reach the package registries through a TLS proxy whose CA only the
# host trusts: RUN steps see the host's CA bundle and pip settings, mounted for the build
# only (never in a layer of the image).
_build_mounts() {
  local path
  for path in /etc/ssl/certs/ca-certificates.crt /etc/pip.conf; do
    [ -f "$path" ] && echo "--volume=$path:$path:ro"
  done
  return 0
}

_ensure_base() {  # sets _base (the base image's name)
  local recipe key
  recipe=$(declare -f _ensure_base _make_base)
  key=$(echo "$DEBIAN_SUITE $recipe" | sha256sum | cut -c1-12)
  _base="localhost/gpupack-python:$DEBIAN_SUITE-$key"
  _buildah inspect --type image "$_base" >/dev/null 2>&1 && return
  _make_base
}

_make_base() {
  local rootfs="$_image_cache/base-rootfs" started=$SECONDS container mount
  echo "hack: building the Python base image $_base from Debian's packages (first time only)" >&2
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
    "$DEBIAN_SUITE" "$rootfs" "$DEBIAN_MIRROR" >"$_image_cache/debootstrap.log" 2>&1 ||
    { tail -20 "$_image_cache/debootstrap.log" >&2; return 1; }
  # What python:slim leaves out too: package caches, documentation, locales.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* \
    "$rootfs"/usr/share/info/*
  container=$(_buildah from scratch)
  mount=$(_buildah mount "$container")
  cp -a "$rootfs/." "$mount/"
  _buildah umount "$container" >/dev/null
  _buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$container"
  _buildah commit -q --rm "$container" "$_base" >/dev/null
  rm -rf "$rootfs"
  echo "hack:   base image built in $((SECONDS - started)) s" >&2
}

# Everything the Dockerfile reads: itself, .dockerignore, and the files it copies.
_image_inputs_hash() {
  (
    cd "$repo"
    git ls-files -z --cached --others --exclude-standard -- Dockerfile .dockerignore \
      pyproject.toml README.md hack/requirements.lock gpupack webhook scheduler recommender \
      cuda-shim \
      exporter node ops certs | grep -zv '/__pycache__/' | sort -z | xargs -0 sha256sum
    echo "$_base"
  ) | sha256sum | cut -c1-12
}

ensure_image() {
  _image_cache="${GPUPACK_CACHE:-$HOME/.cache/gpupack}/image"
  mkdir -p "$_image_cache/archives"
  _image_tools
  _ensure_base
  local key archive started
  key=$(_image_inputs_hash)
  export GPUPACK_IMAGE="$IMAGE_REPOSITORY:dev-$key"
  archive="$_image_cache/archives/gpupack-$key.tar"
  export GPUPACK_IMAGE_ARCHIVE="$archive"
  [ -f "$archive" ] && return
  started=$SECONDS
  echo "hack: building $GPUPACK_IMAGE from ./Dockerfile with buildah (the code changed)" >&2
  # shellcheck disable=SC2046  # one word per mount
  _buildah build -q --isolation chroot --network host --layers=false $(_build_mounts) \
    --build-arg "PYTHON_IMAGE=$_base" -t "$GPUPACK_IMAGE" -f "$repo/Dockerfile" "$repo" \
    >"$_image_cache/build.log" 2>&1 || { tail -30 "$_image_cache/build.log" >&2; return 1; }
  _buildah push -q "$GPUPACK_IMAGE" "oci-archive:$archive.partial:$GPUPACK_IMAGE" >/dev/null
  mv "$archive.partial" "$archive"
  _buildah rmi -q "$GPUPACK_IMAGE" >/dev/null 2>&1 || true  # the archive is the cache
  find "$_image_cache/archives" -name 'gpupack-*.tar' ! -newer "$archive" ! -path "$archive" \
    -mmin +1440 -delete  # archives of code a day old
  echo "hack:   image built in $((SECONDS - started)) s: $(du -h "$archive" | cut -f1) archive" >&2
}

# The other images the real node runs, made here because no registry is reachable: the
# sandbox ("pause") image containerd starts every pod with, built from the pause.c of
# the pinned Kubernetes release; and the chart's kube-scheduler image
# (registry.k8s.io/kube-scheduler:<cluster version>), the pinned kube-scheduler binary
# on the Debian base. Needs ensure_binaries. Exports GPUPACK_NODE_IMAGES: the archives.
ensure_node_images() {
  [ -n "${_base:-}" ] || ensure_image
  local pause_dir key archive container
  pause_dir=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
    sed -n 's/.*"Dir": "\(.*\)".*/\1/p')/build/pause/linux
  key=$( (declare -f ensure_node_images; cat "$pause_dir/pause.c") | sha256sum | cut -c1-12)
  archive="$_image_cache/archives/pause-$key.tar"
  if [ ! -f "$archive" ]; then
    echo "hack: building the pause image from Kubernetes $KUBERNETES_VERSION's pause.c" >&2
    gcc -Os -static -o "$_image_cache/pause" -DVERSION="$KUBERNETES_VERSION" "$pause_dir/pause.c"
    container=$(_buildah from scratch)
    _buildah copy -q "$container" "$_image_cache/pause" /pause >/dev/null
    _buildah config --entrypoint '["/pause"]' --user 65535:65535 "$container"
    _buildah commit -q --rm "$container" registry.k8s.io/pause:3.10 >/dev/null
    _buildah push -q registry.k8s.io/pause:3.10 "oci-archive:$archive:registry.k8s.io/pause:3.10"
  fi
  _PAUSE_ARCHIVE=$archive
  cuda_env_image
  kube_scheduler_image "$KUBERNETES_VERSION" "$(command -v kube-scheduler)"
  export GPUPACK_NODE_IMAGES="$_PAUSE_ARCHIVE:$_CUDA_ENV_ARCHIVE:$KUBE_SCHEDULER_ARCHIVE:$GPUPACK_IMAGE_ARCHIVE"
}

# An image whose ENV says what every CUDA base image says (NVIDIA_VISIBLE_DEVICES=all,
# CUDA_VERSION): the pause binary, so it runs anywhere. The trust-boundary test runs it
# on the real node and reads the environment containerd gives its container, what the
# NVIDIA container toolkit reads. Needs _PAUSE_ARCHIVE. Exports GPUPACK_CUDA_ENV_IMAGE.
cuda_env_image() {
  local key container name=gpupack.test/cuda-env:1
  key=$( (declare -f cuda_env_image; echo "$_PAUSE_ARCHIVE") | sha256sum | cut -c1-12)
  _CUDA_ENV_ARCHIVE="$_image_cache/archives/cuda-env-$key.tar"
  if [ ! -f "$_CUDA_ENV_ARCHIVE" ]; then
    container=$(_buildah from -q "oci-archive:$_PAUSE_ARCHIVE")
    _buildah config --env NVIDIA_VISIBLE_DEVICES=all --env CUDA_VERSION=13.0.0 \
      --env NVIDIA_DRIVER_CAPABILITIES=compute,utility "$container"
    _buildah commit -q --rm "$container" "$name" >/dev/null
    _buildah push -q "$name" "oci-archive:$_CUDA_ENV_ARCHIVE.partial:$name"
    mv "$_CUDA_ENV_ARCHIVE.partial" "$_CUDA_ENV_ARCHIVE"
  fi
  export GPUPACK_CUDA_ENV_IMAGE=$name
}

# registry.k8s.io/kube-scheduler:<version> from that release's binary, for a node of a
# cluster of that version (the smoke tier's too). Sets KUBE_SCHEDULER_ARCHIVE.
kube_scheduler_image() {  # version binary
  local version=$1 source=$2 key container name="registry.k8s.io/kube-scheduler:$1"
  key=$( (declare -f kube_scheduler_image; echo "$_base"; sha256sum <"$source") | sha256sum | cut -c1-12)
  KUBE_SCHEDULER_ARCHIVE="$_image_cache/archives/kube-scheduler-$version-$key.tar"
  if [ ! -f "$KUBE_SCHEDULER_ARCHIVE" ]; then
    echo "hack: building $name from that release's kube-scheduler" >&2
    container=$(_buildah from -q "$_base")
    _buildah copy -q "$container" "$source" /usr/local/bin/kube-scheduler >/dev/null
    _buildah config --entrypoint '["/usr/local/bin/kube-scheduler"]' --cmd '[]' --user 65532:65532 "$container"
    _buildah commit -q --rm "$container" "$name" >/dev/null
    _buildah push -q "$name" "oci-archive:$KUBE_SCHEDULER_ARCHIVE:$name"
  fi
}

# GPUPACK_NODE_IMAGES for a cluster of another release (its binaries in folder): the same
# pause and gpupack images, that release's kube-scheduler. Needs ensure_node_images.
use_node_images_of() {  # version folder
  kube_scheduler_image "$1" "$2/kube-scheduler"
  export GPUPACK_NODE_IMAGES="$_PAUSE_ARCHIVE:$_CUDA_ENV_ARCHIVE:$KUBE_SCHEDULER_ARCHIVE:$GPUPACK_IMAGE_ARCHIVE"
}
