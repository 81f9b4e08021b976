#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install Open Jarvis into it
# with the extras named as arguments (for example: bootstrap.sh dev gpu). Safe to run again:
# pip only installs what is missing. Needs Python 3.11+, a C compiler and cmake, since
# llama-cpp-python is built from source (about 5 minutes the first time; pip caches the wheel).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${JARVIS_VENV:-$root/.venv}"
py="${PYTHON:-python3}"

if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "error: Open Jarvis needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating virtual environment in $venv" >&2
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi

extras="$(IFS=,; echo "$*")"
spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
stamp="$venv/.openjarvis-installed-${extras:-core}"
want="$(cat "$root/pyproject.toml" | sha256sum | cut -c1-16) $extras"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  case ",$extras," in
    # torch 2.13.0's CPU build lies on this kind of machine; naming it stops pip from fetching
    # a multi-GB CUDA build for the gpu extra on machines without a GPU.
    *,gpu,*) if ! command -v nvidia-smi >/dev/null 2>&1; then
               "$venv/bin/python" -m pip install -q "torch==2.13.0" >&2 || true
             fi ;;
  esac
  echo "==> installing openjarvis${extras:+[$extras]} (on a new machine this builds llama-cpp-python: ~5 min)" >&2
  "$venv/bin/python" -m pip install -q -e "$spec" >&2
  echo "$want" > "$stamp"
fi
