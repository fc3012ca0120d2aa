"""torch.neuron: the device module of the neuron backend (the torch.cuda of Neuron)."""

from __future__ import annotations

from . import _utils
from ._device import (
    NeuronDeviceProperties,
    current_device,
    device,
    device_count,
    device_of,
    get_amp_supported_dtype,
    get_device_capability,
    get_device_name,
    get_device_properties,
    is_available,
    is_bf16_supported,
    set_device,
    synchronize,
)
from ._lazy import _is_in_bad_fork, _lazy_init, init, is_initialized
from .memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
)
from .random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
)
from .tracking import (
    clear_op_tracking,
    get_dynamo_metrics,
    get_executed_ops,
    get_fallback_ops,
    get_synchronizing_ops,
    reset_dynamo_metrics,
)


def nki_op(name: str, kernel: object = None, **options: object) -> object:
    """Registers an NKI kernel as a torch.library custom op (see torchneuron.nki.torch_op)."""
    from ..nki.torch_op import nki_op as register

    return register(name, kernel, **options)  # type: ignore[arg-type]


def wrap_nki(kernel: object, name: str | None = None, **options: object) -> object:
    """An NKI kernel as the custom op ``nki::<kernel name>`` (or `name`)."""
    from ..nki.torch_op import wrap_nki as register

    return register(kernel, name, **options)  # type: ignore[arg-type]


__all__ = [
    "nki_op",
    "wrap_nki",
    "Event",
    "NeuronDeviceProperties",
    "Stream",
    "StreamContext",
    "_is_in_bad_fork",
    "_lazy_init",
    "_utils",
    "clear_op_tracking",
    "current_device",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_dynamo_metrics",
    "get_executed_ops",
    "get_fallback_ops",
    "get_synchronizing_ops",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_dynamo_metrics",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]
