"""Compiles generated C++ (row programs, :mod:`.row_programs`) into shared libraries, cached.

The libraries are built with ``-march=native`` for the host that runs them, so the cache key
holds the compiler's version and the host CPU's model and flags besides the source. They live
in the compile cache (``TORCH_NEURONX_NEFF_CACHE_DIR``) under ``nki-cxx/``, with the cache's
trust rules: a library is code this process loads, so the directory must be owner-only.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from ..compile.cache_trust import check_entry, private_directory
from ..compile.neff_cache import cache_dir

SUBDIR = "nki-cxx"
# IEEE semantics kept (NaN and infinities flow as numpy's do), except that sums may be
# reassociated (vectorised reductions) and a*b+c may fuse: both within float32 rounding.
FLAGS = [
    "-O3",
    "-march=native",
    # GCC vectorises with 256-bit registers by default even where 512-bit ones exist; the
    # row programs are long streams of independent lanes, which the wider ones run ~25%
    # faster on AVX-512 hosts (softmax 4096x256: 0.38 -> 0.29 ms). Ignored without AVX-512.
    "-mprefer-vector-width=512",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=fast",
    "-fopenmp",
    "-shared",
    "-fPIC",
    "-std=c++17",
]


class CxxUnavailable(RuntimeError):
    """No C++ compiler, or the compile failed: the caller keeps its numpy program."""


@functools.lru_cache(maxsize=1)
def _compiler() -> tuple[str, str]:
    chosen = os.environ.get("CXX")  # as build tools do: CXX, else g++ or c++ on PATH
    cxx = shutil.which(chosen) if chosen else shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise CxxUnavailable(f"no C++ compiler ({os.environ.get('CXX') or 'g++'}) found")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return cxx, version.stdout.splitlines()[0] if version.stdout else cxx


@functools.lru_cache(maxsize=1)
def _host() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            lines = [ln for ln in info if ln.startswith(("model name", "flags"))][:2]
        return "".join(lines)
    except OSError:
        return os.uname().machine


_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


# Larger row programs are not compiled (CxxUnavailable: the numpy program runs). The code is
# straight-line, one function per run of the trace: AWS's flash-attention backward makes 23 MB
# at 4096 tokens, which g++ -O3 builds in minutes, and 167 MB (4.2 million lines) at 8192, on
# which g++ held 12 GB and had not finished after 10 minutes.
MAX_SOURCE_BYTES = 64 << 20


def load(source: str) -> ctypes.CDLL:
    """The library built from `source` (compiled once per host and compiler, then cached)."""
    if len(source) > MAX_SOURCE_BYTES:
        raise CxxUnavailable(
            f"the row program's C++ is {len(source) >> 20} MiB, more than the "
            f"{MAX_SOURCE_BYTES >> 20} MiB compiled (straight-line code of a long trace)"
        )
    cxx, version = _compiler()
    key = hashlib.sha256("\0".join([source, version, _host(), *FLAGS]).encode()).hexdigest()
    with _lock:
        lib = _loaded.get(key)
        if lib is not None:
            return lib
        directory = cache_dir() / SUBDIR
        private_directory(directory)
        path = directory / f"{key}.so"
        if not path.exists():
            _compile(cxx, source, path)
        check_entry(path, os.stat(path))
        lib = ctypes.CDLL(str(path))
        _loaded[key] = lib
        return lib


def _compile(cxx: str, source: str, path: Path) -> None:
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        src = Path(tmp) / "row_program.cpp"
        src.write_text(source)
        out = Path(tmp) / "row_program.so"
        done = subprocess.run(
            [cxx, *FLAGS, str(src), "-o", str(out)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise CxxUnavailable(f"C++ compile failed:\n{done.stderr[-2000:]}")
        os.chmod(out, 0o700)
        os.replace(out, path)  # atomic: concurrent processes see a whole library or none
