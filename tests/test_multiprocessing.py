"""Neuron tensors shared between processes through torch.multiprocessing.

One spawned worker (started once: a child importing torch costs seconds) serves requests
from a Queue: it holds what it receives, changes it in place, reads it back, drops it, and
reports errors raised while receiving instead of dying. Every wait has a timeout.
"""

from __future__ import annotations

import gc
import multiprocessing.queues
import os
import queue
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from torchneuron import _C
from torchneuron.device import tensor_sharing

TIMEOUT = 120  # for any one reply, including a child's start on a loaded machine
IDLE_TIMEOUT = 600  # a worker whose parent vanished exits after this long
MEMFD_NAME = "/memfd:torchneuron-shared:"


# ---- the worker ----------------------------------------------------------------------


def _describe(held: dict[str, Any], key: str) -> dict[str, Any]:
    t = held[key]
    return {
        "type": type(t).__name__,
        "device": str(t.device),
        "values": t.detach().cpu().tolist(),
        "shared": t.is_shared(),
        "offset": t.storage_offset(),
        "stride": tuple(t.stride()),
        "requires_grad": t.requires_grad,
        "is_leaf": t.is_leaf,
        "storage": t.untyped_storage().data_ptr(),
    }


def _hold(held: dict[str, Any], key: str, obj: Any) -> None:
    held[key] = obj


def _add_(held: dict[str, Any], key: str, value: float) -> None:
    with torch.no_grad():
        held[key].add_(value)


def _drop(held: dict[str, Any], key: str) -> None:
    del held[key]
    gc.collect()


def _memory_allocated(held: dict[str, Any], device: int) -> int:
    return torch.neuron.memory_allocated(device)


def _send_back(held: dict[str, Any], key: str) -> Any:
    return held[key]


def _storage_ptrs(held: dict[str, Any], *keys: str) -> set[int]:
    """The storages behind held tensors (and tensors in held dicts)."""
    found = [held[k] for k in keys]
    tensors = [t for v in found for t in (v.values() if isinstance(v, dict) else [v])]
    return {t.untyped_storage().data_ptr() for t in tensors}


_COMMANDS = {
    f.__name__: f
    for f in (_describe, _hold, _add_, _drop, _memory_allocated, _send_back, _storage_ptrs)
}


def _serve(requests: Any, replies: Any, initial: dict[str, Any]) -> None:
    held: dict[str, Any] = dict(initial)
    while True:
        try:
            request = requests.get(timeout=IDLE_TIMEOUT)
        except queue.Empty:
            return
        except Exception as error:  # receiving failed: report it, stay in step
            replies.put(("error", f"{type(error).__name__}: {error}"))
            continue
        if request is None:
            return
        name, args = request
        try:
            replies.put(("ok", _COMMANDS[name](held, *args)))
        except Exception as error:
            replies.put(("error", f"{type(error).__name__}: {error}"))


class Worker:
    def __init__(self, env: dict[str, str] | None = None, **initial: Any):
        self.initial = initial
        ctx = mp.get_context("spawn")
        self.requests = ctx.Queue()
        self.replies = ctx.Queue()
        self.process = ctx.Process(
            target=_serve, args=(self.requests, self.replies, initial), daemon=True
        )
        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        try:
            self.process.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v

    def call(self, name: str, *args: Any) -> tuple[str, Any]:
        self.requests.put((name, args))
        return self.replies.get(timeout=TIMEOUT)

    def ok(self, name: str, *args: Any) -> Any:
        status, value = self.call(name, *args)
        assert status == "ok", value
        return value

    def stop(self) -> None:
        self.requests.put(None)
        self.process.join(TIMEOUT)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(TIMEOUT)


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    # Passed as Process arguments: a view with an offset and strides, and a module.
    base = torch.arange(24.0, device="neuron:1").reshape(4, 6)
    model = torch.nn.Linear(3, 2).to("neuron").share_memory()
    w = Worker(base=base, view=base[1:, 2::2], model=model)
    yield w
    w.stop()


def memfd_inodes(pid: int) -> set[int]:
    """Inodes of neuron shared memory the process maps or holds a descriptor of."""
    inodes = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(MEMFD_NAME):
                inodes.add(int(fields[4]))
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(MEMFD_NAME):
                inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except FileNotFoundError:  # closed meanwhile
            pass
    return inodes


def released(pid: int, inode: int) -> bool:
    """Whether the process lets go of the memory file within a few seconds (the descriptor
    a Queue hands over is closed by a helper thread once the receiver has taken it)."""
    for _ in range(100):
        if inode not in memfd_inodes(pid):
            return True
        time.sleep(0.05)
    return False


# ---- sharing in one process ----------------------------------------------------------


def test_share_memory_moves_storage_keeping_values_and_device() -> None:
    t = torch.randn(5, 7, device="neuron:2")
    expected = t.cpu()
    view = t[1:, ::3]
    assert not t.is_shared() and not t.untyped_storage().is_shared()
    assert t.share_memory_() is t
    assert t.is_shared() and view.is_shared()  # the storage moved, so every view did
    assert t.device == torch.device("neuron:2")
    torch.testing.assert_close(t.cpu(), expected, rtol=0, atol=0)
    torch.testing.assert_close(view.cpu(), expected[1:, ::3], rtol=0, atol=0)
    ptr = t.data_ptr()
    t.share_memory_()  # already shared: nothing moves
    assert t.data_ptr() == ptr
    t.mul_(2)  # host kernels run on shared memory like any other
    torch.testing.assert_close(view.cpu(), expected[1:, ::3] * 2, rtol=0, atol=0)

    model = torch.nn.Linear(4, 4).to("neuron").share_memory()
    assert all(p.is_shared() for p in model.parameters())
    assert torch.randn(3).is_shared() is False  # CPU tensors keep torch's answer


def test_shared_storage_cannot_grow() -> None:
    t = torch.arange(6.0, device="neuron").share_memory_()
    with pytest.raises(RuntimeError, match="not resizable.*shared memory"):
        t.resize_(100)
    assert t.shape == (6,)  # a failed resize leaves the tensor as it was
    out = torch.empty(0, device="neuron").share_memory_()
    with pytest.raises(RuntimeError, match="not resizable"):
        torch.add(t, 1, out=out)  # the kernel must not give `out` private memory
    assert out.shape == (0,) and out.is_shared()


def test_shared_memory_is_counted_once_and_released() -> None:
    gc.collect()
    allocated = torch.neuron.memory_allocated(3)
    t = torch.ones(1000, device="neuron:3")  # 4000 bytes
    free, total = torch.neuron.mem_get_info(3)
    used = total - free  # with the cached segment its block came from
    t.share_memory_()
    assert torch.neuron.memory_allocated(3) == allocated + 4000
    free, total = torch.neuron.mem_get_info(3)
    assert total - free == used + 4000  # the private block went back to the cache
    del t
    gc.collect()
    assert torch.neuron.memory_allocated(3) == allocated
    free, total = torch.neuron.mem_get_info(3)
    assert total - free == used


def test_pickling_in_process_keeps_geometry_and_bits() -> None:
    import pickle
    from multiprocessing.reduction import ForkingPickler

    z = torch.tensor([1 + 2j, 3 - 4j, 5 + 0j], device="neuron")
    for t in (z.conj(), z.real._neg_view(), torch.ones(3, device="neuron").expand(4, 3)):
        back = pickle.loads(ForkingPickler.dumps(t))
        assert (back.is_conj(), back.is_neg()) == (t.is_conj(), t.is_neg())
        assert back.stride() == t.stride() and back.device == t.device
        torch.testing.assert_close(back.cpu(), t.cpu(), rtol=0, atol=0)
        # Received in the sending process, the storage is the sender's own.
        assert back.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    storage = torch.arange(4, dtype=torch.uint8, device="neuron:1").untyped_storage()
    back = pickle.loads(ForkingPickler.dumps(storage))
    assert back.device == storage.device and back.data_ptr() == storage.data_ptr()
    empty = pickle.loads(ForkingPickler.dumps(torch.empty(0, 3, device="neuron:2")))
    assert empty.shape == (0, 3) and empty.device == torch.device("neuron:2")


def test_pickling_errors_surface_in_the_sender() -> None:
    nonleaf = torch.ones(2, device="neuron", requires_grad=True) * 2
    ctx = mp.get_context("spawn")
    sender, receiver = ctx.Pipe()
    with pytest.raises(RuntimeError, match="non-leaf tensor which requires_grad"):
        sender.send(nonleaf)
    assert not receiver.poll(0.5)  # nothing half-sent
    # Process arguments are pickled in start(), before any child exists.
    process = ctx.Process(target=_describe, args=({}, nonleaf))
    with pytest.raises(RuntimeError, match="non-leaf tensor which requires_grad"):
        process.start()
    assert process.pid is None


def test_queues_that_handle_feeder_errors_still_get_them() -> None:
    """concurrent.futures' queues fail the future from _on_queue_feeder_error: keep that."""
    errors: queue.Queue[BaseException] = queue.Queue()

    class HandlingQueue(multiprocessing.queues.Queue):
        def _on_queue_feeder_error(self, error: BaseException, obj: object) -> None:
            errors.put(error)

    handling = HandlingQueue(ctx=mp.get_context("spawn"))
    handling.put(torch.ones(2, device="neuron", requires_grad=True) * 2)
    error = errors.get(timeout=TIMEOUT)
    assert isinstance(error, RuntimeError) and "non-leaf" in str(error)
    handling.close()
    handling.join_thread()


def test_foreign_descriptors_are_refused() -> None:
    with tempfile.TemporaryFile() as plain:
        plain.write(b"\0" * 64)
        plain.flush()
        with pytest.raises(RuntimeError, match="not neuron shared memory"):
            _C._storage_from_shared_fd(plain.fileno(), 64, 0)
    t = torch.ones(4, device="neuron").share_memory_()
    fd = _C._shared_storage_fd(t.untyped_storage())
    with pytest.raises(RuntimeError, match="holds 16 B, not the expected 32 B"):
        _C._storage_from_shared_fd(fd, 32, 0)


def test_receiver_reports_a_sender_that_went_away() -> None:
    class Gone:
        def detach(self) -> int:
            raise ConnectionRefusedError("no listener")

    identity = tensor_sharing._device_identity(0)
    with pytest.raises(RuntimeError, match="sending process exited"):
        tensor_sharing._rebuild_storage(Gone(), 16, identity)


# ---- sharing with a spawned worker ---------------------------------------------------


def test_queue_round_trip_shares_memory(worker: Worker) -> None:
    """The issue's repro: a child changes a queued neuron tensor; the parent sees it."""
    t = torch.zeros(4, device="neuron:1")
    assert not t.is_shared()
    worker.ok("_hold", "zeros", t)
    assert t.is_shared()  # moved to shared memory when it was sent, as CPU tensors are
    worker.ok("_add_", "zeros", 1.0)
    assert t.cpu().tolist() == [1.0] * 4
    seen = worker.ok("_describe", "zeros")
    assert seen["device"] == "neuron:1" and seen["shared"]
    t.mul_(5)
    assert worker.ok("_describe", "zeros")["values"] == [5.0] * 4
    back = worker.ok("_send_back", "zeros")  # and home again: the very same storage
    assert back.data_ptr() == t.data_ptr() and back.device == t.device
    worker.ok("_drop", "zeros")


def test_process_arguments_and_parameters(worker: Worker) -> None:
    base, model = worker.initial["base"], worker.initial["model"]
    seen = worker.ok("_describe", "view")
    assert seen["device"] == "neuron:1" and seen["shared"]
    assert seen["offset"] == 8 and seen["stride"] == (6, 2)
    assert seen["values"] == base[1:, 2::2].cpu().tolist()
    expected = base.cpu()
    expected[1:, 2::2] += 10
    worker.ok("_add_", "view", 10.0)
    torch.testing.assert_close(base.cpu(), expected, rtol=0, atol=0)
    # A module's parameters arrive as leaf Parameters that require grad, in shared memory.
    weight = worker.ok("_send_back", "model").weight
    assert isinstance(weight, torch.nn.Parameter) and weight.requires_grad and weight.is_leaf
    assert weight.data_ptr() == model.weight.data_ptr()


def test_views_of_one_storage_stay_one_storage(worker: Worker) -> None:
    base = torch.arange(30, dtype=torch.bfloat16, device="neuron:2").reshape(5, 6)
    views = {"row": base[3], "cols": base[1:, 1::2], "bcast": base[0, :1].expand(2, 4)}
    worker.ok("_hold", "views", views)
    worker.ok("_hold", "row", views["row"])  # a second message: the same storage again
    assert len(worker.ok("_storage_ptrs", "views", "row")) == 1  # one storage in the child
    back = worker.ok("_send_back", "views")
    assert {v.untyped_storage().data_ptr() for v in back.values()} == {base.data_ptr()}
    assert {k: v.stride() for k, v in back.items()} == {k: v.stride() for k, v in views.items()}
    status, value = worker.call("_describe", "row")
    assert status == "ok" and value["offset"] == 18 and value["device"] == "neuron:2"
    worker.ok("_add_", "row", 100.0)
    expected = torch.arange(30, dtype=torch.bfloat16).reshape(5, 6)
    expected[3] += 100
    torch.testing.assert_close(base.cpu(), expected, rtol=0, atol=0)
    worker.ok("_drop", "views")
    worker.ok("_drop", "row")


def test_memory_released_when_the_last_process_drops_it(worker: Worker) -> None:
    me, child = os.getpid(), worker.process.pid
    assert child is not None
    child_allocated = worker.ok("_memory_allocated", 0)
    before = memfd_inodes(me)
    t = torch.full((1 << 18,), 3.0, device="neuron")  # 1 MiB
    t.share_memory_()
    (inode,) = memfd_inodes(me) - before
    worker.ok("_hold", "big", t)
    assert inode in memfd_inodes(child)
    assert worker.ok("_memory_allocated", 0) == child_allocated + (1 << 20)
    del t
    gc.collect()
    assert released(me, inode)
    assert worker.ok("_describe", "big")["values"][:2] == [3.0, 3.0]  # alive in the child
    worker.ok("_drop", "big")
    assert inode not in memfd_inodes(child)  # no process holds it: the kernel frees it
    assert worker.ok("_memory_allocated", 0) == child_allocated


def test_queue_errors_reach_the_receiver(worker: Worker, capfd: pytest.CaptureFixture) -> None:
    nonleaf = torch.ones(2, device="neuron", requires_grad=True) * 2
    status, message = worker.call("_hold", "nonleaf", nonleaf)
    assert status == "error" and "non-leaf tensor which requires_grad" in message
    assert "could not be shared" in capfd.readouterr().err  # and the sender said so
    # The worker is still in step.
    worker.ok("_hold", "after", torch.ones(1, device="neuron"))
    worker.ok("_drop", "after")


def test_file_system_strategy_still_passes_descriptors(worker: Worker) -> None:
    previous = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        t = torch.zeros(3, device="neuron")
        worker.ok("_hold", "fs", t)
        worker.ok("_add_", "fs", 2.0)
        assert t.cpu().tolist() == [2.0] * 3
        worker.ok("_drop", "fs")
    finally:
        mp.set_sharing_strategy(previous)


# ---- other process configurations ----------------------------------------------------


def test_receiver_maps_the_senders_core_or_says_it_cannot() -> None:
    # The receiver sees only logical core 1, which it calls neuron:0.
    worker = Worker(env={"NEURON_RT_VISIBLE_CORES": "1"})
    try:
        t = torch.zeros(2, device="neuron:1")
        worker.ok("_hold", "t", t)
        assert worker.ok("_describe", "t")["device"] == "neuron:0"
        worker.ok("_add_", "t", 1.0)
        assert t.cpu().tolist() == [1.0, 1.0]
        u = torch.zeros(2, device="neuron:0")
        before = memfd_inodes(os.getpid())
        u.share_memory_()
        (inode,) = memfd_inodes(os.getpid()) - before
        status, message = worker.call("_hold", "u", u)
        assert status == "error"
        assert "lives on neuron:0 of the sending process" in message
        assert "NEURON_RT_VISIBLE_CORES='1'" in message
        del u
        gc.collect()
        assert released(os.getpid(), inode)  # the refused descriptor did not stay behind
    finally:
        worker.stop()


def _forkserver_child(t: torch.Tensor, replies: Any) -> None:
    t.add_(1)
    replies.put(str(t.device))


def test_forkserver_children_share_too() -> None:
    ctx = mp.get_context("forkserver")
    replies = ctx.Queue()
    t = torch.zeros(3, device="neuron:2")
    process = ctx.Process(target=_forkserver_child, args=(t, replies), daemon=True)
    process.start()
    try:
        assert replies.get(timeout=TIMEOUT) == "neuron:2"
        assert t.cpu().tolist() == [1.0] * 3
    finally:
        process.join(TIMEOUT)
        if process.is_alive():
            process.kill()


def _forked_child(requests: Any, replies: Any) -> None:
    try:
        requests.get(timeout=TIMEOUT)
        replies.put("received")
    except Exception as error:
        replies.put(f"{type(error).__name__}: {error}")


def test_forked_child_is_told_to_use_spawn() -> None:
    torch.neuron.init()
    ctx = mp.get_context("fork")
    requests, replies = ctx.Queue(), ctx.Queue()
    process = ctx.Process(target=_forked_child, args=(requests, replies), daemon=True)
    process.start()
    try:
        requests.put(torch.ones(2, device="neuron"))
        message = replies.get(timeout=TIMEOUT)
        assert "forked subprocess" in message and "spawn" in message
    finally:
        process.join(TIMEOUT)
        if process.is_alive():
            process.kill()
