"""The compile cache refuses what another user could have written, as ssh does for its keys.

Entries are executed when loaded, so a cache directory, subdirectory, entry or lock that
is owned by another user or writable by group/others is refused with an error saying how to
fix it, and the cache creates its directories owner-only (0700). Another owner is simulated
with chown to uid 65534 (the tests run as root in CI; they are skipped otherwise). The
default directory is per user.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

import torchneuron.compile.backend as neuron_compile
from torchneuron.compile.neff_cache import NeffCache, NeffCacheSecurityError, cache_dir

KEY = "cd" * 32
OTHER_UID = 65534  # "nobody"
as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="simulating another owner needs chown, i.e. root"
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_default_is_the_users_cache_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_NEURONX_NEFF_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "torchneuron" / "neff_cache"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # invalid per the XDG spec
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "torchneuron" / "neff_cache"
    monkeypatch.setenv("HOME", str(tmp_path / "missing"))
    assert cache_dir() == Path(tempfile.gettempdir()) / f"neff_cache-{os.geteuid()}"


def test_default_directory_is_created_owner_only_even_with_umask_0(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_NEURONX_NEFF_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    old = os.umask(0)
    try:
        cache = NeffCache()
        cache.check_root()
        entry = cache.put(KEY, b"payload")
        with cache.lock(KEY) as held:
            assert held
            assert _mode(entry.with_suffix(".lock")) == 0o600
    finally:
        os.umask(old)
    for directory in (
        tmp_path / "xdg",
        tmp_path / "xdg" / "torchneuron",
        cache.root,
        entry.parent.parent,
        entry.parent,
    ):
        assert _mode(directory) == 0o700, directory
    assert _mode(entry) == 0o600
    assert cache.get(KEY) == b"payload"


def test_default_differs_per_user(monkeypatch, tmp_path):
    """Users without a home directory (system users) get <temp>/neff_cache-<uid> each."""
    monkeypatch.delenv("TORCH_NEURONX_NEFF_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "missing"))
    defaults = set()
    for uid in (0, 1000, OTHER_UID):
        monkeypatch.setattr(os, "geteuid", lambda uid=uid: uid)
        defaults.add(cache_dir())
    temp = Path(tempfile.gettempdir())
    assert defaults == {temp / f"neff_cache-{uid}" for uid in (0, 1000, OTHER_UID)}


@pytest.mark.parametrize(
    ("mode", "who"), [(0o777, "its group and other users"), (0o770, "its group")]
)
def test_writable_cache_directory_is_refused(tmp_path, mode, who):
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, mode)
    with pytest.raises(NeffCacheSecurityError, match=f"writable by {who}") as error:
        NeffCache(root).check_root()
    message = str(error.value)
    assert str(root) in message and f"chmod go-w {root}" in message
    assert "TORCH_NEURONX_NEFF_CACHE_DIR" in message
    os.chmod(root, 0o755)  # the fix the message gives
    NeffCache(root).check_root()


@as_root
def test_cache_directory_of_another_owner_is_refused(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    os.chown(root, OTHER_UID, OTHER_UID)
    with pytest.raises(NeffCacheSecurityError, match=f"owned by uid {OTHER_UID}"):
        NeffCache(root).check_root()


@as_root
@pytest.mark.parametrize("damage", ["owner", "mode"])
def test_entry_another_user_could_write_is_refused_not_loaded(tmp_path, damage):
    cache = NeffCache(tmp_path / "cache")
    entry = cache.put(KEY, b"print('would run')")
    if damage == "owner":
        os.chown(entry, OTHER_UID, OTHER_UID)
    else:
        os.chmod(entry, 0o666)
    with pytest.raises(NeffCacheSecurityError, match=f"refusing entry {entry}.*rm {entry}"):
        cache.get(KEY)
    assert cache.hits == 0


def test_entry_directory_others_can_write_is_refused(tmp_path):
    cache = NeffCache(tmp_path / "cache")
    entry = cache.put(KEY, b"x")
    os.chmod(entry.parent, 0o777)
    with pytest.raises(NeffCacheSecurityError, match="writable by"):
        cache.get(KEY)
    with pytest.raises(NeffCacheSecurityError, match="writable by"):
        cache.put(KEY, b"y")


@as_root
def test_lock_of_another_owner_is_refused(tmp_path):
    cache = NeffCache(tmp_path / "cache")
    lock = cache.put(KEY, b"x").with_suffix(".lock")
    lock.write_text("{}")
    os.chown(lock, OTHER_UID, OTHER_UID)
    with pytest.raises(NeffCacheSecurityError, match="owned by uid"), cache.lock(KEY, timeout=1):
        pass


def test_enclosing_directory_others_can_write_is_refused_unless_sticky(tmp_path):
    parent = tmp_path / "shared"
    parent.mkdir()
    os.chmod(parent, 0o777)  # anyone could rename our cache away and put theirs in its place
    with pytest.raises(NeffCacheSecurityError, match=f"refusing {parent}: it encloses"):
        NeffCache(parent / "cache").check_root()
    os.chmod(parent, 0o1777)  # sticky, as /tmp: others cannot rename what we own
    NeffCache(parent / "cache").check_root()


def test_compile_refuses_an_unsafe_cache_before_compiling(monkeypatch, tmp_path):
    root = tmp_path / "open"
    root.mkdir()
    os.chmod(root, 0o777)
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(root))
    with pytest.raises(NeffCacheSecurityError, match="writable by .*other users"):
        neuron_compile.neff_cache()
    assert not (root / "inductor").exists()
