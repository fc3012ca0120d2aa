"""Static shapes for dynamic sequence lengths: pad to the next bucket, mask, slice back.

TorchNeuron compiles each input signature once and refuses Dynamo's dynamic shapes. A model
called with many sequence lengths therefore compiles once per length; wrapped with
``pad_to_buckets`` it compiles once per bucket instead. Padding goes at the end of ``dim``
(right padding), the attention mask marks the pads (created when the caller gave none and the
model takes one), labels are padded with -100 (ignored by the loss), and every output whose
``dim`` has the bucket's size is sliced back to the caller's length. That equals the unpadded
result for causal models and position-wise modules; a module that mixes positions without
honouring a mask (a mean over the sequence) would see the pads.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

_MASK = "attention_mask"
_LABELS = "labels"
_IGNORE_INDEX = -100


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``length``."""
    for bucket in sorted(buckets):
        if length <= bucket:
            return bucket
    raise ValueError(
        f"sequence length {length} is longer than the largest bucket {max(buckets)}; add a "
        "larger bucket or truncate the input"
    )


class BucketPadded(torch.nn.Module):
    """Calls ``module`` with ``dim`` padded to the next bucket; outputs sliced back."""

    def __init__(
        self,
        module: torch.nn.Module,
        buckets: Sequence[int],
        dim: int = 1,
        pad_value: float = 0,
        compile: bool = False,
    ) -> None:
        super().__init__()
        if not buckets or any(int(b) < 1 for b in buckets):
            raise ValueError(f"buckets must be positive sizes, got {tuple(buckets)!r}")
        self.module = module
        self.buckets = tuple(sorted(int(b) for b in buckets))
        self.dim = dim
        self.pad_value = pad_value
        self.compiled = (
            torch.compile(module, backend="neuron", fullgraph=True) if compile else module
        )
        try:
            self._takes_mask = _MASK in inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            self._takes_mask = False

    def _length(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        first = kwargs.get("input_ids")
        if first is None:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is None:
            first = next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
        if first is None or first.dim() <= self.dim:
            raise ValueError(
                f"pad_to_buckets: no tensor input with a dimension {self.dim} to bucket"
            )
        return int(first.shape[self.dim])

    def _pad(self, value: Any, length: int, bucket: int, fill: float) -> Any:
        if not isinstance(value, torch.Tensor) or value.dim() <= self.dim:
            return value
        if value.shape[self.dim] != length:
            return value
        if bucket == length:
            # A copy all the same: inputs that alias each other (labels=input_ids) would give
            # Dynamo another guard than the padded, distinct tensors of the other calls.
            return value.clone()
        dim = self.dim % value.dim()
        pads = [0, 0] * (value.dim() - dim - 1) + [0, bucket - length]
        return F.pad(value, pads, value=fill)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        length = self._length(args, kwargs)
        bucket = bucket_for(length, self.buckets)
        if self._takes_mask and kwargs.get(_MASK) is None and "input_ids" in kwargs:
            ids = kwargs["input_ids"]
            kwargs[_MASK] = torch.ones(
                ids.shape[: self.dim + 1], dtype=torch.long, device=ids.device
            )
        padded_args = tuple(self._pad(a, length, bucket, self.pad_value) for a in args)
        padded_kwargs = {
            k: self._pad(
                v,
                length,
                bucket,
                _IGNORE_INDEX if k == _LABELS else (0 if k == _MASK else self.pad_value),
            )
            for k, v in kwargs.items()
        }
        out = self.compiled(*padded_args, **padded_kwargs)
        return self._slice(out, length, bucket)

    def _slice(self, out: Any, length: int, bucket: int) -> Any:
        def cut(value: Any) -> Any:
            if (
                isinstance(value, torch.Tensor)
                and value.dim() > self.dim
                and value.shape[self.dim] == bucket
                and bucket != length
            ):
                return value.narrow(self.dim, 0, length)
            return value

        if hasattr(out, "keys") and hasattr(out, "__setitem__"):  # a Transformers ModelOutput
            for key in list(out.keys()):
                if isinstance(out[key], torch.Tensor):
                    out[key] = cut(out[key])
            return out
        return tree_map(cut, out)


def pad_to_buckets(
    module: torch.nn.Module,
    buckets: Sequence[int] = (128, 256, 512),
    dim: int = 1,
    pad_value: float = 0,
    compile: bool = False,
) -> BucketPadded:
    """Wraps ``module`` so each call pads ``dim`` up to the next of ``buckets``.

    With ``compile=True`` the module is compiled with the neuron backend: one graph per
    bucket used (per other input signature), whatever the lengths the caller passes.
    """
    return BucketPadded(module, buckets, dim, pad_value, compile)


__all__ = ["BucketPadded", "bucket_for", "pad_to_buckets"]
