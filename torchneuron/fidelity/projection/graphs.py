"""A script's own compiled graphs, projected on a NeuronCore op by op with the calibrated
engine model of analytic.py.

`python -m torchneuron.fidelity.projection --script train.py [args]` runs the script (on
neuron, under torch.compile(backend="neuron")), costs every forward, backward and inference
graph the neuron backend lowers, counts how often each ran and how many optimizer steps the
script took, and prints per graph, per optimizer step and for the whole run:

- ops with FLOPs (PyTorch's flop formulas: matmuls, attention, convolution) run on the Tensor
  engine at the calibrated efficiency and the share of 128-row tiles their contraction and
  output widths fill, as analytic.py's layer model does;
- functional collectives (all_reduce, all_gather, reduce_scatter, all_to_all) cost
  analytic.py's ring phases over NeuronLink among the group's ranks;
- every other op costs the longer of its elements on the Vector engine and its bytes (inputs
  and outputs, nothing fused) at HBM bandwidth;
- the calibrated per-layer overhead is spread over a layer's Tensor-engine matmuls (nine in a
  Llama layer's forward: seven projections, QK^T and AV), so a graph of one Llama layer pays
  what analytic.py charges it.

Eager ops outside compiled graphs are not projected (the report says how many graphs ran).
"""

from __future__ import annotations

import operator
import runpy
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import flop_registry

from ..html_report import page, stacked_bars, table
from .analytic import CALIBRATION, Breakdown, Calibration, collective_phase_seconds, tile_efficiency
from .hardware import Instance, find_instance

# Tensor-engine matmuls in one Llama decoder layer's forward (analytic.py's layer): q, k, v,
# o, gate, up, down, QK^T and AV. The per-layer overhead is spread over them.
MATMULS_PER_LAYER = 9
# Attention ops whose FLOPs are two matmuls (QK^T and AV), or four in their backward.
_ATTENTION_MATMULS = {"backward": 4, "forward": 2}
_COLLECTIVE_PHASES = {
    "all_reduce": 2,  # reduce-scatter then all-gather
    "all_gather_into_tensor": 1,
    "reduce_scatter_tensor": 1,
    "all_to_all_single": 1,
}


@dataclass(frozen=True)
class OpWork:
    """What one op of a graph asks of the chip, independent of the instance."""

    name: str
    flops: float = 0.0
    matmuls: int = 0  # Tensor-engine matmuls, for the fixed overhead
    tile_dims: tuple[int, ...] = ()  # contraction and output widths of the matmul
    elements: int = 0  # for the Vector engine
    bytes: int = 0  # inputs read and outputs written
    collective: str = ""  # a functional collective's name
    ranks: int = 1


def _values(x: Any) -> Any:
    return tree_map(lambda v: v.meta.get("val") if isinstance(v, torch.fx.Node) else v, x)


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


def _group_size(args: Sequence[Any]) -> int:
    """The ranks of a functional collective's group (its last string argument names it)."""
    import torch.distributed as dist

    name = next((a for a in reversed(args) if isinstance(a, str)), None)
    if not dist.is_available() or not dist.is_initialized():
        return 1
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        return int(_resolve_process_group(name).size()) if name else dist.get_world_size()
    except (ValueError, RuntimeError, KeyError):
        return dist.get_world_size()


def op_work(node: torch.fx.Node) -> OpWork | None:
    """The work of one call_function node (None for views, getitem and non-ATen calls)."""
    target = node.target
    if node.op != "call_function" or target is operator.getitem:
        return None
    if not isinstance(target, torch._ops.OpOverload) or target.is_view:
        return None
    args, kwargs, out = _values(node.args), _values(node.kwargs), node.meta.get("val")
    inputs, outputs = _tensors((args, kwargs)), _tensors(out)
    nbytes = sum(t.numel() * t.element_size() for t in inputs + outputs)
    elements = max([t.numel() for t in inputs + outputs] or [0])
    name = str(target.overloadpacket)
    packet = target.overloadpacket.__name__
    if packet in _COLLECTIVE_PHASES and "c10d_functional" in name:
        size = max((t.numel() * t.element_size() for t in inputs + outputs), default=0)
        return OpWork(name, bytes=size, collective=packet, ranks=_group_size(node.args))
    formula = flop_registry.get(target.overloadpacket)
    if formula is not None and inputs and outputs:
        flops = float(formula(*args, **kwargs, out_val=out))
        if "attention" in name:
            matmuls = _ATTENTION_MATMULS["backward" if "backward" in name else "forward"]
            dims: tuple[int, ...] = (int(inputs[0].shape[-1]),)
        else:
            matmuls = 1
            dims = (int(inputs[0].shape[-1]), int(outputs[0].shape[-1]))
        return OpWork(name, flops, matmuls, dims, elements, nbytes)
    if not outputs:
        return None
    return OpWork(name, elements=elements, bytes=nbytes)


def op_breakdown(work: OpWork, inst: Instance, cal: Calibration = CALIBRATION) -> Breakdown:
    """Seconds of one op on one NeuronCore of `inst`, by kind."""
    out = Breakdown()
    if work.collective:
        phase = collective_phase_seconds(
            work.bytes, work.ranks, inst.link_bytes_per_s, inst.hop_latency_s, cal
        )
        out.add("collectives", _COLLECTIVE_PHASES[work.collective] * phase)
        return out
    if work.flops:
        peak = inst.matmul_bf16_flops * cal.matmul_efficiency
        out.add("matmul", work.flops / (peak * tile_efficiency(*work.tile_dims)))
        out.add("overhead", work.matmuls * cal.layer_overhead_s / MATMULS_PER_LAYER)
        return out
    vector = work.elements / inst.vector_elements_per_s
    memory = work.bytes / inst.hbm_bytes_per_s
    out.add("vector" if vector >= memory else "memory", max(vector, memory))
    return out


@dataclass
class GraphRecord:
    index: int
    kind: str  # forward, backward or inference
    code: str  # file:line function of the frame
    ops: list[OpWork]
    calls: Callable[[], int] = lambda: 0

    def breakdown(self, inst: Instance, cal: Calibration = CALIBRATION) -> Breakdown:
        total = Breakdown()
        for work in self.ops:
            total = total.merged(op_breakdown(work, inst, cal))
        return total

    def slowest(self, inst: Instance, top: int = 8) -> list[tuple[str, float]]:
        by_op: dict[str, float] = {}
        for work in self.ops:
            by_op[work.name] = by_op.get(work.name, 0.0) + op_breakdown(work, inst).total
        return sorted(by_op.items(), key=lambda kv: -kv[1])[:top]


def _frame_of(gm: torch.fx.GraphModule) -> str:
    from ...compile.backend import _frame_name

    return _frame_name(gm)


@dataclass
class ScriptRecorder:
    """Records the graphs lowered and the optimizer steps taken inside its `with` block."""

    graphs: list[GraphRecord] = field(default_factory=list)
    optimizer_steps: int = 0

    def _observe(self, gm: torch.fx.GraphModule, kind: str) -> Callable[[Any], None]:
        ops = [w for w in map(op_work, gm.graph.nodes) if w is not None]
        record = GraphRecord(len(self.graphs), kind, _frame_of(gm), ops)
        self.graphs.append(record)

        def attach(host_graph: Any) -> None:
            record.calls = lambda: int(host_graph.calls)

        return attach

    def _stepped(self, *_: Any) -> None:
        self.optimizer_steps += 1

    def __enter__(self) -> ScriptRecorder:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from ...compile.backend import graph_observers

        graph_observers.append(self._observe)
        self._hook = register_optimizer_step_post_hook(self._stepped)
        return self

    def __exit__(self, *_: Any) -> None:
        from ...compile.backend import graph_observers

        graph_observers.remove(self._observe)
        self._hook.remove()


def run_script(argv: Sequence[str]) -> tuple[ScriptRecorder, int]:
    """Runs `argv[0]` as __main__ with `argv[1:]` as its arguments; (its record, exit code)."""
    path = Path(argv[0])
    if not path.is_file():
        raise FileNotFoundError(f"no script {path}")
    saved = sys.argv
    sys.argv = [str(path), *argv[1:]]
    code = 0
    with ScriptRecorder() as recorder:
        try:
            runpy.run_path(str(path), run_name="__main__")
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        finally:
            sys.argv = saved
    return recorder, code


def format_script(name: str, recorder: ScriptRecorder, instances: list[Instance]) -> str:
    graphs = recorder.graphs
    steps = recorder.optimizer_steps
    lines = [
        f"{name}: {len(graphs)} neuron graph(s) compiled, {steps} optimizer step(s); eager ops "
        "outside compiled graphs are not projected",
        f"{'graph':<7}{'kind':<11}{'calls':>6}{'ops':>6}  "
        + "".join(f"{i.name + ' ms':>20}" for i in instances)
        + "  frame",
    ]
    run = dict.fromkeys((i.name for i in instances), 0.0)
    for g in graphs:
        per_call = [g.breakdown(i).total for i in instances]
        for inst, seconds in zip(instances, per_call, strict=True):
            run[inst.name] += seconds * g.calls()
        lines.append(
            f"[{g.index}]".ljust(7)
            + f"{g.kind:<11}{g.calls():>6}{len(g.ops):>6}  "
            + "".join(f"{s * 1e3:>20.3f}" for s in per_call)
            + f"  {g.code}"
        )
    lines.append("whole run: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in run.items()))
    if steps:
        lines.append(
            "per optimizer step: "
            + ", ".join(f"{k} {v / steps * 1e3:.3f} ms" for k, v in run.items())
        )
    if graphs and instances:
        costliest = max(graphs, key=lambda g: g.breakdown(instances[0]).total * max(g.calls(), 1))
        lines.append(f"slowest ops of graph [{costliest.index}] on {instances[0].name}:")
        for op, seconds in costliest.slowest(instances[0]):
            lines.append(f"  {op:<48}{seconds * 1e3:>10.3f} ms")
    return "\n".join(lines)


def html_script(name: str, recorder: ScriptRecorder, instances: list[Instance]) -> str:
    sections = [("Summary", f"<pre>{format_script(name, recorder, instances)}</pre>")]
    for inst in instances:
        bars = [
            (f"[{g.index}] {g.kind}", list(g.breakdown(inst).parts.items()), 0.0)
            for g in recorder.graphs
        ]
        sections.append((f"Per call on {inst.name} (ms)", stacked_bars(bars, "ms", 1e-3)))
    rows = [(f"[{g.index}]", g.kind, g.calls(), len(g.ops), g.code) for g in recorder.graphs]
    sections.append(("Graphs", table(("graph", "kind", "calls", "ops", "frame"), rows)))
    return page(f"Projected graphs of {name}", sections)


def project_script(argv: Sequence[str], instance_names: list[str], html: Path | None) -> int:
    """The command: runs the script, prints its projection; returns the script's exit code."""
    instances = [find_instance(n) for n in instance_names]
    recorder, code = run_script(argv)
    print(format_script(argv[0], recorder, instances))
    if html:
        html.write_text(html_script(argv[0], recorder, instances))
    return code
