"""The ``neuron`` process-group backend for torch.distributed.

``init_process_group("neuron")``, ``init_process_group("cpu:gloo,neuron:neuron")`` and
``init_device_mesh("neuron", ...)`` create it. Ranks on one host exchange tensors through a
shared-memory segment (csrc/distributed) that is created with owner-only permissions and
unlinked as soon as every rank has attached, so nothing outlives the processes. The backend
also serves CPU tensors of the group (registered for both device types), since the
transport works on host memory.

Ranks on several hosts (or all ranks with ``TORCHNEURON_DIST_TRANSPORT=gloo``, the way to test
that path on one host) exchange through Gloo over CPU views of the device memory; send and
recv always go through Gloo. The choice is made per process group: a group whose ranks span
hosts uses Gloo for every collective, while a group within one host (the intra-host dimension
of a 2-D device mesh, ``new_group`` of local ranks) uses shared memory; ``transport(group)``
says which one a group got. Collectives: all_reduce (SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM),
all_gather (list and into-tensor, coalesced), reduce_scatter_tensor (coalesced), broadcast,
reduce, gather, scatter, all_to_all and all_to_all_single (uneven splits), barrier, send,
recv.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from datetime import timedelta
from typing import Any

import torch

_log = logging.getLogger(__name__)
_NAME_KEY = "neuron/shm_segment"
_HOST_KEY = "neuron/host/"
_TRANSPORTS: dict[str, str] = {}  # group name -> "shm" | "gloo", for transport()


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
    """Ranks with equal identities can meet in shared memory: one host name, one boot (two
    hosts may share a name), one user, and one /dev/shm mount (containers on one host that
    share its network and host name may still have /dev/shm mounts of their own)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        shm = os.stat("/dev/shm")
        shm_mount = f"{shm.st_dev}:{shm.st_ino}"
    except OSError:
        shm_mount = ""
    return f"{socket.gethostname()}|{boot}|{os.geteuid()}|{shm_mount}"


def _exchange_identities(store: Any, rank: int, size: int) -> tuple[str, dict[int, str]]:
    """This rank's "host|boot id|uid|/dev/shm|TORCHNEURON_DIST_TRANSPORT" and every rank's."""
    choice = os.environ.get("TORCHNEURON_DIST_TRANSPORT", "auto")
    if choice not in ("auto", "shm", "gloo"):
        raise ValueError(f"TORCHNEURON_DIST_TRANSPORT={choice!r}: use auto, shm or gloo")
    me = f"{_host_identity()}|{choice}"
    store.set(_HOST_KEY + str(rank), me)
    return me, {r: store.get(_HOST_KEY + str(r)).decode() for r in range(size)}


def _transport(me: str, identities: dict[int, str]) -> str:
    """ "shm" when every rank is on this host and nobody asked for Gloo, else "gloo"."""
    choices = {v.rsplit("|", 1)[1] for v in identities.values()}
    if len(choices) > 1:
        raise RuntimeError(
            "TORCHNEURON_DIST_TRANSPORT differs between ranks: "
            + ", ".join(f"rank {r}: {v.rsplit('|', 1)[1]}" for r, v in sorted(identities.items()))
        )
    choice = me.rsplit("|", 1)[1]
    local = all(v == me for v in identities.values())
    if choice == "shm" and not local:
        remote = [r for r, v in identities.items() if v != me]
        raise RuntimeError(
            f"TORCHNEURON_DIST_TRANSPORT=shm, but ranks {remote} run on another host (or "
            "under another user or /dev/shm mount); "
            "unset it to let ranks on several hosts use Gloo"
        )
    return "shm" if local and choice != "gloo" else "gloo"


def _remote_peers(me: str, identities: dict[int, str], global_ranks: list[int]) -> str:
    """ "ranks 2, 3 on host b" for the ranks on other hosts (global ranks), for Gloo's errors:
    Gloo's own timeout message does not say whom it waited for."""
    by_host: dict[str, list[int]] = {}
    for r, identity in sorted(identities.items()):
        if identity != me:
            host = identity.split("|", 1)[0]
            by_host.setdefault(host, []).append(global_ranks[r] if global_ranks else r)
    return "; ".join(
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} on host {host}"
        for host, ranks in by_host.items()
    )


def _create_backend(options: Any, _backend_options: Any) -> Any:
    import torch.distributed as dist

    from .. import _C

    store, rank, size = options.store, options.group_rank, options.group_size
    timeout = options.timeout
    timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))
    _bind_device()
    me, identities = _exchange_identities(store, rank, size)
    transport = _transport(me, identities)
    _TRANSPORTS[str(options.group_id)] = transport
    remote = _remote_peers(me, identities, list(options.global_ranks_in_group))
    _log.info(
        "neuron process group %r: %d ranks on %d hosts, %s",
        options.group_id,
        size,
        len({v.split("|", 1)[0] for v in identities.values()}),
        "shared memory" if transport == "shm" else "Gloo",
    )
    # Gloo carries send/recv always, and every collective when ranks span hosts; it gets
    # CPU views of device memory (no copies).
    inner = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
    name = ""
    if transport == "shm":
        if rank == 0:
            name = f"/torchneuron-{os.geteuid()}-{os.getpid()}-{secrets.token_hex(8)}"
            store.set(_NAME_KEY, name)
        else:
            name = store.get(_NAME_KEY).decode()
    return _C._dist_create_backend(name, rank, size, timeout, inner, transport == "shm", remote)


def transport(group: Any = None) -> str:
    """ "shm" or "gloo": how the neuron backend of `group` (default: the world) moves data.

    Chosen when the group is created: shared memory when all its ranks share a host (same
    host name, boot id, user and /dev/shm mount), else Gloo for every collective of the group.
    """
    import torch.distributed as dist

    group = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        return _TRANSPORTS[group.group_name]
    except KeyError:
        raise ValueError(
            f"process group {group.group_name!r} has no neuron backend; create it with "
            'backend "neuron" (or init_device_mesh("neuron", ...))'
        ) from None


def register() -> None:
    """Registers the backend with torch.distributed (once; no-op without distributed)."""
    import torch.distributed as dist

    if not dist.is_available() or "neuron" in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(
        "neuron", _create_backend, extended_api=True, devices=["neuron", "cpu"]
    )
