"""Compile-cache locks left by dead processes are taken over at once; live ones are respected.

A process killed while compiling (SIGKILL here, as the OOM killer does) leaves its lock
file. The next process must take it over (its takeover counter says so) instead of waiting out
TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT (1200 s); a lock whose owner still runs, or that
this host cannot judge (another host, another PID namespace), is still waited for.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

from torchneuron.compile import cache_lock
from torchneuron.compile.neff_cache import NeffCache, NeffCacheWarning

KEY = "ef" * 32
LONG_TIMEOUT_S = 30.0  # what a stale lock would cost if it were not taken over

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from torchneuron.compile.neff_cache import NeffCache
    with NeffCache(Path(sys.argv[1])).lock(sys.argv[2]) as held:
        print("held" if held else "not held", flush=True)
        time.sleep(600)
    """
)


def _lock_path(cache: NeffCache):  # noqa: ANN202 - a Path
    return cache.path_for(KEY).with_suffix(".lock")


def _write_lock(cache: NeffCache, **changes: object) -> None:
    """A lock file as another process would leave it: this process's record, changed."""
    record = cache_lock.owner_record()
    record.update(changes)
    path = _lock_path(cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def _timed_lock(cache: NeffCache, timeout: float) -> tuple[bool, float, list[str]]:
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cache.lock(KEY, timeout=timeout) as held:
            elapsed = time.monotonic() - start
    return held, elapsed, [str(w.message) for w in caught if w.category is NeffCacheWarning]


def test_lock_of_a_killed_process_is_taken_over_at_once(tmp_path):
    cache = NeffCache(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), KEY],
        env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        # alive: respected for the whole (short) timeout
        held, elapsed, messages = _timed_lock(cache, timeout=0.5)
        assert held is False and elapsed >= 0.5
        assert any(f"pid {holder.pid}" in m and "waited" in m for m in messages), messages
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert _lock_path(cache).exists()  # what a killed compile leaves behind
    held, _, messages = _timed_lock(cache, timeout=LONG_TIMEOUT_S)
    assert held is True  # the dead holder never releases: held means taken over
    assert any("took over" in m and f"process {holder.pid}" in m for m in messages), messages
    assert cache.lock_takeovers == 1 and cache.lock_timeouts == 1
    assert not _lock_path(cache).exists()  # released after the body


def test_reused_pid_is_not_mistaken_for_the_owner(tmp_path):
    cache = NeffCache(tmp_path)
    # our own pid, alive, but a process started at another time once held the lock
    _write_lock(cache, start=cache_lock.process_start(os.getpid()) - 1)
    held, _, messages = _timed_lock(cache, timeout=LONG_TIMEOUT_S)
    assert held is True and cache.lock_takeovers == 1 and cache.lock_timeouts == 0
    assert any("pid now belongs to another process" in m for m in messages), messages


def test_lock_left_before_the_last_boot_is_taken_over(tmp_path):
    cache = NeffCache(tmp_path)
    _write_lock(cache, boot="another-boot")
    path = _lock_path(cache)
    before_boot = cache_lock.boot_time() - 60
    os.utime(path, (before_boot, before_boot))
    held, _, _ = _timed_lock(cache, timeout=LONG_TIMEOUT_S)
    assert held is True and cache.lock_takeovers == 1 and cache.lock_timeouts == 0


@pytest.mark.parametrize(
    "changes",
    [
        {},  # this very process (another thread's compile): alive
        {"host": "another-host"},  # cannot be checked from here
        {"pidns": "pid:[1]"},  # another container's pid
        {"boot": "another-boot"},  # same name, another boot, written after ours: unknown
    ],
    ids=["alive", "other-host", "other-pid-namespace", "other-boot-recent"],
)
def test_locks_that_may_be_alive_are_respected(tmp_path, changes):
    cache = NeffCache(tmp_path)
    _write_lock(cache, **changes)
    held, elapsed, messages = _timed_lock(cache, timeout=0.3)
    assert held is False and elapsed >= 0.3
    assert any("waited" in m for m in messages)
    assert _lock_path(cache).exists()


def test_a_fresh_lock_is_never_removed_by_a_late_waiter(tmp_path):
    cache = NeffCache(tmp_path)
    path = _lock_path(cache)
    _write_lock(cache, pid=2**22 + 1)  # above pid_max: no such process
    dead = path.read_bytes()
    assert cache_lock.remove_dead(path, dead)  # the first waiter removes it
    fresh = b'{"pid": 1, "nonce": "fresh"}'
    assert cache_lock.try_create(path, fresh)  # and someone takes the lock afresh
    assert not cache_lock.remove_dead(path, dead)  # a waiter that judged the old one: no-op
    assert path.read_bytes() == fresh
    assert not list(path.parent.glob("*.takeover"))


def test_many_waiters_on_a_dead_lock_hold_it_one_at_a_time(tmp_path):
    cache = NeffCache(tmp_path)
    _write_lock(cache, pid=2**22 + 1)
    inside, overlaps, results = [0], [], []
    guard = threading.Lock()

    def worker() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with cache.lock(KEY, timeout=LONG_TIMEOUT_S) as held:
                with guard:
                    inside[0] += 1
                    overlaps.append(inside[0])
                time.sleep(0.01)
                with guard:
                    inside[0] -= 1
                results.append(held)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == [True] * 8
    assert max(overlaps) == 1
    assert cache.lock_takeovers == 1
    assert not _lock_path(cache).exists()
