#!/usr/bin/env bash
# The main job: builds torchneuron if needed, then runs the demonstration on the neuron device.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m demo "$@"
