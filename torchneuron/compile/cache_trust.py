"""Who may have written the compile cache: its directories and entries are checked as ssh does.

Cache entries hold Python source that is loaded and executed, and Inductor's compiled
libraries live beside them; whoever can write there runs code in every process that uses
the cache. The entry checksum only detects corruption, not tampering, so trust comes from
ownership, following ssh's StrictModes rule for ``~/.ssh`` and its keys: the cache
directory, its subdirectories and entries must be owned by the current user (or root) and
not writable by group or others; every directory above the cache must be owned by the user
or root and not writable by others unless it is sticky (as ``/tmp`` is, where others cannot
rename what we own). Directories the cache creates are owner-only (0700).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
VARIABLE = "TORCH_NEURONX_NEFF_CACHE_DIR"


class NeffCacheSecurityError(PermissionError):
    """The compile cache (or an entry in it) could have been written by another user."""


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _why_untrusted(info: os.stat_result, ancestor: bool) -> str | None:
    """What is wrong with a file or directory's owner and mode, or None."""
    me = os.geteuid()
    if info.st_uid not in (me, 0):
        return f"it is owned by {_owner(info.st_uid)}, not by you ({_owner(me)}) or root"
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not (ancestor and info.st_mode & stat.S_ISVTX):
        who = " and ".join(
            name
            for bit, name in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "other users"))
            if info.st_mode & bit
        )
        return f"it is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def refuse(path: Path, reason: str, entry: bool = False) -> NeffCacheSecurityError:
    """The error for an untrusted cache path, saying how to fix it."""
    elsewhere = (
        f"set {VARIABLE} to a directory only you can write (it is created with mode 0700 if "
        "missing)"
    )
    if entry:
        fix = f"delete it (rm {path}) and check who else can write there"
    elif "owned by" in reason:
        fix = f"{elsewhere}; or, if {path} is meant to be yours, have root chown it to you"
    else:
        fix = f"chmod go-w {path}, or {elsewhere}"
    return NeffCacheSecurityError(
        f"neuron compile cache: refusing {'entry ' if entry else ''}{path}: {reason}. Compiled "
        f"graphs in the cache are executed, so anyone who can write there could run code in "
        f"your process. To fix: {fix}."
    )


def check_entry(path: Path, info: os.stat_result) -> None:
    """Refuses a cache file (entry, lock) that another user could have written."""
    reason = _why_untrusted(info, ancestor=False)
    if reason is not None:
        raise refuse(path, reason, entry=True)


def check_directory(path: Path) -> None:
    """Refuses a cache directory that is not a directory or another user could write."""
    info = os.stat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(
            f"neuron compile cache: {path} is not a directory; set {VARIABLE} to a directory"
        )
    reason = _why_untrusted(info, ancestor=False)
    if reason is not None:
        raise refuse(path, reason)


def check_ancestors(path: Path) -> None:
    """Refuses a cache whose enclosing directories let another user replace it."""
    for parent in Path(os.path.realpath(path)).parents:
        reason = _why_untrusted(os.stat(parent), ancestor=True)
        if reason is not None:
            raise refuse(parent, f"it encloses the cache {path} and {reason}")


def make_private_dirs(path: Path) -> None:
    """Creates ``path`` and its missing parents owner-only (0700), whatever the umask."""
    missing = []
    current = Path(os.path.abspath(path))
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIR_MODE)
        except FileExistsError:
            continue  # another process made it first: checked like any existing directory
        os.chmod(directory, PRIVATE_DIR_MODE)  # the umask may have removed owner bits


def private_directory(path: Path) -> None:
    """Makes ``path`` a cache directory if missing, then checks it (and what encloses it)."""
    make_private_dirs(path)
    check_directory(path)
    check_ancestors(path)
