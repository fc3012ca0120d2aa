"""Random number generation state for torch.neuron (one default generator per device)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .. import _C
from ._device import DeviceLike, _get_device_index, device_count
from ._lazy import _lazy_call, _lazy_init


def _default_generator(index: int) -> torch.Generator:
    _lazy_init()
    return _C._default_generator(index)


def default_generators() -> tuple[torch.Generator, ...]:
    _lazy_init()
    return tuple(_default_generator(i) for i in range(device_count()))


def get_rng_state(device: DeviceLike = "neuron") -> torch.Tensor:
    """The RNG state of a device as a ByteTensor (restorable with set_rng_state)."""
    _lazy_init()
    return _default_generator(_get_device_index(device)).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state(new_state: torch.Tensor, device: DeviceLike = "neuron") -> None:
    _lazy_init()
    if not isinstance(new_state, torch.Tensor):
        raise TypeError(
            f"set_rng_state expects a torch.ByteTensor (as get_rng_state returns), got "
            f"{type(new_state).__name__}."
        )
    # No clone: set_state copies the bytes. A clone is an op, which fake tensor mode refuses
    # on the real state tensor (DTensor's sharding propagation restores RNG states under it).
    state = new_state if new_state.device.type == "cpu" else new_state.cpu()
    if not state.is_contiguous():
        state = state.contiguous()
    _default_generator(_get_device_index(device)).set_state(state)


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


def manual_seed(seed: int) -> None:
    """Seeds the current neuron device's generator."""
    seed = int(seed)

    def apply() -> None:
        _default_generator(_C._current_device()).manual_seed(seed)

    _lazy_call(apply)


def manual_seed_all(seed: int) -> None:
    """Seeds every neuron device's generator (torch.manual_seed calls this)."""
    seed = int(seed)

    def apply() -> None:
        for index in range(device_count()):
            _default_generator(index).manual_seed(seed)

    _lazy_call(apply)


def seed() -> None:
    """Seeds the current device's generator with a non-deterministic random number."""
    _lazy_init()
    _default_generator(_C._current_device()).seed()


def seed_all() -> None:
    """Seeds every device with one non-deterministic random number."""
    _lazy_init()
    value = _default_generator(0).seed()
    for index in range(1, device_count()):
        _default_generator(index).manual_seed(value)


def initial_seed() -> int:
    _lazy_init()
    return _default_generator(_C._current_device()).initial_seed()
