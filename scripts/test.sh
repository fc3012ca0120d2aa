#!/usr/bin/env bash
# The whole test suite: runtime C++ tests (GoogleTest/CTest), lint, and pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
say() { echo "[test] $*"; }

if [ ! -f /usr/include/gtest/gtest.h ]; then
  say "installing GoogleTest (Debian package libgtest-dev)"
  if [ "$(id -u)" = 0 ]; then apt-get install -y -q libgtest-dev >/dev/null; else sudo apt-get install -y -q libgtest-dev >/dev/null; fi
fi
if ! command -v ip >/dev/null 2>&1; then
  say "installing iproute2 (tests/test_multihost.py builds two hosts from network namespaces)"
  if [ "$(id -u)" = 0 ]; then apt-get install -y -q iproute2 >/dev/null; else sudo apt-get install -y -q iproute2 >/dev/null; fi
fi
say "runtime C++ tests"
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
"$ROOT/.venv/bin/cmake" -S tests/cpp -B build/cpp-tests -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_MAKE_PROGRAM="$ROOT/.venv/bin/ninja" "${launcher[@]}" >/dev/null
"$ROOT/.venv/bin/cmake" --build build/cpp-tests -j2
"$ROOT/.venv/bin/ctest" --test-dir build/cpp-tests --output-on-failure -j2 | tail -n 3

say "lint (ruff, clang-format)"
"$ROOT/.venv/bin/ruff" check torchneuron compat tests benchmarks examples demo devtools cmake
find csrc tests/cpp -name '*.cpp' -o -name '*.h' | xargs "$ROOT/.venv/bin/clang-format" --dry-run -Werror

# The main pytest pass runs its tests on pytest-xdist workers, one per core (at most 4): much
# of the suite is single-threaded (Dynamo and Inductor compiling) or waits on subprocesses.
# Each worker is a process of its own with its own device runtime and compile cache
# (tests/conftest.py). The smaller passes after it run as many pytest processes at once.
WORKERS=$(($(nproc) < 4 ? $(nproc) : 4))
# One directory of Inductor's compiled C++ kernels for every pass (tests/conftest.py): they are
# named by a hash of their source, so a kernel compiled once is not compiled again.
TORCHNEURON_TEST_INDUCTOR_CACHE_DIR="$(mktemp -d -t torchneuron-test-inductor-XXXXXX)"
export TORCHNEURON_TEST_INDUCTOR_CACHE_DIR
trap 'rm -rf "$TORCHNEURON_TEST_INDUCTOR_CACHE_DIR"' EXIT
XDIST=(-n "$WORKERS" --dist worksteal)
say "pytest (asynchronous launches, the default), $WORKERS workers"
"$PY" -m pytest tests -q "${XDIST[@]}" "$@"

# The other passes are small: each runs in one pytest process (pytest-xdist's workers would
# each collect the files again, which costs more CPU than the tests of a kernel pass), and
# $WORKERS of them run at a time, longest first. Each pass's output is printed when all are done.
PASS_DIR="$(mktemp -d -t torchneuron-test-passes-XXXXXX)"
trap 'rm -rf "$TORCHNEURON_TEST_INDUCTOR_CACHE_DIR" "$PASS_DIR"' EXIT
PASS_TITLES=()
PASS_COMMANDS=()
add_pass() { # title, then the command (environment assignments first)
  PASS_TITLES+=("$1")
  shift
  PASS_COMMANDS+=("$(printf '%q ' "$@")")
}

# The launch modes the default run exercises less: every eligible op on a stream worker,
# however small (TORCHNEURON_ASYNC_MIN_BYTES=0), and every op inline (NEURON_LAUNCH_BLOCKING=1);
# less the tests marked launch_mode_independent (configuration read at start-up).
LAUNCH_MODE_TESTS=(tests/test_ops.py tests/test_ops_views.py tests/test_ops_dtypes.py
  tests/test_ops_autograd_devices.py tests/test_ops_tracking.py tests/test_streams.py
  tests/test_memory.py tests/test_errors.py tests/test_device.py tests/test_profiler.py
  tests/test_optimizers.py tests/test_native_gemm.py tests/test_rng.py tests/test_serialization.py
  tests/test_async_launch.py tests/test_attention_backward.py tests/test_task_sharing.py
  tests/test_iterator_kernels.py tests/test_native_gather.py tests/test_native_isin.py
  tests/test_inductor_device.py tests/test_shared_flash_attention.py tests/test_host_copies.py)
for mode in TORCHNEURON_ASYNC_MIN_BYTES=0 NEURON_LAUNCH_BLOCKING=1; do
  add_pass "pytest, launch mode $mode, ${#LAUNCH_MODE_TESTS[@]} files" \
    env "$mode" "$PY" -m pytest "${LAUNCH_MODE_TESTS[@]}" -q -m "not launch_mode_independent"
done

# Our kernels pick their instructions at run time, so the default passes test only the host's
# best level. The kernel tests run again at every lower level the host can execute
# (TORCHNEURON_KERNEL_ISA caps the level): an AVX-512 host also tests AVX2 and the baseline.
# These files test every op whose kernel dispatches on the level (csrc/kernels: GEMM/GEMV, row
# kernels, decode attention; the widened bf16 attention backward), less their tests marked
# host_isa_only (the compile path and the off switch, whose kernels the eager tests reach);
# tests/cpp loops over the levels itself.
KERNEL_TESTS=(tests/test_native_gemm.py tests/test_native_rowkernels.py
  tests/test_native_sdpa_decode.py tests/test_attention_backward.py)
HOST_ISA="$("$PY" -c 'import torchneuron; print(torchneuron._C._kernel_isa()["host_isa"])')"
for level in scalar avx2 avx512 avx512_bf16 amx_bf16; do
  [ "$level" = "$HOST_ISA" ] && break
  add_pass "pytest, kernel tests at the $level level (host: $HOST_ISA), ${#KERNEL_TESTS[@]} files" \
    env TORCHNEURON_KERNEL_ISA=$level "$PY" -m pytest "${KERNEL_TESTS[@]}" -q -m "not host_isa_only"
done

say "pytest, ${#PASS_TITLES[@]} more passes, $WORKERS at a time"
running=0
for i in "${!PASS_COMMANDS[@]}"; do
  if [ "$running" -ge "$WORKERS" ]; then
    wait -n || true # each pass records its own exit status
    running=$((running - 1))
  fi
  (
    set +e
    eval "${PASS_COMMANDS[$i]}" >"$PASS_DIR/$i.log" 2>&1
    echo $? >"$PASS_DIR/$i.rc"
  ) &
  running=$((running + 1))
done
wait
failed=0
for i in "${!PASS_TITLES[@]}"; do
  say "${PASS_TITLES[$i]}"
  cat "$PASS_DIR/$i.log"
  if [ "$(cat "$PASS_DIR/$i.rc" 2>/dev/null)" != 0 ]; then
    say "failed: ${PASS_TITLES[$i]}"
    failed=1
  fi
done
exit "$failed"
