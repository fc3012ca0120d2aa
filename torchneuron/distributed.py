"""The ``neuron`` process-group backend for torch.distributed.

``init_process_group("neuron")``, ``init_process_group("cpu:gloo,neuron:neuron")`` and
``init_device_mesh("neuron", ...)`` create it. Ranks on one host exchange tensors through a
shared-memory segment (csrc/distributed) that is created with owner-only permissions and
unlinked as soon as every rank has attached, so nothing outlives the processes. The backend
also serves CPU tensors of the group (registered for both device types), since the
transport works on host memory.

Status: ranks on one host only (a cross-host transport is not built yet; the group refuses
to form across hosts). Collectives: all_reduce (SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM),
all_gather (list and into-tensor, coalesced), reduce_scatter_tensor (coalesced), broadcast,
reduce, gather, scatter, all_to_all and all_to_all_single (uneven splits), barrier. Not yet:
send/recv (torch.distributed reports them as unsupported by the backend).
"""

from __future__ import annotations

import os
import secrets
import socket
from datetime import timedelta
from typing import Any

import torch

_NAME_KEY = "neuron/shm_segment"
_HOST_KEY = "neuron/host/"


def _bind_device() -> None:
    """LOCAL_RANK picks the device, as torchrun users expect; one visible core means 0."""
    local = os.environ.get("LOCAL_RANK")
    if local is None:
        return
    count = torch.neuron.device_count()
    index = int(local)
    if count == 1:
        index = 0
    elif index >= count:
        raise RuntimeError(
            f"LOCAL_RANK={local} but this process sees {count} neuron devices; set "
            "NEURON_RT_VISIBLE_CORES per process or start fewer processes per host"
        )
    torch.neuron.set_device(index)


def _host_identity() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}|{boot}|{os.geteuid()}"


def _create_backend(options: Any, _backend_options: Any) -> Any:
    from . import _C

    store, rank, size = options.store, options.group_rank, options.group_size
    timeout = options.timeout
    timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))
    _bind_device()
    me = _host_identity()
    store.set(_HOST_KEY + str(rank), me)
    others = {r: store.get(_HOST_KEY + str(r)).decode() for r in range(size)}
    remote = [r for r, host in others.items() if host != me]
    if remote:
        raise RuntimeError(
            f"the neuron process-group backend connects ranks on one host only; ranks "
            f"{remote} run elsewhere. Use 'cpu:gloo' for CPU tensors across hosts."
        )
    if rank == 0:
        name = f"/torchneuron-{os.geteuid()}-{os.getpid()}-{secrets.token_hex(8)}"
        store.set(_NAME_KEY, name)
    else:
        name = store.get(_NAME_KEY).decode()
    return _C._dist_create_backend(name, rank, size, timeout)


def register() -> None:
    """Registers the backend with torch.distributed (once; no-op without distributed)."""
    import torch.distributed as dist

    if not dist.is_available() or "neuron" in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(
        "neuron", _create_backend, extended_api=True, devices=["neuron", "cpu"]
    )
