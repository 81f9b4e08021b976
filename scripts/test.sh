#!/usr/bin/env bash
# The whole test suite, installing what it needs first: `bash scripts/test.sh [pytest args]`.
# Fails when pytest collects no test (exit code 5), so an empty run never passes silently.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" dev gpu models
# The TUI's end-to-end test drives a real terminal in tmux; install it where we can (Debian, root).
if ! command -v tmux >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "==> installing tmux for the terminal end-to-end test" >&2
  (apt-get update -qq && apt-get install -y -qq tmux) >/dev/null 2>&1 || echo "warning: tmux not installed; its test will skip" >&2
fi
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
