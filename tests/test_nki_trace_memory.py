"""The compiled path's recording holds a tile's memory only while the kernel does.

Code generation reads a recorded scratch array's layout, never its values, so once the
kernel drops a tile its array is replaced by one of the same layout over memory that holds
no pages (interpreter._keep_layout_only), rather than every tile of the trace staying alive
until the code is built (AWS's flash-attention backward at 4096 tokens: 5.5 GB against 2.5).
The reference: numpy's allocations as tracemalloc counts them, against the tiles' sizes.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.language as nl

MIB = 2**20


@nki.jit
def _sum_of_loads(x):
    out = nl.ndarray((128, 2048), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((128, 2048), dtype=nl.float32)
    for _ in nl.sequential_range(64):
        tile = nl.load(x)  # a new 1 MiB tile each iteration, dropped at the next
        acc = nl.add(acc, tile)
    nl.store(out, value=acc)
    return out


def test_recording_a_kernel_keeps_only_live_tiles() -> None:
    x = np.arange(128 * 2048, dtype=np.float32).reshape(128, 2048) % 7
    tracemalloc.start()
    try:
        first = _sum_of_loads(x)  # traced, recorded and compiled
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # 128 tiles of 1 MiB pass through the trace (loads and sums); a few are alive at once
    assert peak < 24 * MIB, f"{peak / MIB:.1f} MiB at the peak of the recording"
    np.testing.assert_array_equal(first, 64 * x)
    np.testing.assert_array_equal(_sum_of_loads(x), 64 * x)  # the compiled program's replay
    np.testing.assert_array_equal(_sum_of_loads.interpret(x), 64 * x)


def test_a_row_program_too_large_to_compile_runs_as_numpy(monkeypatch) -> None:
    # Straight-line C++ grows with the trace; past MAX_SOURCE_BYTES it is not compiled (g++
    # held 12 GB on 167 MB of it): a warning says so and the numpy program gives the result.
    from torchneuron.nki import cxx_build

    monkeypatch.setattr(cxx_build, "MAX_SOURCE_BYTES", 1024)
    monkeypatch.setenv("TORCHNEURON_NKI_ROW_PROGRAMS", "always")

    @nki.jit
    def scaled(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.multiply(nl.exp(nl.load(x)), 2.0))
        return out

    x = np.linspace(-2, 2, 128 * 512, dtype=np.float32).reshape(128, 512)
    with pytest.warns(RuntimeWarning, match=r"row program's C\+\+ is .* more than the 0 MiB"):
        got = scaled(x)
    np.testing.assert_allclose(got, 2 * np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(scaled(x), got, rtol=0, atol=0)
