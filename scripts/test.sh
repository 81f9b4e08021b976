#!/usr/bin/env bash
# The whole test suite, installing what it needs first: `bash scripts/test.sh [pytest args]`.
# Fails when pytest collects no test (exit code 5), so an empty run never passes silently.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" dev gpu models
py="${JARVIS_VENV:-$root/.venv}/bin/python"
cd "$root"
"$py" scripts/sz.py || true
set +e
"$py" -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
