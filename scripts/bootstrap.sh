#!/usr/bin/env bash
# Creates or reuses the virtual environment .venv at the repository root, installs the
# pinned dependencies, and builds and installs torchneuron (C++ extension included).
# Sourced by scripts/demo.sh and scripts/test.sh; safe to run again (incremental).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { echo "[bootstrap] $*"; }

find_python() {
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

if [ ! -x .venv/bin/python ]; then
  PYTHON="$(find_python)" || {
    echo "error: Python 3.11 is required (the torch==2.13.0 CPU wheel is built for it)." >&2
    exit 1
  }
  say "creating .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
PY="$ROOT/.venv/bin/python"

stamp=".venv/.requirements.sha256"
want="$(sha256sum requirements.txt | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  say "installing pinned dependencies (requirements.txt); first run takes a few minutes"
  "$PY" -m pip install --progress-bar off --upgrade pip >/dev/null
  "$PY" -m pip install --progress-bar off -r requirements.txt
  echo "$want" >"$stamp"
fi

# ccache makes rebuilds of the C++ extension cheap when it is there.
if ! command -v ccache >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  say "installing ccache (Debian package)"
  apt-get install -y -q ccache >/dev/null 2>&1 || say "ccache not installed; builds just take longer"
fi

say "building the C++ extension and installing torchneuron (incremental)"
start=$(date +%s)
# The build's exit status decides, not the import below: after a failed build the previous
# extension would still import.
log="build/bootstrap-build.log"
mkdir -p build
if ! "$PY" -m pip install --progress-bar off --no-build-isolation --no-deps -e . -v 2>&1 |
  tee "$log" | { grep -E --line-buffered '^\s*\[[0-9]+/[0-9]+\]' || true; }; then
  grep -E 'error|Error' "$log" | head -n 40 >&2 || true
  echo "error: the torchneuron extension did not build (whole log: $log)" >&2
  exit 1
fi
"$PY" -c "import torchneuron._C" || {
  echo "error: the torchneuron extension did not build; rerun with: $PY -m pip install --no-build-isolation -e . -v" >&2
  exit 1
}
if ! "$PY" -m pip show torch-neuronx >/dev/null 2>&1; then
  "$PY" -m pip install --progress-bar off --no-build-isolation --no-deps -e compat/torch-neuronx >/dev/null
fi
say "torchneuron ready in $(($(date +%s) - start)) s"
