"""A small stats file per process, so ``python -m torchneuron.fidelity.top`` can see other
processes.

Opt-in (``TORCHNEURON_STATS=1`` before the runtime initialises, or ``start()``): a daemon
thread rewrites ``<dir>/<pid>.json`` every ``interval`` seconds with each device's allocated,
reserved and peak bytes and the number of ops run so far. Cheap: one small file rewrite
(temp + rename, so readers never see half a file) per interval. The directory is
``$XDG_RUNTIME_DIR/torchneuron`` or ``/dev/shm/torchneuron-<uid>``, private to the user.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

_thread: threading.Thread | None = None
_stop = threading.Event()


def stats_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "torchneuron" if base else Path(f"/dev/shm/torchneuron-{os.getuid()}")
    return path


def snapshot() -> dict[str, Any]:
    """This process's device state now."""
    import torch

    from .. import _C

    devices = []
    for index in range(int(_C._device_count())):
        stats = torch.accelerator.memory_stats(index)
        props = _C._get_device_properties(index)
        devices.append(
            {
                "index": index,
                "name": props["name"],
                "capacity": int(props["total_memory"]),
                "allocated": int(stats.get("allocated_bytes.all.current", 0)),
                "reserved": int(stats.get("reserved_bytes.all.current", 0)),
                "peak": int(stats.get("allocated_bytes.all.peak", 0)),
            }
        )
    ops = sum(int(n) for n in dict(_C._executed_ops()).values())
    return {
        "pid": os.getpid(),
        "command": " ".join(sys.argv)[:200],
        "time": time.time(),
        "ops": ops,
        "devices": devices,
    }


def write_once(directory: Path | None = None) -> Path:
    directory = directory or stats_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = directory / f"{os.getpid()}.json"
    temp = directory / f".{os.getpid()}.json.tmp"
    temp.write_text(json.dumps(snapshot()))
    os.replace(temp, target)
    return target


def _run(interval: float) -> None:
    while not _stop.wait(interval):
        try:
            write_once()
        except Exception:  # a monitor must never break the process it watches; a failed
            continue  # write (a full disk, a removed directory) is retried at the next interval


def _remove_own_file() -> None:
    try:
        (stats_dir() / f"{os.getpid()}.json").unlink()
    except OSError:
        pass


def start(interval: float = 0.5) -> None:
    """Starts publishing this process's stats (idempotent)."""
    import atexit

    global _thread
    if _thread is not None and _thread.is_alive():
        return
    _stop.clear()
    write_once()
    _thread = threading.Thread(target=_run, args=(interval,), name="torchneuron-stats", daemon=True)
    _thread.start()
    atexit.register(stop)


def stop() -> None:
    _stop.set()
    _remove_own_file()


def maybe_start_from_environment() -> None:
    if os.environ.get("TORCHNEURON_STATS", "0") not in ("", "0"):
        start(float(os.environ.get("TORCHNEURON_STATS_INTERVAL", "0.5")))
