"""The checkout the developer tools run from.

devtools is not installed, so a child interpreter started with ``-m devtools.<name>`` finds it
only when this checkout is on its path, whatever its working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment plus `extra`, with the checkout first on PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)
