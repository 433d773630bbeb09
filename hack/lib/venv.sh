# Sourced by hack/* scripts: makes .venv with the project and its dev tools installed,
# from hack/requirements-dev.lock (hack/lock writes it from pyproject.toml). Reinstalls
# only when pyproject.toml or the lock changes (their hash is stamped in the venv).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv="$repo/.venv"

_python() {
  local python=${PYTHON:-python3}
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "hack: gpupack needs Python 3.11 or newer; '$python' is $("$python" --version 2>&1)" >&2
    exit 1
  fi
  echo "$python"
}

# _locked_venv folder lock: a virtualenv with exactly `lock` and the project (editable).
_locked_venv() {
  local dir=$1 lock=$2 python
  python=$(_python)
  if [ ! -x "$dir/bin/python" ]; then
    echo "hack: creating the virtual environment in ${dir#"$repo/"}" >&2
    if ! "$python" -m venv "$dir" 2>/dev/null; then
      echo "hack: python3 -m venv failed; installing Debian's python3-venv" >&2
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      "$python" -m venv "$dir"
    fi
  fi
  local stamp="$dir/.gpupack-installed" want
  want=$(cat "$repo/pyproject.toml" "$lock" | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "hack: installing ${lock#"$repo/"} and gpupack into ${dir#"$repo/"}" >&2
    "$dir/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
    "$dir/bin/python" -m pip install -q --disable-pip-version-check -r "$lock" >&2
    "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e "$repo" >&2
    echo "$want" >"$stamp"
  fi
}

ensure_venv() {
  _locked_venv "$venv" "$repo/hack/requirements-dev.lock"
  export PATH="$venv/bin:$PATH"
}

# The floors: every direct dependency at the lowest version pyproject.toml allows.
floors_venv() {
  _locked_venv "$repo/.cache/venv-floors" "$repo/hack/requirements-floors.lock"
  echo "$repo/.cache/venv-floors"
}
