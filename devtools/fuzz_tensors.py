"""Fuzz targets for tensor factories and copies: every dtype, odd strides, odd devices.

Each case runs an operation on neuron and the same operation on the CPU; both must succeed
with bitwise-equal results (values, shape, strides, dtype), or both must raise. Views are
made with as_strided (overlapping, zero strides, offsets, out of bounds), transposes and
zero sizes; devices include out-of-range indices, and copies go both ways, between neuron
devices, with and without non_blocking, and between dtypes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st

from .fuzz_oracle import Finding, compare_with_cpu, expect_error, run

DTYPES = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
    torch.complex128, torch.complex32, torch.bool, torch.uint8, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn,
    torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu,
    torch.qint8, torch.quint8, torch.qint32, torch.bits8, torch.bits16, torch.int4,
)  # fmt: skip
# Quantized tensors are not implemented on neuron (no QuantizedPrivateUse1 kernels).
UNSUPPORTED_ON_NEURON = (torch.qint8, torch.quint8, torch.qint32)

FACTORIES = ("empty", "zeros", "ones", "full", "arange", "eye", "tensor", "empty_strided",
             "zeros_like", "full_like", "linspace")  # fmt: skip


def _shapes() -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)


def factory_cases() -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(
        st.sampled_from(FACTORIES),
        st.sampled_from(DTYPES),
        _shapes(),
        st.one_of(st.integers(-1, 2), st.floats(allow_nan=True, width=32), st.booleans()),
        st.sampled_from(["neuron", "neuron:1", "neuron:3", "neuron:4", "neuron:-1"]),
    )


def _factory(name: str, dtype: torch.dtype, shape: tuple[int, ...], fill: Any, device: str):
    if name == "empty":
        return lambda: torch.empty(shape, dtype=dtype, device=device).zero_()
    if name == "zeros":
        return lambda: torch.zeros(shape, dtype=dtype, device=device)
    if name == "ones":
        return lambda: torch.ones(shape, dtype=dtype, device=device)
    if name == "full":
        return lambda: torch.full(shape, fill, dtype=dtype, device=device)
    if name == "arange":
        return lambda: torch.arange(sum(shape), dtype=dtype, device=device)
    if name == "eye":
        return lambda: torch.eye(len(shape) + 1, sum(shape), dtype=dtype, device=device)
    if name == "tensor":
        return lambda: torch.tensor([fill] * len(shape), dtype=dtype, device=device)
    if name == "empty_strided":
        strides = tuple(range(len(shape), 0, -1))
        return lambda: torch.empty_strided(shape, strides, dtype=dtype, device=device).zero_()
    if name == "zeros_like":
        return lambda: torch.zeros_like(torch.ones(shape, device=device), dtype=dtype)
    if name == "full_like":
        return lambda: torch.full_like(torch.ones(shape, device=device), fill, dtype=dtype)
    return lambda: torch.linspace(0, fill, sum(shape), dtype=dtype, device=device)


def _valid_device(device: str) -> bool:
    try:
        index = torch.device(device).index
    except RuntimeError:  # "neuron:-1" is not a device string
        return False
    return index is None or 0 <= index < torch.neuron.device_count()


def check_factory(case: tuple[Any, ...]) -> None:
    name, dtype, shape, fill, device = case
    neuron = run(_factory(name, dtype, shape, fill, device))
    if not _valid_device(device):
        expect_error(neuron, f"{device} is not a device of this process")
        return
    cpu = run(_factory(name, dtype, shape, fill, "cpu"))
    index = torch.device(device).index
    want = torch.device("neuron", torch.neuron.current_device() if index is None else index)
    if neuron.ok and neuron.value.device != want:
        raise Finding(f"{name} on {device} returned a tensor on {neuron.value.device}")
    compare_with_cpu(neuron, cpu, unsupported_ok=dtype in UNSUPPORTED_ON_NEURON)


# --- copies and views ----------------------------------------------------------------------

COPY_DTYPES = tuple(d for d in DTYPES if d not in UNSUPPORTED_ON_NEURON)
COPIES = ("to-device", "to-cpu", "device-to-device", "copy-into-view", "convert", "clone",
          "contiguous", "view-read")  # fmt: skip


def _views() -> st.SearchStrategy[tuple[Any, ...]]:
    """(kind, size, stride, offset) of a view of a 24-element base."""
    return st.one_of(
        st.tuples(st.just("as_strided"), _shapes(),
                  st.lists(st.integers(0, 7), min_size=3, max_size=3), st.integers(0, 30)),
        st.tuples(st.sampled_from(["transpose", "slice-step", "expand", "flip", "narrow-empty",
                                   "diagonal", "unfold"]), st.just(()), st.just([]), st.just(0)),
    )  # fmt: skip


def copy_cases() -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(
        st.sampled_from(COPIES),
        st.sampled_from(COPY_DTYPES),
        st.sampled_from(COPY_DTYPES),
        _views(),
        st.booleans(),
        st.sampled_from(["neuron:0", "neuron:1", "neuron:3", "neuron:4"]),
    )


def _base(dtype: torch.dtype, device: str) -> torch.Tensor:
    values = torch.arange(24, dtype=torch.int64) % 7
    try:
        return values.to(dtype).to(device)
    except (RuntimeError, TypeError):  # dtypes without conversions (or copies): their bytes
        raw = torch.arange(24 * dtype.itemsize, dtype=torch.uint8)
        return raw.to(device).view(dtype)


def _view(base: torch.Tensor, view: tuple[Any, ...]) -> torch.Tensor:
    kind, size, stride, offset = view
    if kind == "as_strided":
        return base.as_strided(size, stride[: len(size)], offset)
    grid = base.view(4, 6)
    return {
        "transpose": lambda: grid.t(),
        "slice-step": lambda: grid[::2, 1::3],
        "expand": lambda: grid[:, :1].expand(4, 5),
        "flip": lambda: grid.flip(0),
        "narrow-empty": lambda: grid.narrow(1, 2, 0),
        "diagonal": lambda: grid.diagonal(),
        "unfold": lambda: base.unfold(0, 5, 3),
    }[kind]()


def _copy(op: str, src_dtype: torch.dtype, dst_dtype: torch.dtype, view: tuple[Any, ...],
          non_blocking: bool, device: str, on: str) -> Callable[[], Any]:  # fmt: skip
    """The operation with `on` ("neuron" or "cpu") standing for the neuron side."""
    dev = device if on == "neuron" else "cpu"
    other = ("neuron:0" if device == "neuron:1" else "neuron:1") if on == "neuron" else "cpu"

    def go() -> Any:
        if op == "to-device":  # a CPU view copied to the device
            src = _view(_base(src_dtype, "cpu"), view)
            return src.to(dev, non_blocking=non_blocking) if on == "neuron" else src.clone()
        src = _view(_base(src_dtype, dev), view)
        if on == "cpu" and op in ("to-cpu", "device-to-device"):
            # CUDA's rule: a transfer makes the tensor .clone() would (preserve_format)
            return src.clone()
        if op == "to-cpu":
            return src.to("cpu", non_blocking=non_blocking).to(dev)
        if op == "device-to-device":
            return src.to(other, non_blocking=non_blocking).to(dev)
        if op == "copy-into-view":  # into a (possibly overlapping) view of the device base
            dst = _view(_base(dst_dtype, dev), view)
            source = _base(src_dtype, "cpu")[: dst.numel()].reshape(dst.shape)
            dst.copy_(source, non_blocking=non_blocking)
            return dst
        if op == "convert":
            return src.to(dst_dtype)
        if op == "clone":
            return src.clone()
        if op == "contiguous":
            return src.contiguous()
        return src  # view-read: the view itself

    return go


def check_copy(case: tuple[Any, ...]) -> None:
    op, src_dtype, dst_dtype, view, non_blocking, device = case
    neuron = run(_copy(op, src_dtype, dst_dtype, view, non_blocking, device, "neuron"))
    if not _valid_device(device):
        expect_error(neuron, f"{device} is not a device of this process")
        return
    torch.neuron.synchronize()
    cpu = run(_copy(op, src_dtype, dst_dtype, view, non_blocking, device, "cpu"))
    compare_with_cpu(neuron, cpu)
    if neuron.ok and neuron.value.device != torch.device(device):
        raise Finding(f"{op} returned a tensor on {neuron.value.device}, expected {device}")


def tensor_targets() -> dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], None]]]:
    return {
        "tensor factories": (factory_cases(), check_factory),
        "tensor copies and views": (copy_cases(), check_copy),
    }
