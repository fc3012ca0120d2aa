"""``nki.typing``: annotation helpers public kernels import (``tensor[128, 512]``)."""

from __future__ import annotations

from typing import Any


class _TensorAnnotation:
    def __getitem__(self, shape: Any) -> Any:
        return Any


tensor = _TensorAnnotation()
