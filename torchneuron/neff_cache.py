"""The persistent cache of compiled neuron graphs (TorchNeuron's "NEFF cache").

Layout: ``$TORCH_NEURONX_NEFF_CACHE_DIR`` (default ``<system temp>/neff_cache``) holds one
file per compiled graph at ``ab/cd/<key>.neff``, where ``<key>`` is the SHA-256 of everything
the compiled code depends on. An entry is::

    TORCHNEURON-NEFF 1\\n <sha256 of payload>\\n <payload length>\\n <payload>

so a truncated or altered file is detected, reported with a warning, removed and compiled
again: never loaded. Writes go to a temporary file in the same directory, are flushed to
disk and renamed over the entry, so a reader sees a whole entry or none. Processes that
compile the same graph at once serialise on ``<key>.lock``, created with O_EXCL (which NFS
honours, unlike flock); a waiter gives up after ``TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT``
seconds (default 1200) with a warning and compiles without the lock, so a lock left by a
killed process costs time, never a hang.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

MAGIC = b"TORCHNEURON-NEFF 1\n"
DEFAULT_LOCK_TIMEOUT_S = 1200.0
_POLL_S = 0.05


class NeffCacheWarning(UserWarning):
    """A cache entry could not be used (corrupted, unreadable) or a lock wait timed out."""


def cache_dir() -> Path:
    """The cache directory: TORCH_NEURONX_NEFF_CACHE_DIR, else <system temp>/neff_cache."""
    configured = os.environ.get("TORCH_NEURONX_NEFF_CACHE_DIR")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "neff_cache"


def lock_timeout() -> float:
    raw = os.environ.get("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT")
    if raw is None:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f"TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT={raw!r} is not a number of seconds"
        ) from None
    if value < 0:
        raise ValueError(f"TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT={raw!r} must be >= 0 seconds")
    return value


def encode_entry(payload: bytes) -> bytes:
    digest = hashlib.sha256(payload).hexdigest().encode()
    return MAGIC + digest + b"\n" + str(len(payload)).encode() + b"\n" + payload


def decode_entry(blob: bytes) -> bytes:
    """The payload of an entry; ValueError saying what is wrong if it is not whole."""
    if not blob.startswith(MAGIC):
        raise ValueError("it does not start with the entry header")
    rest = blob[len(MAGIC) :]
    parts = rest.split(b"\n", 2)
    if len(parts) != 3:
        raise ValueError("its header is cut short")
    digest, length, payload = parts
    if not length.isdigit() or int(length) != len(payload):
        raise ValueError(f"it holds {len(payload)} bytes of payload, the header says {length!r}")
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        raise ValueError("its checksum does not match its contents")
    return payload


class NeffCache:
    """Compiled-graph entries keyed by content hash, safe across threads and processes."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else cache_dir()
        self._thread_lock = threading.Lock()
        self.reset_counters()

    def reset_counters(self) -> None:
        self.hits = 0
        self.misses = 0
        self.corrupted = 0
        self.lock_timeouts = 0

    def path_for(self, key: str) -> Path:
        if len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"a cache key is a lowercase hex digest, got {key!r}")
        return self.root / key[:2] / key[2:4] / f"{key}.neff"

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (missing, or corrupted and removed)."""
        path = self.path_for(key)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            self._count("misses")
            return None
        except OSError as error:
            warnings.warn(
                f"neuron compile cache: cannot read {path} ({error}); compiling again",
                NeffCacheWarning,
                stacklevel=2,
            )
            self._count("misses")
            return None
        try:
            payload = decode_entry(blob)
        except ValueError as error:
            warnings.warn(
                f"neuron compile cache: entry {path} is corrupted ({error}); removing it and "
                "compiling again",
                NeffCacheWarning,
                stacklevel=2,
            )
            with contextlib.suppress(OSError):
                path.unlink()
            self._count("corrupted")
            self._count("misses")
            return None
        self._count("hits")
        return payload

    def put(self, key: str, payload: bytes) -> Path:
        """Stores ``payload`` under ``key`` atomically (temporary file, fsync, rename)."""
        path = self.path_for(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(encode_entry(payload))
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        return path

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float | None = None) -> Iterator[bool]:
        """Holds ``<key>.lock`` while the body runs; yields False if the wait timed out."""
        timeout = lock_timeout() if timeout is None else timeout
        path = self.path_for(key).with_suffix(".lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        owner = f"{socket.gethostname()} pid {os.getpid()} thread {threading.get_ident()}\n"
        while True:
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if time.monotonic() >= deadline:
                    holder = _read_quietly(path)
                    warnings.warn(
                        f"neuron compile cache: waited {timeout:.0f} s for {path} (held by "
                        f"{holder or 'an unknown process'}); compiling without it. If no "
                        "compile is running, the lock is stale: delete the file. "
                        "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT sets the wait.",
                        NeffCacheWarning,
                        stacklevel=3,
                    )
                    self._count("lock_timeouts")
                    yield False
                    return
                time.sleep(_POLL_S)
                continue
            with os.fdopen(fd, "w") as out:
                out.write(owner)
            break
        try:
            yield True
        finally:
            with contextlib.suppress(OSError):
                path.unlink()

    def _count(self, name: str) -> None:
        with self._thread_lock:
            setattr(self, name, getattr(self, name) + 1)


def _read_quietly(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
