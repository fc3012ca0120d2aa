"""The persistent compile cache: entry format, corruption, atomic writes, locks, processes.

Unit tests drive torchneuron.compile.neff_cache directly; the process tests compile a small MLP
(forward and backward: two graphs) with backend="neuron" in fresh interpreters sharing one
cache directory, and compare every result with CPU eager (float32, atol 1e-5, rtol 1e-4).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from torchneuron.compile.neff_cache import NeffCache, NeffCacheWarning, decode_entry, encode_entry

KEY = "ab" * 32


def test_entry_round_trip(tmp_path):
    cache = NeffCache(tmp_path)
    path = cache.put(KEY, b"payload \x00\xff bytes")
    assert path == tmp_path / "ab" / "ab" / f"{KEY}.neff"
    assert cache.get(KEY) == b"payload \x00\xff bytes"
    assert (cache.hits, cache.misses) == (1, 0)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_missing_entry_is_a_miss(tmp_path):
    cache = NeffCache(tmp_path)
    assert cache.get(KEY) is None
    assert (cache.hits, cache.misses, cache.corrupted) == (0, 1, 0)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda b: b[: len(b) // 2], "header says"),  # truncated by a crash or a full disk
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum"),  # one flipped bit
        (lambda b: b"", "header"),  # empty file
        (lambda b: b"garbage" + b, "header"),
        (lambda b: b[:30], "cut short"),  # cut inside the header
    ],
)
def test_corrupted_entry_is_reported_removed_and_missed(tmp_path, damage, reason):
    cache = NeffCache(tmp_path)
    path = cache.put(KEY, b"x" * 1000)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.warns(NeffCacheWarning, match=f"corrupted.*{reason}"):
        assert cache.get(KEY) is None
    assert not path.exists()
    assert cache.corrupted == 1
    cache.put(KEY, b"y")
    assert cache.get(KEY) == b"y"


def test_decode_rejects_wrong_length_field():
    blob = encode_entry(b"abc").replace(b"\n3\n", b"\n4\n")
    with pytest.raises(ValueError, match="header says"):
        decode_entry(blob)


def test_bad_key_is_refused(tmp_path):
    with pytest.raises(ValueError, match="hex digest"):
        NeffCache(tmp_path).path_for("../../etc/passwd")


def test_lock_excludes_and_times_out_with_a_warning(tmp_path):
    cache = NeffCache(tmp_path)
    with cache.lock(KEY, timeout=5) as held:
        assert held
        lock_file = cache.path_for(KEY).with_suffix(".lock")
        assert json.loads(lock_file.read_text())["pid"] == os.getpid()
        start = time.monotonic()
        with pytest.warns(NeffCacheWarning, match="stale"), cache.lock(KEY, timeout=0.2) as again:
            assert again is False
        assert time.monotonic() - start >= 0.2  # waited its timeout (a lower bound only)
    assert not lock_file.exists()
    assert cache.lock_timeouts == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with cache.lock(KEY, timeout=0.2) as held:  # released: taken at once
            assert held


def test_lock_timeout_setting_is_validated(monkeypatch):
    from torchneuron.compile.neff_cache import lock_timeout

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="number of seconds"):
        lock_timeout()
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", "2.5")
    assert lock_timeout() == 2.5


# --- across processes -------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, time, warnings
    import torch, torchneuron
    warnings.simplefilter("always")
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    ref = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    ref.load_state_dict(model.state_dict())
    model.to("neuron")
    x = torch.randn(8, 16)
    out = torch.compile(model, backend="neuron")(x.to("neuron"))
    out.square().sum().backward()
    expected = ref(x)
    expected.square().sum().backward()
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(model[0].weight.grad.cpu(), ref[0].weight.grad,
                               atol=1e-5, rtol=1e-4)
    cache = torchneuron.compile.backend.neff_cache()
    print(json.dumps({"hits": cache.hits, "misses": cache.misses,
                      "corrupted": cache.corrupted, "seconds": time.perf_counter() - t0}))
    """
)


def _start(cache: Path, inductor_beside: bool = False) -> subprocess.Popen[str]:
    """The child on `cache`; Inductor's kernels beside the entries (the default where the
    user chose no directory for them) or in the suite's shared directory of them."""
    env = dict(os.environ)
    env["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(cache)
    if inductor_beside:
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    return subprocess.Popen(
        [sys.executable, "-c", CHILD],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[dict[str, float], str]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


def test_second_process_reuses_entries_and_survives_corruption(tmp_path):
    cold, _ = _finish(_start(tmp_path, inductor_beside=True))
    assert (cold["hits"], cold["misses"]) == (0, 2)  # forward and backward graphs
    entries = sorted(tmp_path.glob("??/??/*.neff"))
    assert len(entries) == 2
    assert (tmp_path / "inductor").is_dir()  # Inductor's kernels live beside the entries

    warm, _ = _finish(_start(tmp_path, inductor_beside=True))
    assert (warm["hits"], warm["misses"]) == (2, 0)

    entries[0].write_bytes(entries[0].read_bytes()[:100])  # truncated
    repaired, err = _finish(_start(tmp_path, inductor_beside=True))
    assert (repaired["hits"], repaired["misses"], repaired["corrupted"]) == (1, 1, 1)
    assert "is corrupted" in err
    assert len(sorted(tmp_path.glob("??/??/*.neff"))) == 2  # rewritten whole


def test_concurrent_processes_compile_each_graph_once(tmp_path):
    procs = [_start(tmp_path), _start(tmp_path)]
    results = [_finish(p)[0] for p in procs]
    assert sum(r["misses"] for r in results) == 2
    assert sum(r["hits"] for r in results) == 2
    assert sum(r["corrupted"] for r in results) == 0
    assert not list(tmp_path.glob("??/??/*.lock"))
    assert not list(tmp_path.glob("??/??/.*.tmp"))
