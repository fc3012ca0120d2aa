"""Tests that need root: they skip for an unprivileged developer and fail as root.

CI runs as root (and scripts/test.sh installs the tools these tests use), so there a check
that cannot run is a missing install step or a broken machine, not a reason to pass.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def cannot_run(reason: str) -> NoReturn:
    """Skips with `reason` when not root; fails with it as root."""
    if os.geteuid() == 0:
        pytest.fail(f"running as root, yet {reason}")
    pytest.skip(reason)
