"""Device selection and properties for torch.neuron."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from .. import _C
from ._lazy import _lazy_init

DeviceLike = torch.device | str | int | None


def _get_device_index(device: DeviceLike, optional: bool = False) -> int:
    """The index of a neuron device given as int, str or torch.device (None, "neuron" and -1:
    the current device), checked against the devices this process sees (IndexError)."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"Expected a neuron device, but got {device}.")
        if device.index is None:
            return current_device()
        return _checked(device.index)
    if device is None:
        return current_device()
    if isinstance(device, int) and not isinstance(device, bool):
        # Checked at full width: a narrowing cast would turn 1000 into device -24.
        return _checked(device)
    raise TypeError(f"Expected a torch.device, str or int for a neuron device, got {device!r}.")


def _checked(index: int) -> int:
    _lazy_init()
    if not -(2**63) <= index < 2**63:  # beyond the binding's int64
        count = device_count()
        raise IndexError(
            f"neuron:{index} is not a valid device: this process sees {count} neuron "
            f"device(s), so use an index from 0 to {count - 1}."
        )
    return _C._checked_device_index(index)


def device_count() -> int:
    """Number of neuron devices (logical NeuronCores) visible to this process."""
    return _C._device_count()


def is_available() -> bool:
    """True when the runtime is configured and at least one neuron device is visible."""
    try:
        return device_count() > 0
    except RuntimeError as error:  # an invalid NEURON_* configuration
        warnings.warn(f"neuron is not available: {error}", stacklevel=2)
        return False


def current_device() -> int:
    _lazy_init()
    return _C._current_device()


def set_device(device: DeviceLike) -> None:
    """Selects the current neuron device of this thread (int, 'neuron:N' or torch.device)."""
    _lazy_init()
    _C._set_device(_get_device_index(device))


class device:  # noqa: N801  (mirrors torch.cuda.device)
    """Context manager that changes the current neuron device."""

    def __init__(self, device: DeviceLike) -> None:
        self.index = -1 if device is None else _get_device_index(device)
        self.previous = -1

    def __enter__(self) -> None:
        _lazy_init()
        self.previous = _C._exchange_device(self.index)

    def __exit__(self, *args: object) -> None:
        _C._exchange_device(self.previous)


class device_of(device):  # noqa: N801
    """Context manager that makes the device of a tensor current (no-op for CPU tensors)."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.device.index if obj.device.type == "neuron" else None)


@dataclass(frozen=True)
class NeuronDeviceProperties:
    name: str
    total_memory: int
    chip: str
    logical_nc_config: int
    physical_core_first: int
    chip_index: int
    hbm_bytes: int
    hbm_bandwidth_bytes_per_s: float
    peak_bf16_flops: float
    peak_fp32_flops: float

    @property
    def type(self) -> str:
        return "neuron"


def get_device_properties(device: DeviceLike = None) -> NeuronDeviceProperties:
    _lazy_init()
    props: dict[str, Any] = _C._get_device_properties(_get_device_index(device))
    return NeuronDeviceProperties(**props)


def get_device_name(device: DeviceLike = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: DeviceLike = None) -> dict[str, Any]:
    """The device's capabilities (supported dtypes), as torch.accelerator reports them."""
    _lazy_init()
    return torch.accelerator.get_device_capability(
        torch.device("neuron", _get_device_index(device))
    )


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Dtypes torch.autocast('neuron', dtype=...) accepts."""
    return [torch.bfloat16, torch.float16]


def synchronize(device: DeviceLike = None) -> None:
    """Waits for all work on the device's streams to complete."""
    _lazy_init()
    _C._synchronize(_get_device_index(device))
