"""The persistent cache of compiled neuron graphs (TorchNeuron's "NEFF cache").

Layout: ``$TORCH_NEURONX_NEFF_CACHE_DIR`` (default: per user, ``torchneuron/neff_cache``
under the XDG cache directory, ``~/.cache``) holds one file per compiled graph at
``ab/cd/<key>.neff``, where ``<key>`` is the SHA-256 of everything the compiled code depends
on. Entries are executed when loaded, so the cache is private: directories are created 0700
and a directory or entry another user could have written is refused (``cache_trust``). An
entry is::

    TORCHNEURON-NEFF 1\\n <sha256 of payload>\\n <payload length>\\n <payload>

so a truncated or altered file is detected, reported with a warning, removed and compiled
again: never loaded. Writes go to a temporary file in the same directory, are flushed to
disk and renamed over the entry, so a reader sees a whole entry or none. Processes that
compile the same graph at once serialise on ``<key>.lock``, created atomically (hard link,
which NFS honours, unlike flock; ``cache_lock``). A lock whose owner was a process of this
host that has since died is taken over at once; any other waits end after
``TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT`` seconds (default 1200) with a warning, and the
waiter compiles without the lock: a lock left behind costs time, never a hang.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from . import cache_lock
from .cache_trust import (
    NeffCacheSecurityError,
    check_directory,
    check_entry,
    make_private_dirs,
    private_directory,
)

__all__ = ["NeffCache", "NeffCacheSecurityError", "NeffCacheWarning", "cache_dir"]

MAGIC = b"TORCHNEURON-NEFF 1\n"
INDUCTOR_SUBDIR = "inductor"  # Inductor's compiled kernel libraries (compile.py puts them here)
DEFAULT_LOCK_TIMEOUT_S = 1200.0
_POLL_S = 0.05


class NeffCacheWarning(UserWarning):
    """A cache entry could not be used (corrupted, unreadable) or a lock wait timed out."""


def cache_dir() -> Path:
    """TORCH_NEURONX_NEFF_CACHE_DIR, else this user's: <XDG cache dir>/torchneuron/neff_cache.

    Why in the user's cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``) rather than
    the system temp directory: nobody else can create it first (in /tmp anyone can create
    a predictable name, and then either own what we execute or, as refused, deny us the
    cache), and compiled graphs survive reboots, which clean /tmp. Without a home directory
    (unset, ``/``, or missing as for system users): ``<system temp>/neff_cache-<uid>``,
    checked like any other.
    """
    configured = os.environ.get("TORCH_NEURONX_NEFF_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):  # the XDG spec: relative values are invalid and ignored
        return Path(xdg) / "torchneuron" / "neff_cache"
    try:
        home = Path.home()
    except (RuntimeError, KeyError):
        home = None
    if home is None or not home.is_absolute() or str(home) == "/" or not home.is_dir():
        return Path(tempfile.gettempdir()) / f"neff_cache-{os.geteuid()}"
    return home / ".cache" / "torchneuron" / "neff_cache"


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
    if not value >= 0:  # NaN too: a NaN deadline is never reached, so a wait would not end
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
        self._root_checked = False
        self.reset_counters()

    def check_root(self) -> None:
        """Creates the cache directory owner-only if missing; refuses one others can write.

        Raises NeffCacheSecurityError (a PermissionError) saying how to fix it.
        """
        if self._root_checked:
            check_directory(self.root)  # cheap: it could have been replaced since
            return
        private_directory(self.root)
        inductor = self.root / INDUCTOR_SUBDIR
        if inductor.exists():
            check_directory(inductor)
        self._root_checked = True

    def _entry_directory(self, path: Path) -> None:
        """The entry's ab/cd directories: created owner-only, refused if others can write."""
        self.check_root()
        make_private_dirs(path.parent)
        check_directory(path.parent.parent)
        check_directory(path.parent)

    def reset_counters(self) -> None:
        self.hits = 0
        self.misses = 0
        self.corrupted = 0
        self.lock_timeouts = 0
        self.lock_takeovers = 0

    def path_for(self, key: str) -> Path:
        if len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"a cache key is a lowercase hex digest, got {key!r}")
        return self.root / key[:2] / key[2:4] / f"{key}.neff"

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (missing, or corrupted and removed)."""
        path = self.path_for(key)
        self.check_root()
        try:
            check_directory(path.parent.parent)
            check_directory(path.parent)
            with open(path, "rb") as f:
                check_entry(path, os.fstat(f.fileno()))
                blob = f.read()
        except NeffCacheSecurityError:
            raise
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
        self._entry_directory(path)
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
        """Holds ``<key>.lock`` while the body runs; yields False if the wait timed out.

        A lock left by a dead process of this host is taken over at once (``cache_lock``).
        """
        timeout = lock_timeout() if timeout is None else timeout
        path = self.path_for(key).with_suffix(".lock")
        self._entry_directory(path)
        deadline = time.monotonic() + timeout
        mine = json.dumps(cache_lock.owner_record()).encode()
        while not cache_lock.try_create(path, mine):
            held = cache_lock.read(path)
            if held is None:
                continue  # released between our attempt and the read: try again at once
            content, written = held
            owner = cache_lock.parse(content)
            dead = cache_lock.dead_owner(owner, written)
            if dead is not None and cache_lock.remove_dead(path, content):
                warnings.warn(
                    f"neuron compile cache: took over {path} from "
                    f"{cache_lock.describe(owner)}: {dead}",
                    NeffCacheWarning,
                    stacklevel=3,
                )
                self._count("lock_takeovers")
                continue  # compete for the lock again at once
            if time.monotonic() >= deadline:
                warnings.warn(
                    f"neuron compile cache: waited {timeout:.0f} s for {path} (held by "
                    f"{cache_lock.describe(owner)}); compiling without it. If no compile is "
                    "running, the lock is stale: delete the file. "
                    "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT sets the wait.",
                    NeffCacheWarning,
                    stacklevel=3,
                )
                self._count("lock_timeouts")
                yield False
                return
            time.sleep(_POLL_S)
        try:
            yield True
        finally:
            cache_lock.release(path, mine)

    def _count(self, name: str) -> None:
        with self._thread_lock:
            setattr(self, name, getattr(self, name) + 1)
