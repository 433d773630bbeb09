# Sourced by hack/* scripts: makes .venv with the project and its dev tools installed.
# Reinstalls only when pyproject.toml changes (its hash is stamped in the venv).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv="$repo/.venv"

ensure_venv() {
  local python=${PYTHON:-python3}
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "hack: gpupack needs Python 3.11 or newer; '$python' is $("$python" --version 2>&1)" >&2
    exit 1
  fi
  if [ ! -x "$venv/bin/python" ]; then
    echo "hack: creating the virtual environment in .venv" >&2
    if ! "$python" -m venv "$venv" 2>/dev/null; then
      echo "hack: python3 -m venv failed; installing Debian's python3-venv" >&2
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      "$python" -m venv "$venv"
    fi
  fi
  local stamp="$venv/.gpupack-installed" want
  want=$(sha256sum "$repo/pyproject.toml" | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "hack: installing gpupack and its dev tools into .venv (pyproject.toml changed)" >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$repo[dev]"
    echo "$want" >"$stamp"
  fi
  export PATH="$venv/bin:$PATH"
}
