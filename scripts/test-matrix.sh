#!/usr/bin/env bash
# Builds torchneuron against other Pythons and torch releases, each in a fresh virtual
# environment under build/matrix/, runs a representative part of the suite there (device,
# ops, compile, distributed, a Transformers model, NKI kernels, the native GEMM, errors, the
# release check) and prints a table. Not part of CI: PyPI's torch wheels for x86-64 are
# multi-GB CUDA builds (usable on the CPU); CI runs the pinned default (scripts/test.sh).
#
#   ./scripts/test-matrix.sh                         # every combination below
#   ./scripts/test-matrix.sh 3.12:2.13.0 3.11:2.14.1 # chosen ones, python:torch
#
# A venv is reused when it exists (rm -r build/matrix to start over). The torch releases the
# source supports are pyproject.toml's range; CMakeLists.txt refuses others at configure.
# torch comes from pip's configured index; pip's own environment variables choose another
# source, e.g. wheels downloaded beforehand (pip download torch==2.15.0 -d DIR):
#   PIP_FIND_LINKS=DIR ./scripts/test-matrix.sh 3.11:2.15.0
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WORK="$ROOT/build/matrix"
COMBINATIONS=("$@")
if [ ${#COMBINATIONS[@]} -eq 0 ]; then
  COMBINATIONS=(3.11:2.13.0 3.12:2.13.0 3.13:2.13.0 3.11:2.14.1 3.12:2.14.1 3.13:2.14.1
    3.11:2.15.0 3.12:2.15.0 3.13:2.15.0)
fi
SUBSET=(tests/test_device.py tests/test_ops.py tests/test_compile.py tests/test_distributed.py
  tests/test_hf_models.py tests/test_nki_kernels.py tests/test_native_gemm.py
  tests/test_errors.py tests/test_torch_release.py)
WORKERS=$(($(nproc) < 4 ? $(nproc) : 4))
mkdir -p "$WORK"
say() { echo "[matrix] $*"; }

find_python() { # 3.12 -> an interpreter of that version: on PATH, else pyenv's
  local candidate
  for candidate in "python$1" "$HOME"/.pyenv/versions/"$1".*/bin/python; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c "import sys; sys.exit(f'{sys.version_info[0]}.{sys.version_info[1]}' != '$1')" \
        2>/dev/null; then # pyenv's shims answer for versions that are not selected
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

ROWS=()
for combination in "${COMBINATIONS[@]}"; do
  py="${combination%%:*}"
  torch_release="${combination##*:}"
  name="py$py-torch$torch_release"
  venv="$WORK/$name"
  log="$WORK/$name.log"
  : >"$log"
  say "$name (log: $log)"
  build="-" tests="-"
  if ! python="$(find_python "$py")"; then
    ROWS+=("$py|$torch_release|no Python $py|-")
    continue
  fi
  # The build tools and torch first (the pinned ones but torch), then the rest of
  # requirements.txt; torch's release is the one asked for.
  if [ ! -x "$venv/bin/python" ] && ! "$python" -m venv "$venv" >>"$log" 2>&1; then
    ROWS+=("$py|$torch_release|venv failed|-")
    continue
  fi
  grep -v '^torch==' requirements.txt >"$WORK/$name.requirements.txt"
  if "$venv/bin/python" -m pip install -q "torch==$torch_release" \
    -r "$WORK/$name.requirements.txt" >>"$log" 2>&1 &&
    "$venv/bin/python" -m pip install --no-build-isolation --no-deps \
      -C "build-dir=$WORK/$name.build" -e . >>"$log" 2>&1 &&
    "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps \
      -e compat/torch-neuronx >>"$log" 2>&1; then
    build="built"
    summary="$("$venv/bin/python" -m pytest "${SUBSET[@]}" -q -n "$WORKERS" -p no:cacheprovider \
      2>&1 | tee -a "$log" | tail -n 1)"
    tests="${summary//|/ }"
  else
    build="failed (see the log)"
  fi
  ROWS+=("$py|$torch_release|$build|$tests")
done

echo
echo "| Python | torch | build | tests (${#SUBSET[@]} files) |"
echo "|---|---|---|---|"
failed=0
for row in "${ROWS[@]}"; do
  IFS='|' read -r py torch_release build tests <<<"$row"
  echo "| $py | $torch_release | $build | $tests |"
  case "$tests" in *failed* | *error* | -) failed=1 ;; esac
done
exit "$failed"
