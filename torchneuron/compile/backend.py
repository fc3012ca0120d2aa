"""The ``neuron`` backend for ``torch.compile``.

Dynamo finds it through the ``torch_dynamo_backends`` entry point, so
``torch.compile(model, backend="neuron")`` works without importing anything, and
Transformers' automatic compilation of static-cache generation on a neuron device (which
asks for this backend by name) runs.

How a graph is compiled: Inductor's ``compile_fx`` does what it does for any device (AOT
Autograd into forward/backward ATen graphs, Inductor's decompositions, the partitioner);
each resulting ATen graph is then re-targeted from the neuron device to the host and lowered
by Inductor's C++ code generator, as a CPU graph would be. That is sound because device
memory is host-addressable: at run time the compiled host code reads CPU aliases of the
neuron inputs, allocates its buffers in device memory, and its outputs become neuron tensors
without a copy (``_C._call_host_graph``). Autograd, optimizers and users only ever see neuron
tensors.

The static-shape policy of TorchNeuron holds: each input signature compiles once; automatic
dynamic shapes are turned off once a neuron graph is compiled, so a changed shape recompiles
a static graph (and logs one line naming the input and the remedy) instead of a dynamic one;
``dynamic=True`` and compile modes other than "default" are refused with the alternative.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx

from .. import _C
from .cache_trust import make_private_dirs
from .device_only_ops import use_device_only_ops
from .native_attention import use_native_decode_attention, use_widened_attention_backward
from .native_gemm import use_native_gemm
from .neff_cache import (
    INDUCTOR_SUBDIR,
    NeffCache,
    NeffCacheSecurityError,
    NeffCacheWarning,
    cache_dir,
)
from .rewrites import rewrite_silu_mul

log = logging.getLogger("torchneuron.compile")

_NEURON = "neuron"
PAD_ADVICE = (
    "pad or bucket it to a fixed size (for token sequences, a multiple of 128) so that compiled "
    "graphs are reused"
)


class NeuronCompileError(RuntimeError):
    """A graph or a compile option the neuron backend does not accept, with the alternative."""


class _Metrics:
    """Counters of the neuron backend for torch.neuron.get_dynamo_metrics()."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.compiles = 0  # graphs handed to the backend by Dynamo
        self.recompiles = 0  # of those, later compiles of an already compiled frame
        self.host_graphs = 0  # forward/backward/inference graphs lowered to host code
        self.recompile_reasons: list[str] = []
        self.signatures: dict[int, list[list[tuple[str, tuple[int, ...], str]]]] = {}
        # One entry per graph handed to the backend, in order: for
        # torchneuron.fidelity.compile_audit.
        self.graphs: list[dict[str, Any]] = []


metrics = _Metrics()

# Each is called with every forward, backward or inference ATen graph about to be lowered
# (fake values in node.meta["val"]) and its kind, and returns a callable that receives the
# HostGraph it becomes: `python -m torchneuron.fidelity.projection --script` costs the graphs
# a script compiles and counts their calls. Empty unless a tool registers itself.
graph_observers: list[Callable[[torch.fx.GraphModule, str], Callable[[HostGraph], None]]] = []


def _reject_options(kwargs: dict[str, Any]) -> None:
    mode = kwargs.pop("mode", None)
    options = kwargs.pop("options", None)
    if mode not in (None, "default"):
        raise NeuronCompileError(
            f'torch.compile(..., backend="neuron", mode="{mode}") is not supported: neuron '
            'graphs are compiled whole, once per input signature. Use mode="default" (or leave '
            "mode unset)."
        )
    if options:
        raise NeuronCompileError(
            f"torch.compile(..., backend='neuron', options={options!r}) is not supported: the "
            "neuron backend takes no options. Leave options unset, or use backend='inductor' "
            "to pass Inductor options."
        )
    if kwargs:
        raise NeuronCompileError(
            f"unexpected arguments for the neuron backend: {sorted(kwargs)}; it takes none"
        )


def _input_name(node: torch.fx.Node) -> str:
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    return source.name if isinstance(getattr(source, "name", None), str) else node.name


def _reject_dynamic(gm: torch.fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("example_value", node.meta.get("val"))
        sizes = value.shape if isinstance(value, torch.Tensor) else (value,)
        if any(isinstance(s, torch.SymInt) for s in sizes):
            raise NeuronCompileError(
                f"input {_input_name(node)} has a dynamic shape, which the neuron backend does "
                "not compile (Trainium runs static graphs). Compile with dynamic=False (the "
                "default) and no torch._dynamo.mark_dynamic, and " + PAD_ADVICE + "."
            )


def _turn_off_automatic_dynamic() -> None:
    # Dynamo would mark a dimension dynamic on the first recompile it sees change; neuron
    # graphs are static, so from the first neuron compile on a new shape is a new static graph.
    torch._dynamo.config.automatic_dynamic_shapes = False


def _signature(gm: torch.fx.GraphModule) -> list[tuple[str, tuple[int, ...], str]]:
    sig = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            sig.append((_input_name(node), tuple(int(s) for s in value.shape), str(value.dtype)))
    return sig


def _frame_name(gm: torch.fx.GraphModule) -> str:
    """file:line function where the captured code starts, from the first op's stack trace."""
    import re

    for node in gm.graph.nodes:
        trace = node.meta.get("stack_trace")
        if isinstance(trace, str):
            found = re.search(r'File "([^"]+)", line (\d+), in (\S+)', trace)
            if found:
                return f"{os.path.basename(found[1])}:{found[2]} {found[3]}"
    for node in gm.graph.nodes:  # a module's graph may carry only its module stack
        stack = node.meta.get("nn_module_stack")
        if stack:
            _, owner = next(iter(stack.values()))
            return f"{getattr(owner, '__qualname__', owner)}.forward"
    return "?"


def _note_compile(gm: torch.fx.GraphModule) -> None:
    """Counts the compile; on a recompile of a frame, logs the inputs whose shape changed."""
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    signature = _signature(gm)
    with metrics.lock:
        metrics.compiles += 1
        entry: dict[str, Any] = {
            "compile_id": str(compile_id),
            "frame_id": None if compile_id is None else compile_id.frame_id,
            "code": _frame_name(gm),
            "signature": signature,
            "reason": "first compile of this frame",
        }
        metrics.graphs.append(entry)
        if compile_id is None:
            return
        # Dynamo numbers frames from 0 again after torch._dynamo.reset(); its per-frame compile
        # count (0 on a frame's first compile) tells a new frame from a recompile of an old one.
        if compile_id.frame_compile_id == 0:
            metrics.signatures[compile_id.frame_id or 0] = []
        seen = metrics.signatures.setdefault(compile_id.frame_id or 0, [])
        seen.append(signature)
        if len(seen) == 1:
            return
        metrics.recompiles += 1
        # Compare with the latest graph of this frame that had the same inputs: a frame
        # reached with other inputs (another module through the same code) is no shape change.
        names = [name for name, _, _ in signature]
        previous = next((p for p in reversed(seen[:-1]) if [n for n, _, _ in p] == names), None)
        old = {name: shape for name, shape, _ in previous or []}
        changed = [
            f"input {name} changed from shape {old[name]} to {shape}"
            for name, shape, _ in signature
            if name in old and old[name] != shape
        ]
        reason = "; ".join(changed) if changed else "a guard on something other than a shape failed"
        metrics.recompile_reasons.append(reason)
        entry["reason"] = reason
    if not changed:  # another module or a changed Python value: Dynamo's business, not shapes
        log.info("neuron: recompiling %s: %s", compile_id, reason)
        return
    log.warning(
        "neuron: recompiling %s (graph %d of this frame): %s (%s)",
        compile_id,
        len(seen),
        reason,
        PAD_ADVICE,
    )


# --- lowering ATen graphs to host code ---------------------------------------------------


def _to_host_device(value: Any) -> Any:
    if isinstance(value, torch.device) and value.type == _NEURON:
        return torch.device("cpu")
    if isinstance(value, str) and value.split(":")[0] == _NEURON:
        return "cpu"
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host_device(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_host_device(v) for k, v in value.items()}
    return value


def _retarget_to_host(gm: torch.fx.GraphModule) -> None:
    """Rewrites every neuron device argument in the graph (factories, copies) to the host."""
    for node in gm.graph.nodes:
        node.args = _to_host_device(node.args)
        node.kwargs = _to_host_device(node.kwargs)
    gm.recompile()


def _host_example(value: Any, fake_mode: Any) -> Any:
    if not isinstance(value, torch.Tensor) or value.device.type != _NEURON:
        return value
    with fake_mode:
        host = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="cpu")
    return host


def _output_values(gm: torch.fx.GraphModule) -> list[Any]:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = output.args[0]
    values = values if isinstance(values, (list, tuple)) else [values]
    return [v.meta.get("val") if isinstance(v, torch.fx.Node) else v for v in values]


def _graph_device(example_inputs: Sequence[Any]) -> int | None:
    for value in example_inputs:
        if isinstance(value, torch.Tensor) and value.device.type == _NEURON:
            return value.device.index or 0
    return None


class HostGraph:
    """A compiled ATen graph that runs as host code over neuron tensors (boxed calling)."""

    def __init__(
        self, compiled: Any, device: int, device_outputs: list[bool], threads: int
    ) -> None:
        # An instance attribute: AOT Autograd wraps the backward with functools.wraps, which
        # copies the instance's __dict__ (not class attributes) onto the wrapper.
        self._boxed_call = True
        self.compiled = compiled
        self.device = device
        self.device_outputs = device_outputs
        self.threads = threads  # OpenMP threads of the calling thread while the graph runs
        self.calls = 0  # how often the graph ran (the projection's --script counts them)

    def __call__(self, args: list[Any]) -> list[Any]:
        self.calls += 1
        try:
            return _C._call_host_graph(
                self.compiled, args, self.device, self.device_outputs, self.threads
            )
        finally:
            args.clear()  # the boxed convention: inputs are freed as early as possible


_KEY_KWARGS = ("is_inference", "is_backward", "static_input_idxs", "cpp_wrapper")
_cache: NeffCache | None = None
_cache_guard = threading.Lock()


def neff_cache() -> NeffCache:
    """The process's compiled-graph cache, under TORCH_NEURONX_NEFF_CACHE_DIR."""
    global _cache
    with _cache_guard:
        if _cache is None or _cache.root != cache_dir():
            cache = NeffCache()
            cache.check_root()  # refuses a directory others can write, before anything runs
            _keep_inductor_kernels_beside(cache.root)
            _cache = cache
        return _cache


def cache_counters(reset: bool = False) -> dict[str, int]:
    """hits / misses / corrupted of the cache, without creating it (zeros before any compile)."""
    with _cache_guard:
        cache = _cache
    if cache is None:
        return {"hits": 0, "misses": 0, "corrupted": 0}
    counters = {"hits": cache.hits, "misses": cache.misses, "corrupted": cache.corrupted}
    if reset:
        cache.reset_counters()
    return counters


def _keep_inductor_kernels_beside(root: Path) -> None:
    """Inductor's kernel cache (compiled C++ libraries) moves under the neuron cache.

    Then the one directory holds everything a second process needs. Inductor writes its
    default location into the environment the first time it looks, so only that default
    is replaced; a TORCHINDUCTOR_CACHE_DIR the user chose stays.
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or current == default_cache_dir():
        make_private_dirs(root / INDUCTOR_SUBDIR)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / INDUCTOR_SUBDIR)


def _graph_key(
    gm: torch.fx.GraphModule, inputs: Sequence[Any], kwargs: dict[str, Any]
) -> str | None:
    """SHA-256 of what the generated code depends on: graph, input layouts, constants' values,
    versions, ISA. None when a constant's value cannot be read (the graph is then not cached).
    """
    from torch._inductor import config as inductor_config
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    h = hashlib.sha256()

    def add(*parts: object) -> None:
        for part in parts:
            h.update(repr(part).encode())
            h.update(b"\0")

    add("torchneuron-host-graph", 3, torch.__version__, _package_version())
    add(torch.backends.cpu.get_cpu_capability(), str(pick_vec_isa()))
    add(gm.code)
    # The code does not show what a node produces: a custom op's fake implementation decides
    # its output's dtype and layout, and the kernels generated around it depend on them.
    for node in gm.graph.nodes:
        add(node.name, _value_layout(node.meta.get("val")))
    for value in inputs:
        if isinstance(value, torch.Tensor):
            add("tensor", tuple(value.shape), value.stride(), value.dtype, value.device.type)
        else:
            add(type(value).__name__, value)
    # Inductor calls its inner compile inside the graph's FakeTensorMode: reading a real
    # constant's bytes there would make a fake copy of it.
    with unset_fake_temporarily():
        for name, value in sorted(gm.named_buffers()) + sorted(gm.named_parameters()):
            found = _constant_value(value)
            if found is None:
                log.info(
                    "neuron: graph constant %s (%s) has no readable value; the graph is "
                    "compiled but not cached",
                    name,
                    type(value).__name__,
                )
                return None
            kind, data = found
            add(name, kind, tuple(value.shape), value.stride(), value.dtype)
            h.update(data)
    add(sorted((k, repr(kwargs.get(k))) for k in _KEY_KWARGS))
    add(sorted((k, repr(v)) for k, v in inductor_config.save_config_portable().items()))
    return h.hexdigest()


def _value_layout(value: Any) -> object:
    """Shape, strides and dtype of a node's (fake) value, recursively for tuples."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.dtype)
    if isinstance(value, (tuple, list)):
        return tuple(_value_layout(v) for v in value)
    return type(value).__name__


def _plain_constant(value: torch.Tensor) -> torch.Tensor | None:
    """The tensor holding a graph constant's value, unwrapped; None if the value is unknown.

    Fake tensors hold a value only when FakeTensorMode kept the real one (``.constant``);
    functional tensors wrap theirs; wrapper subclasses (DTensor, ...) are defined by inner
    tensors plus metadata this key cannot capture, so they are not cacheable.
    """
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if isinstance(value, FakeTensor):
        return None if value.constant is None else _plain_constant(value.constant)
    if isinstance(value, FunctionalTensor):
        return _plain_constant(value.from_functional())
    if torch._is_functional_tensor(value):
        torch._sync(value)
        return _plain_constant(torch._from_functional_tensor(value))
    if is_traceable_wrapper_subclass(value):
        return None
    return value


def _constant_value(value: torch.Tensor) -> tuple[str, bytes] | None:
    """(type name, row-major bytes) of a graph constant, or None if they cannot be read.

    Any tensor subclass other than the wrappers above is read through a plain view of its
    own data; its type name stays in the key.
    """
    try:
        inner = _plain_constant(value)
        if inner is None:
            return None
        plain_types = (torch.Tensor, torch.nn.Parameter)
        kind = "Tensor" if type(inner) in plain_types else type(inner).__qualname__
        plain = inner.detach().as_subclass(torch.Tensor)
        if plain.layout != torch.strided or plain.is_meta or plain.is_quantized:
            return None
        data = plain.cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
        return kind, data.view(torch.uint8).numpy().tobytes()
    except (RuntimeError, TypeError, NotImplementedError) as error:
        log.debug("neuron: cannot read the bytes of a %s constant: %s", type(value), error)
        return None


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchneuron")
    except PackageNotFoundError:
        return "unknown"


def _constants_to_host(gm: torch.fx.GraphModule) -> None:
    """Tensors the graph holds as attributes become host tensors (the code reads them there)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # Inductor runs this inside the graph's FakeTensorMode; a copy made there would be a fake
    # tensor that has lost the constant's value.
    with unset_fake_temporarily():
        _copy_constants_to_host(gm)


def _copy_constants_to_host(gm: torch.fx.GraphModule) -> None:
    for name, value in list(gm.named_buffers()) + list(gm.named_parameters()):
        if value.device.type == _NEURON:
            owner, _, attr = name.rpartition(".")
            module = gm.get_submodule(owner) if owner else gm
            setattr(
                module,
                attr,
                torch.nn.Parameter(value.cpu(), value.requires_grad)
                if isinstance(value, torch.nn.Parameter)
                else value.cpu(),
            )
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            target = getattr(gm, node.target, None) if "." not in node.target else None
            if isinstance(target, torch.Tensor) and target.device.type == _NEURON:
                setattr(gm, node.target, target.cpu())


def _load_source(source: str) -> Callable[[list[Any]], Any]:
    from torch._inductor.codecache import PyCodeCache

    return PyCodeCache.load(source).call


# Graphs whose products have at least this many rows (training and prefill steps, diffusion
# blocks) run on the device's core budget; graphs of GEMV-sized products (decode steps) on the
# worker's count (one on a 2-CPU host): an OpenMP team beside the worker that shares their GEMVs
# made a 100M Llama's compiled decode 1.5-1.8x slower (benchmarks/hf_generate.py --compiled,
# Ice Lake host).
# A graph without products counts by its largest value.
_BUDGET_FROM_ROWS = 64
_BUDGET_FROM_ELEMENTS = 1 << 18


def _product_targets() -> set[object]:
    aten, native = torch.ops.aten, torch.ops.torchneuron
    return {
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        native.native_mm.default,
        native.native_addmm.default,
        native.native_bmm.default,
    }


def _graph_threads(gm: torch.fx.GraphModule) -> int:
    """The OpenMP threads a graph's code is generated for and runs with."""
    products = _product_targets()
    rows, largest = -1, 0
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        largest = max(largest, value.numel())
        if node.op == "call_function" and node.target in products and value.dim() >= 2:
            rows = max(rows, int(value.shape[-2]))
    large = rows >= _BUDGET_FROM_ROWS if rows >= 0 else largest >= _BUDGET_FROM_ELEMENTS
    if large:
        return int(_C._compiled_graph_threads())  # compiled_graph_threads in aten_parallel.h
    return int(_C._small_compiled_graph_threads())


def _compile_host_graph(
    gm: torch.fx.GraphModule, host_inputs: list[Any], kwargs: dict[str, Any]
) -> Callable[[list[Any]], Any]:
    """The graph's host code: from the cache if a whole entry is there, else compiled."""
    from torch._inductor.compile_fx import compile_fx_inner

    cache = neff_cache()
    key = _graph_key(gm, host_inputs, kwargs)
    if key is None:  # a constant whose value the key cannot hold: compile, keep nothing
        with torch._inductor.config.patch(fx_graph_cache=False):
            return compile_fx_inner(gm, host_inputs, **kwargs)
    with cache.lock(key):
        payload = cache.get(key)
        if payload is not None:
            try:
                return _load_source(payload.decode())
            except Exception as error:  # a whole entry whose code no longer loads here
                warnings.warn(
                    f"neuron compile cache: entry {cache.path_for(key)} does not load "
                    f"({type(error).__name__}: {error}); compiling again",
                    NeffCacheWarning,
                    stacklevel=2,
                )
        # Our cache decides reuse: Inductor's graph cache would answer first otherwise.
        with torch._inductor.config.patch(fx_graph_cache=False):
            compiled = compile_fx_inner(gm, host_inputs, **kwargs)
        source = getattr(compiled, "source_code", None)
        holds_values = any(
            getattr(compiled, name, None)
            for name in (
                "constants",
                "frozen_param_names",
                "torchbind_constants",
                "opaque_value_type_classes",
            )
        )
        if isinstance(source, str) and not holds_values:  # the source alone reproduces it
            try:
                cache.put(key, source.encode())
            except NeffCacheSecurityError:
                raise
            except OSError as error:
                warnings.warn(
                    f"neuron compile cache: cannot write under {cache.root} ({error}); the "
                    "graph is compiled but will be compiled again in the next process",
                    NeffCacheWarning,
                    stacklevel=2,
                )
        return compiled


def _inner_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """Inductor's per-graph compile step, for an ATen graph on a neuron device."""
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import compile_fx_inner
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    device = _graph_device(example_inputs)
    if device is None:  # a graph with no neuron inputs (e.g. only CPU tensors): plain Inductor
        return compile_fx_inner(gm, example_inputs, **kwargs)
    kind = "backward" if kwargs.get("is_backward") else "forward"
    if kwargs.get("is_inference"):
        kind = "inference"
    attach = [observe(gm, kind) for observe in list(graph_observers)]
    device_outputs = [
        isinstance(v, torch.Tensor) and v.device.type == _NEURON for v in _output_values(gm)
    ]
    fake_mode = detect_fake_mode(example_inputs)
    host_inputs = [_host_example(v, fake_mode) for v in example_inputs]
    _retarget_to_host(gm)
    _constants_to_host(gm)
    FakeTensorProp(gm, mode=fake_mode).propagate_dont_convert_inputs(*host_inputs)
    use_native_gemm(gm)  # matmuls: the native GEMM instead of the CPU's
    use_native_decode_attention(gm)  # decode attention: the native kernel (native_attention.py)
    use_widened_attention_backward(gm)  # bf16 attention backward: float32 where bf16 is emulated
    use_device_only_ops(gm)  # efficient/flash/varlen attention: neuron's, on the host
    threads = _graph_threads(gm)
    # The graph's parallel loops name their thread count; the cache key holds it (config).
    with torch._inductor.config.patch({"cpp.threads": threads}):
        compiled = _compile_host_graph(gm, host_inputs, kwargs)
    with metrics.lock:
        metrics.host_graphs += 1
    host_graph = HostGraph(compiled, device, device_outputs, threads)
    for observed in attach:
        observed(host_graph)
    return host_graph


def neuron_backend(
    graph_module: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any
) -> Callable[..., Any]:
    """Dynamo backend: compiles the captured graph to host code over neuron memory."""
    from torch._inductor.compile_fx import compile_fx

    _reject_options(dict(kwargs))
    _reject_dynamic(graph_module)
    _turn_off_automatic_dynamic()
    _note_compile(graph_module)
    rewrite_silu_mul(graph_module)  # silu(a) * b -> our kernel (compile_rewrites.py)
    neff_cache()  # fixes where Inductor's kernel cache goes before anything is compiled
    # AOT Autograd's own cache would hand back graphs compiled in an earlier process without
    # asking ours; the neuron cache is the one that checks entries.
    with torch._functorch.config.patch(enable_autograd_cache=False):
        return compile_fx(graph_module, example_inputs, inner_compile=_inner_compile)
