"""Passing neuron tensors between processes by reference (``torch.multiprocessing``).

Device memory is host memory in the software runtime, so sharing works the way CPU sharing
does: ``share_memory_()`` moves a storage's bytes into the runtime's shared device memory (a
size-sealed memory file, ``nrt_mem_alloc_shared``) on the same device, and pickling for
another process sends a duplicate of that file's descriptor with the storage's size and its
device's identity. The receiver maps the same pages as a neuron storage on the same core, so
writes in either process are visible in the other. A tensor that is not shared yet is moved
into shared memory when it is first sent, as CPU tensors are.

Reference counting is the kernel's: the pages live while any process holds a descriptor or
a mapping of the file, and every process holds exactly one of each per shared storage (the
storage's own), released with the storage. Each process counts a shared storage it maps
against its own device: in the runtime's capacity and host budget (so OOM stays honest),
and in ``torch.neuron.memory_allocated()``/``memory_reserved()`` as one allocation in a
segment of its own.

What cannot work fails loudly: a receiver that does not see the sender's core, one forked
after initialising the runtime, a non-leaf tensor that requires grad (as for CUDA), or a
sender that exited before the receiver took the descriptor. ``Queue.put`` pickles on a
background thread, where an exception would be printed and the item dropped, leaving the
receiver waiting forever; for neuron tensors the error is printed in the sender *and* sent
in the item's place, so the receiver's ``get()`` raises it (queues that handle such errors
themselves, like ProcessPoolExecutor's, get the exception as before).

The sharing strategy (``file_descriptor``/``file_system``) is for CPU tensors; neuron
tensors always pass descriptors, as CUDA tensors always pass IPC handles.
"""

from __future__ import annotations

import multiprocessing.queues
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from multiprocessing import reduction
from typing import Any, NoReturn

import torch
import torch.multiprocessing.reductions as torch_reductions

from .. import _C

_DEVICE_TYPE = "neuron"
_installed = False

# (sender's index, chip profile, chip index, first physical core, logical-core grouping)
DeviceIdentity = tuple[int, str, int, int, int]
Reduction = tuple[Callable[..., Any], tuple[Any, ...]]


def _device_identity(index: int) -> DeviceIdentity:
    """Which core a device index stands for, independent of the process's visible cores."""
    props = _C._get_device_properties(index)
    return (
        index,
        props["chip"],
        props["chip_index"],
        props["physical_core_first"],
        props["logical_nc_config"],
    )


def _local_device(identity: DeviceIdentity) -> int:
    """This process's index of the sender's core (the same index when both see the same)."""
    from ._lazy import _lazy_init

    _lazy_init()  # raises the forked-child or configuration error, if any
    index, chip, chip_index, first_core, lnc = identity
    count = _C._device_count()
    candidates = ([index] if index < count else []) + list(range(count))
    for local in candidates:
        if _device_identity(local)[1:] == identity[1:]:
            return local
    visible = os.environ.get("NEURON_RT_VISIBLE_CORES")
    raise RuntimeError(
        f"received a neuron tensor that lives on neuron:{index} of the sending process "
        f"({chip} chip {chip_index}, physical core {first_core}, "
        f"NEURON_LOGICAL_NC_CONFIG={lnc}), but that core is not one of the {count} neuron "
        f"device(s) this process sees (NEURON_RT_VISIBLE_CORES={visible!r}). Start the "
        "receiving process with visible cores and logical-core grouping that include it "
        "(spawned processes inherit the parent's environment)."
    )


def _cache_key(fd: int) -> tuple[str, int, int]:
    info = os.fstat(fd)
    return (_DEVICE_TYPE, info.st_ino, info.st_dev)


def _storage_handle(storage: torch.UntypedStorage) -> tuple[Any, int, DeviceIdentity]:
    """What a receiver needs to map `storage`: (descriptor or None, nbytes, device)."""
    index = storage.device.index
    identity = _device_identity(index if index is not None else _C._current_device())
    nbytes = storage.nbytes()
    if nbytes == 0:
        return (None, 0, identity)
    storage.share_memory_()  # torch's lock-protected wrapper around _share_memory_ below
    fd = _C._shared_storage_fd(storage)
    # So that a storage sent back to this process comes back as this very storage.
    torch_reductions.shared_cache[_cache_key(fd)] = torch_reductions.StorageWeakRef(storage)
    return (reduction.DupFd(fd), nbytes, identity)


def _rebuild_storage(
    descriptor: Any, nbytes: int, identity: DeviceIdentity
) -> torch.UntypedStorage:
    if descriptor is None:
        return torch.UntypedStorage(0, device=torch.device(_DEVICE_TYPE, _local_device(identity)))
    # Taken first, whatever happens next: an untaken descriptor stays open in the sender.
    try:
        fd = descriptor.detach()
    except OSError as error:
        raise RuntimeError(
            "could not receive the shared memory of a neuron tensor: the sending process "
            "exited (or closed its connection) before this process took the descriptor. "
            "Keep the sender alive until every receiver has the tensor."
        ) from error
    try:
        device = _local_device(identity)
        key = _cache_key(fd)
        cached = torch_reductions.storage_from_cache(torch.UntypedStorage, key)
        if cached is not None:
            return cached
        storage = _C._storage_from_shared_fd(fd, nbytes, device)
        torch_reductions.shared_cache[key] = torch_reductions.StorageWeakRef(storage)
        return storage
    finally:
        os.close(fd)


def _rebuild_tensor(
    cls: type,
    storage: torch.UntypedStorage,
    dtype: torch.dtype,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool,
    conj: bool,
    neg: bool,
) -> torch.Tensor:
    tensor = torch.empty((0,), dtype=dtype, device=storage.device)
    tensor.set_(storage, offset, size, stride)
    if conj:
        torch._C._set_conj(tensor, True)
    if neg:
        torch._C._set_neg(tensor, True)
    if cls is torch.nn.Parameter:
        # Integer parameters must get requires_grad=False in the constructor.
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    tensor.requires_grad_(requires_grad)
    return tensor


def _raise_sending_error(message: str) -> NoReturn:
    raise RuntimeError(message)


def _on_plain_queue_feeder_thread() -> bool:
    """True on the thread of a multiprocessing.Queue whose pickling errors only get printed.

    Queues that handle those errors (concurrent.futures' ProcessPoolExecutor fails the
    future) override ``_on_queue_feeder_error``; they get the exception as usual.
    """
    thread = threading.current_thread()
    if thread.name != "QueueFeederThread":
        return False
    default_handler = multiprocessing.queues.Queue._on_queue_feeder_error
    return any(arg is default_handler for arg in getattr(thread, "_args", ()))


def _guarded(reduce: Callable[[Any], Reduction], obj: Any) -> Reduction:
    try:
        return reduce(obj)
    except Exception as error:
        if not _on_plain_queue_feeder_thread():
            raise  # Pipe.send, SimpleQueue.put, Process(args=...): the caller gets it
        message = (
            f"the sending process could not share a neuron tensor: {type(error).__name__}: {error}"
        )
        sys.stderr.write(
            "torchneuron: a neuron tensor put on a multiprocessing Queue could not be "
            "shared; the receiver's get() raises this instead of waiting:\n"
            + "".join(traceback.format_exception(error))
        )
        return (_raise_sending_error, (message,))


def _reduce_neuron_tensor(tensor: torch.Tensor) -> Reduction:
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since "
            "autograd does not support crossing process boundaries. If you just want to "
            "transfer the data, call detach() on the tensor before serializing (e.g., "
            "putting it on the queue)."
        )
    torch.utils.hooks.warn_if_has_hooks(tensor)
    if tensor.layout != torch.strided:
        raise RuntimeError(
            f"only strided neuron tensors can be shared between processes, not {tensor.layout}"
        )
    metadata = (
        tensor.dtype,
        tensor.storage_offset(),
        tuple(tensor.size()),
        tuple(tensor.stride()),
        tensor.requires_grad,
        tensor.is_conj(),
        tensor.is_neg(),
    )
    # The storage travels as an object of its own (reduce_storage): the pickler then sends
    # it once per message however many views of it the message holds.
    return (_rebuild_tensor, (type(tensor), tensor.untyped_storage(), *metadata))


def _reduce_neuron_storage(storage: torch.UntypedStorage) -> Reduction:
    return (_rebuild_storage, _storage_handle(storage))


def reduce_tensor(tensor: torch.Tensor) -> Reduction:
    """ForkingPickler reducer: neuron tensors by reference, others as torch does."""
    if tensor.device.type != _DEVICE_TYPE:
        return torch_reductions.reduce_tensor(tensor)
    return _guarded(_reduce_neuron_tensor, tensor)


def reduce_storage(storage: torch.UntypedStorage) -> Reduction:
    """ForkingPickler reducer: neuron storages by reference, others as torch does."""
    if storage.device.type != _DEVICE_TYPE:
        return torch_reductions.reduce_storage(storage)
    return _guarded(_reduce_neuron_storage, storage)


def _share_memory_(self: Any) -> Any:
    if self.device.type == _DEVICE_TYPE:
        _C._share_storage(self)
        return self
    return _torch_share_memory_(self)


def _is_shared(self: Any) -> bool:
    if self.device.type == _DEVICE_TYPE:
        return _C._is_shared_storage(self)
    return _torch_is_shared(self)


_torch_share_memory_: Callable[[Any], Any] = torch.storage._StorageBase.share_memory_
_torch_is_shared: Callable[[Any], bool] = torch._C.StorageBase.is_shared  # type: ignore[attr-defined]


def install() -> None:
    """Registers the reducers and makes storages' share_memory_/is_shared work on neuron.

    torch has no device hook for either: ``UntypedStorage.share_memory_`` ends in
    ``_StorageBase.share_memory_``, which skips every device but the CPU, and the C
    ``is_shared`` answers True for any device but the CPU. Both are replaced by versions
    that handle neuron storages and defer to torch's for the others.
    """
    global _installed
    if _installed:
        return
    storage_base = torch.storage._StorageBase
    if storage_base.__dict__.get("share_memory_") is not _torch_share_memory_ or (
        torch.UntypedStorage.is_shared is not _torch_is_shared
    ):
        warnings.warn(
            "torchneuron: torch's storage sharing methods are not the expected ones; "
            "neuron tensors cannot be shared between processes in this torch version",
            stacklevel=2,
        )
        return
    storage_base.share_memory_ = _share_memory_  # type: ignore[method-assign]
    torch.UntypedStorage.is_shared = _is_shared  # type: ignore[method-assign]
    # torch registered its reducers when torch.multiprocessing was imported (at import
    # torch); these replace them for the same types and delegate for non-neuron objects.
    for tensor_type in (torch.Tensor, torch.nn.Parameter):
        reduction.ForkingPickler.register(tensor_type, reduce_tensor)
    reduction.ForkingPickler.register(torch.UntypedStorage, reduce_storage)
    _installed = True
