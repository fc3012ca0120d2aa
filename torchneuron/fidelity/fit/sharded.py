"""Traced layouts: one rank's step of a sharded model, traced in one process.

``layout.py`` rescales the one-replica trace by stated rules; this module instead applies the
layout with PyTorch's own APIs and traces what one rank of it does. A fake process group
(``torch.testing._internal.distributed.fake_pg``: every collective returns at once, nothing is
sent) stands for the other ranks, and FakeTensorMode for the device, so one process can trace
any rank of any size of job. The layouts:

- fsdp: FSDP2 ``fully_shard`` on every decoder layer, then on the root;
- tp: ``parallelize_module`` with the Llama plan TorchTitan and Transformers use (q/k/v and
  gate/up ``ColwiseParallel``, o/down ``RowwiseParallel``; embeddings, norms and the LM head
  stay whole on every rank, no sequence parallelism);
- dp: DistributedDataParallel alone, or, with fsdp or tp, HSDP (``fully_shard`` on a
  (dp, fsdp) mesh: replicated over dp, sharded over fsdp).

``measure_sharded`` runs the same build and step for real, on a process group of ranks that
torchrun started, so the prediction can be checked against each rank's
``torch.neuron.max_memory_allocated``. ``python -m torchneuron.fidelity.fit.sharded_check``
prints that comparison.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .layout import Layout
from .step import StepResult, StepSpec, run_step
from .trace import StepTrace, trace_model_step
from .tracker import plain_tensors

_FAKE_DEVICE = "neuron:0"  # the device of a traced rank (fake tensors: nothing is allocated)

# The decoder layer's projections (Transformers' base_model_tp_plan for Llama, TorchTitan's).
TP_PLAN = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}


_LLAMA_LIKE = ("llama", "mistral", "qwen2")  # the tp plan's and the pipeline stage's names


def check_layout(config: Any, layout: Layout) -> None:
    """Raises ValueError for a layout the traced path cannot apply to ``config``."""
    heads = int(getattr(config, "num_attention_heads", 1))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    kind = getattr(config, "model_type", "")
    if layout.tp > 1 and (heads % layout.tp or kv_heads % layout.tp):
        raise ValueError(
            f"tp={layout.tp} must divide the attention heads ({heads}) and KV heads ({kv_heads})"
        )
    if (layout.tp > 1 or layout.pp > 1) and kind not in _LLAMA_LIKE:
        raise ValueError(f"no tensor-parallel plan or pipeline stage for model_type {kind!r}")
    if layout.pp > int(getattr(config, "num_hidden_layers", 0)):
        raise ValueError(f"pp={layout.pp} is more stages than the model has layers")
    if layout.pp > 1 and layout.dp > 1 and layout.fsdp == layout.tp == 1:
        raise ValueError("pipeline stages with DDP are not traced: use dp with fsdp (HSDP)")


def device_mesh(layout: Layout, device_type: str = "neuron") -> Any:
    """The (pp, dp, fsdp, tp) mesh of ``layout`` over the world group, tp innermost."""
    from torch.distributed.device_mesh import init_device_mesh

    with warnings.catch_warnings():
        # Under the fake group no device is bound to the rank; the mesh only warns about it.
        warnings.simplefilter("ignore", UserWarning)
        return init_device_mesh(
            device_type,
            (layout.pp, layout.dp, layout.fsdp, layout.tp),
            mesh_dim_names=("pp", "dp", "fsdp", "tp"),
        )


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers (the model's longest ModuleList)."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def parallelize(
    model: torch.nn.Module,
    layout: Layout,
    mesh: Any,
    fake: bool = False,
) -> torch.nn.Module:
    """Applies ``layout`` to ``model`` (on its device) with PyTorch's APIs; returns the model
    to step (DistributedDataParallel's wrapper for pure data parallelism).

    ``fake``: the model is made of fake tensors, under FakeTensorMode and a fake process
    group. Two things differ then. ``parallelize_module`` and ``fully_shard`` run outside the
    mode, since DeviceMesh computes with its real rank tensors while FSDP2 joins the tp mesh
    to its own (the model's fake tensors still dispatch to their mode); DDP is built inside
    it, since its Reducer allocates the gradient buckets from nothing, which must be fake
    too. And DDP's gradient all-reduce goes through a Python communication hook that
    all-reduces the bucket in place and hands it back, as the built-in one does: the fake
    group's result carries no tensor, which the built-in hook requires.
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    layers = _layers(model)
    with unset_fake_temporarily() if fake else contextlib.nullcontext():
        if layout.tp > 1:
            styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
            plan = {name: styles[style]() for name, style in TP_PLAN.items()}
            for layer in layers:
                parallelize_module(layer, mesh["tp"], plan)
        if layout.fsdp > 1 or (layout.dp > 1 and layout.tp > 1):
            shard_mesh = mesh["dp", "fsdp"] if layout.dp > 1 else mesh["fsdp"]
            for layer in layers:
                fully_shard(layer, mesh=shard_mesh)
            fully_shard(model, mesh=shard_mesh)
            return model
    if layout.dp > 1:
        from torch.nn.parallel import DistributedDataParallel

        # Every rank builds the model from one seed, so there is nothing to sync at init;
        # the sync (a shape check that reads tensor data) cannot run on fake tensors.
        group = mesh["dp"].get_group()
        wrapped = DistributedDataParallel(model, process_group=group, init_sync=False)
        if fake:
            wrapped.register_comm_hook(group, _all_reduce_in_place)
        return wrapped
    return model


def _all_reduce_in_place(state: Any, bucket):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
    """DDP's built-in all-reduce, for a fake group: sums the bucket in place and returns it
    (the Reducer has already divided the gradients by the world size). Not annotated: DDP
    compares the annotations with its types, and this module's are strings."""
    import torch.distributed as dist

    buffer = bucket.buffer()
    dist.all_reduce(buffer, group=state)
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(buffer)
    return done


@contextlib.contextmanager
def fake_process_group(rank: int, world_size: int) -> Iterator[None]:
    """The default process group as ``rank`` of ``world_size`` ranks that do not exist."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process")
    # The fake backend registers itself for cpu, cuda, hpu and xpu; neuron is named here.
    dist.init_process_group(
        "cpu:fake,neuron:fake", store=FakeStore(), rank=rank, world_size=world_size
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def stage_first_ranks(layout: Layout) -> list[int]:
    """The first rank of each pipeline stage (pp is the mesh's outermost dimension)."""
    per_stage = layout.cores // layout.pp
    return [stage * per_stage for stage in range(layout.pp)]


def _stepper(
    model: torch.nn.Module, spec: StepSpec, layout: Layout, mesh: Any, device: str, fake: bool
) -> tuple[torch.nn.Module, Callable[..., StepResult]]:
    """Moves ``model`` (or, with pp, this rank's stage of it) to ``device``, applies
    ``layout``, and returns what to step with the function that steps it. A fake model is
    on its device already (and ``Module.to`` cannot swap fake tensors)."""

    def placed(module: torch.nn.Module) -> torch.nn.Module:
        return module if fake else module.to(device)

    if layout.pp == 1:
        return parallelize(placed(model), layout, mesh, fake), run_step
    from .pipeline import DecoderStage, build_schedule, run_pipeline_step

    stage = mesh.get_local_rank("pp")
    stage_module = placed(DecoderStage(model, stage, layout.pp))
    parallelize(stage_module, layout, mesh, fake)  # in place: check_layout refuses pp x DDP
    schedule = build_schedule(
        stage_module,  # type: ignore[arg-type]
        spec,
        stage,
        layout.pp,
        torch.device(device),
        mesh["pp"].get_group(),
        fake,
    )

    def step(stepped: Any, spec: StepSpec, device: str, tracker: Any = None) -> StepResult:
        return run_pipeline_step(stepped, schedule, spec, device, tracker)

    return stage_module, step


def predict_sharded(config: Any, spec: StepSpec, layout: Layout, rank: int = 0) -> StepTrace:
    """The traced step of ``rank`` of ``layout`` (a fake process group, fake tensors).

    ``spec.batch`` is each data-parallel replica's batch (every rank of a tp group sees the
    same batch; pipeline stages split it into one microbatch per stage). The trace's records
    are that rank's storages, its peak that rank's peak.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    from .model_source import build_model

    check_layout(config, layout)
    if not 0 <= rank < layout.cores:
        raise ValueError(f"rank {rank} is not in a layout of {layout.cores} ranks")
    steps: list[Callable[..., StepResult]] = []

    def build() -> torch.nn.Module:
        model = build_model(config, spec.torch_dtype)  # fake tensors on the device
        stepped, step = _stepper(model, spec, layout, mesh, _FAKE_DEVICE, fake=True)
        real = [
            name
            for name, t in [*stepped.named_parameters(), *stepped.named_buffers()]
            if any(not isinstance(local, FakeTensor) for local in plain_tensors(t))
        ]
        if real:
            raise RuntimeError(f"applying {layout} made real tensors of {real[:3]}")
        steps.append(step)
        return stepped

    def step(model: torch.nn.Module, spec: StepSpec, device: str, tracker: Any) -> StepResult:
        return steps[0](model, spec, device, tracker)

    with fake_process_group(rank, layout.cores):
        mesh = device_mesh(layout)  # made of real tensors: before FakeTensorMode
        return trace_model_step(build, spec, fake=True, device=_FAKE_DEVICE, step=step)


def measure_sharded(config: Any, spec: StepSpec, layout: Layout) -> dict[str, int]:
    """This rank's real step under ``layout``, on the initialised process group.

    Returns ``peak``: ``torch.neuron.max_memory_allocated`` over the step (reset before it),
    less ``baseline``, what was allocated before the model was built (0 in a fresh process).
    The model is built on the CPU with one seed on every rank and moved, so initialisation
    leaves nothing behind.
    """
    check_layout(config, layout)
    from .model_source import build_model

    device = f"neuron:{torch.neuron.current_device()}"
    gc.collect()
    torch.neuron.synchronize()
    baseline = int(torch.neuron.memory_allocated())
    torch.manual_seed(0)
    model = build_model(config, spec.torch_dtype, device="cpu")
    stepped, step = _stepper(model, spec, layout, device_mesh(layout), device, fake=False)
    del model
    gc.collect()
    torch.neuron.synchronize()
    torch.neuron.reset_peak_memory_stats()
    result = step(stepped, spec, device)
    torch.neuron.synchronize()
    peak = int(torch.neuron.max_memory_allocated())
    del result, stepped, step
    gc.collect()
    torch.neuron.empty_cache()
    return {"peak": peak - baseline, "baseline": baseline}
