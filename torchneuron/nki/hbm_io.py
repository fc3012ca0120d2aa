"""Kernel arguments and results: numpy arrays, CPU tensors and ``neuron`` tensors as HBM.

numpy arrays and CPU tensors are used in place. A ``neuron`` tensor's memory is host memory
(the software NeuronCore's HBM is host-addressable), so the kernel reads and writes it
through a numpy view of the very same bytes, with the tensor's strides (non-contiguous
views work). Results of a launch with ``neuron`` inputs are allocated on that device.
bfloat16 has no numpy type: such tensors go in as float32 copies (bfloat16 values, exact)
and are written back / converted on the way out. The interpreter runs on same-layout copies
(``Shadows``), so a kernel refused part way leaves its arguments untouched.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import dtypes
from .errors import NkiError


@dataclass(eq=False)
class HbmArg:
    """One tensor argument: the array the kernel sees and how to hand changes back."""

    array: np.ndarray
    dtype: Any  # NKI dtype
    source: Any  # the user's object
    write_back: bool  # True when `array` is a copy (bfloat16) to copy back after the run


def _torch() -> Any:
    import torch

    return torch


def is_tensor(value: Any) -> bool:
    torch = _torch()
    return isinstance(value, torch.Tensor)


def _device_alias(tensor: Any) -> np.ndarray:
    """A numpy view of a neuron tensor's bytes (same memory, same strides)."""
    np_dtype = np.dtype(_torch().empty((), dtype=tensor.dtype).numpy().dtype)
    if tensor.numel() == 0:
        return np.empty(tuple(tensor.shape), np_dtype)
    storage = tensor.untyped_storage()
    nbytes = storage.nbytes()
    raw = (ctypes.c_byte * nbytes).from_address(storage.data_ptr())
    flat = np.frombuffer(raw, dtype=np.uint8).view(np_dtype)
    itemsize = np_dtype.itemsize
    return np.lib.stride_tricks.as_strided(
        flat[tensor.storage_offset() :],
        shape=tuple(tensor.shape),
        strides=tuple(s * itemsize for s in tensor.stride()),
    )


def to_hbm(value: Any) -> HbmArg | None:
    """The HBM view of a tensor argument, or None for a non-tensor argument."""
    if isinstance(value, np.ndarray):
        dtype = dtypes.canonical(value.dtype)
        if dtypes.needs_rounding(dtype):  # ml_dtypes' bfloat16: run on a float32 copy
            return HbmArg(value.astype(np.float32), dtype, value, True)
        return HbmArg(value, dtype, value, False)
    if not is_tensor(value):
        return None
    torch = _torch()
    tensor = value.detach()
    if tensor.dtype == torch.bfloat16:
        copy = tensor.to("cpu", torch.float32).numpy()
        return HbmArg(copy, dtypes.bfloat16, value, True)
    if tensor.device.type == "neuron":
        torch.neuron.synchronize(tensor.device)
        return HbmArg(_device_alias(tensor), dtypes.canonical(_np_dtype(tensor)), value, False)
    if tensor.device.type != "cpu":
        raise NkiError(f"NKI kernels take numpy arrays, CPU or neuron tensors, not {tensor.device}")
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    return HbmArg(tensor.numpy(), dtypes.canonical(tensor.numpy().dtype), value, False)


def _np_dtype(tensor: Any) -> np.dtype:
    return np.dtype(_torch().empty((), dtype=tensor.dtype).numpy().dtype)


def write_back(args: list[HbmArg]) -> None:
    for arg in args:
        if not arg.write_back:
            continue
        if isinstance(arg.source, np.ndarray):
            arg.source[...] = arg.array.astype(arg.source.dtype)
            continue
        with _torch().no_grad():
            arg.source.copy_(_torch().from_numpy(arg.array))


class Shadows:
    """Copies of a launch's HBM arguments, same layout, that the interpreter runs on: a kernel
    refused part way (a rule it breaks at an instruction, SBUF/PSUM capacity counted once it
    has run) leaves the caller's arrays and tensors as they were. What the kernel wrote is
    copied back once it has run to its end. Arguments that share memory keep it (each sees
    the other's writes), and run in place."""

    def __init__(self, args: list[HbmArg]) -> None:
        self.args = args
        self.originals: dict[int, np.ndarray] = {}
        arrays = [a.array for a in args]
        if any(np.may_share_memory(x, y) for n, x in enumerate(arrays) for y in arrays[n + 1 :]):
            return
        for n, arg in enumerate(args):
            if arg.write_back:
                continue  # already a copy (bfloat16), written back after a completed run
            copy = _same_layout_copy(arg.array)
            if copy is not None:
                self.originals[n] = arg.array
                arg.array = copy

    def commit(self, written: set[int]) -> None:
        """The run completed: the arguments it wrote get their new contents."""
        for n, original in self.originals.items():
            if n in written:
                np.copyto(original, self.args[n].array)
        self.discard()

    def discard(self) -> None:
        for n, original in self.originals.items():
            self.args[n].array = original
        self.originals = {}


def _same_layout_copy(array: np.ndarray) -> np.ndarray | None:
    """A copy with `array`'s strides (compiled programs address HBM by them), or None when
    there is nothing to copy or the layout cannot be reproduced (negative strides)."""
    itemsize = array.itemsize
    if array.size == 0 or any(s < 0 or s % itemsize for s in array.strides):
        return None
    span = 1 + sum((d - 1) * s // itemsize for d, s in zip(array.shape, array.strides, strict=True))
    copy = np.lib.stride_tricks.as_strided(
        np.empty(span, array.dtype), shape=array.shape, strides=array.strides
    )
    np.copyto(copy, array)
    return copy


def torch_dtype(dtype: Any) -> Any:
    torch = _torch()
    if dtype is dtypes.bfloat16:
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtypes.storage(dtype))).dtype


class Allocator:
    """Allocates a launch's HBM outputs where its inputs live (numpy or a neuron device)."""

    def __init__(self, device: Any) -> None:
        self.device = device  # None (numpy) or a torch.device
        self.tensors: dict[int, Any] = {}  # id(array) -> tensor owning it

    def __call__(self, shape: tuple[int, ...], dtype: Any, fill: Any = 0) -> np.ndarray:
        """A new tensor filled with `fill`, or left uninitialised for None."""
        if self.device is None or dtypes.needs_rounding(dtype):
            if fill is None:
                return np.empty(shape, dtypes.storage(dtype))
            return np.full(shape, fill, dtypes.storage(dtype))
        torch = _torch()
        if fill is None:
            tensor = torch.empty(shape, dtype=torch_dtype(dtype), device=self.device)
        else:
            tensor = torch.full(shape, fill, dtype=torch_dtype(dtype), device=self.device)
        if self.device.type == "neuron":
            # the fill may be launched on the stream: the kernel writes the bytes from this
            # thread, so the fill must be done first (else it lands over the kernel's stores).
            torch.neuron.synchronize(self.device)
            array = _device_alias(tensor)
        else:
            array = tensor.numpy()
        self.tensors[id(array)] = tensor
        return array

    def result(self, array: np.ndarray, dtype: Any) -> Any:
        """What the caller gets for an output array."""
        if self.device is None:
            # numpy callers get bfloat16 results as ml_dtypes arrays, as they passed them
            return array.astype(dtypes.host(dtype)) if dtypes.needs_rounding(dtype) else array
        tensor = self.tensors.get(id(array))
        if tensor is not None:
            return tensor
        torch = _torch()
        out = torch.from_numpy(np.ascontiguousarray(array)).to(torch_dtype(dtype))
        return out.to(self.device)


def launch_device(values: list[Any]) -> Any:
    """The device results go to: a neuron tensor's device, else CPU for tensors, else None."""
    device = None
    for value in values:
        if not isinstance(value, np.ndarray) and is_tensor(value):
            if value.device.type == "neuron":
                if device is not None and device.type == "neuron" and device != value.device:
                    raise NkiError(
                        f"kernel arguments on different devices: {device} and {value.device}"
                    )
                device = value.device
            elif device is None:
                device = value.device
    return device
