"""The compile cache's per-graph lock file, taken over at once when its owner is dead.

A process compiling a graph holds ``<key>.lock``. It is created whole (written to a private
temporary file, then hard-linked to its name: link fails if the name exists, atomically,
NFS included), and records who holds it: host, boot id, PID namespace, pid, the process's
start time (``/proc/<pid>/stat``, so a reused pid is not mistaken for the owner), thread,
and a random nonce that makes each lock's contents unique.

A waiter that finds the lock held by a process of this host and PID namespace that no
longer runs (killed by the OOM killer, Ctrl-C, preemption), or left on this host before
its last boot, removes it and competes for the lock again at once, instead of waiting out
the timeout. Two waiters may judge the same dead lock at once; removal is serialised by a
marker file named after that lock's contents, created with O_EXCL: the waiter that creates
it re-reads the lock, removes it only if its contents are still the dead owner's, then
removes the marker. While the dead lock exists nobody can create another, and only a
marker holder removes it, so a fresh lock is never removed by a late waiter. Locks of
other hosts, or of processes we cannot see, are respected until the timeout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

from .cache_trust import check_entry


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def process_start(pid: int) -> int | None:
    """Start time of a running process (clock ticks since boot); None if it is gone.

    A zombie has exited (it only waits to be reaped), so it counts as gone. Without /proc,
    only existence is known: 0 for a running process.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return _exists(pid)
    fields = stat[stat.rfind(")") + 2 :].split()  # the command name may contain anything
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of proc(5); fields here start at field 3


def _exists(pid: int) -> int | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return 0


def boot_time() -> float:
    """Wall-clock time of this host's last boot (from /proc/uptime), 0 if unknown."""
    uptime = _read_text("/proc/uptime").split()
    return time.time() - float(uptime[0]) if uptime else 0.0


def owner_record() -> dict[str, object]:
    """Who takes a lock: this host, boot, PID namespace, process (with start time), thread."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "boot": _read_text("/proc/sys/kernel/random/boot_id"),
        "pidns": _pid_namespace(),
        "pid": pid,
        "start": process_start(pid),
        "thread": threading.get_ident(),
        "nonce": os.urandom(8).hex(),
    }


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def describe(record: dict[str, object] | None) -> str:
    if not record:
        return "an unknown process"
    return f"pid {record.get('pid')} on {record.get('host')} (thread {record.get('thread')})"


def dead_owner(record: dict[str, object] | None, written: float) -> str | None:
    """Why the lock's owner is certainly gone, or None if it may be alive (or is unknown).

    ``written``: the lock file's modification time.
    """
    if not record or record.get("host") != socket.gethostname():
        return None  # another host (or an unreadable record): nothing we can check
    here = owner_record()
    if record.get("boot") != here["boot"]:
        # the same host name with another boot id: this host rebooted since, or another
        # machine of the same name; only a lock written before this boot is surely dead
        return "it was left before this host's last boot" if written < boot_time() else None
    if record.get("pidns") != here["pidns"]:
        return None  # a process of another PID namespace (container): its pid means nothing here
    pid = record.get("pid")
    if not isinstance(pid, int):
        return None
    start = process_start(pid)
    if start is None:
        return f"process {pid} of this host has exited"
    recorded = record.get("start")
    if isinstance(recorded, int) and start not in (recorded, 0):
        return f"process {pid} of this host has exited (its pid now belongs to another process)"
    return None


def parse(text: bytes) -> dict[str, object] | None:
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def try_create(path: Path, content: bytes) -> bool:
    """Creates the lock whole with ``content``; False if it exists."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".new", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        try:
            os.link(temp, path)
            return True
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: O_EXCL, then write
            return _create_exclusive(path, content)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def _create_exclusive(path: Path, content: bytes) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as out:
        out.write(content)
    return True


def read(path: Path) -> tuple[bytes, float] | None:
    """(contents, modification time) of the lock, None if there is none; checks its owner."""
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            check_entry(path, info)
            return f.read(), info.st_mtime
    except FileNotFoundError:
        return None


def remove_dead(path: Path, content: bytes) -> bool:
    """Removes the lock if it still holds ``content`` (a dead owner's); True if removed."""
    marker = path.with_name(f"{path.name}.{hashlib.sha256(content).hexdigest()[:16]}.takeover")
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False  # another waiter is removing this lock right now
    os.close(fd)
    try:
        current = read(path)
        if current is None or current[0] != content:
            return False  # already removed (and perhaps taken afresh): not ours to touch
        os.unlink(path)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(marker)


def release(path: Path, content: bytes) -> None:
    """Removes the lock if it is still the one we created."""
    with contextlib.suppress(OSError):
        current = read(path)
        if current is not None and current[0] == content:
            os.unlink(path)
