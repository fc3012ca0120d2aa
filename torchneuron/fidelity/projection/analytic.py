"""Training step time and inference latency of a decoder or encoder transformer on a Trainium
or Inferentia2 instance, from its shape and layout, in closed form.

Each layer's forward costs its projections on the Tensor engine (at the efficiency of their
128-row tiles), attention (QK^T and AV on the Tensor engine, exp on the Scalar engine, max
and sum on the Vector engine; without a flash kernel every score, spilled through HBM when
the scores outgrow the SBUF), its elementwise work on the Vector engine, a fixed overhead,
and tensor parallelism's collectives (rings over NeuronLink: bandwidth term and a fixed cost
per collective). Backward is twice the forward's compute, its TP collectives overlapped with
the weight-gradient matmuls; activation checkpointing adds the forward again (full) or
attention again (selective). Pipeline parallelism runs microbatches through stages with the
1F1B bubble (S - 1 extra microbatch slots); data parallelism adds the gradient reduce-scatter
and parameter all-gather (ZeRO-1) or all-reduce once per step, over NeuronLink inside an
instance and EFA across, behind the last microbatch's backward where the step is one graph;
the optimizer step reads and writes its state at HBM bandwidth. Context parallelism splits
the sequence over cp ranks (load-balanced causal ring attention, key/value blocks passed round
the ring behind the block computations); FSDP (ZeRO-3) gathers each layer's parameters before
its forward and backward and reduce-scatters its gradients, each layer's collectives behind
the previous layer's compute; expert parallelism sends a mixture of experts' tokens to their
experts' ranks and back, four all-to-alls a layer. Decode is the larger of its
matmul time and the time to read the weights and the KV cache of its token-generation bucket
from HBM.

Five constants are calibrated against AWS's published figures (`CALIBRATION`, fitted by
``python -m torchneuron.fidelity.projection.published --calibrate``); every other figure is
from AWS's documentation (hardware.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .hardware import Instance
from .shapes import Shape


@dataclass(frozen=True)
class Calibration:
    """Fitted on part of AWS's published figures (published.py: CALIBRATION_MODELS); the
    defaults are the fit's result, rounded to three digits."""

    matmul_efficiency: float = 0.394  # of TensorE peak, on full 128x128 tiles
    link_efficiency: float = 0.272  # of NeuronLink / EFA bandwidth a collective reaches
    hbm_efficiency: float = 0.784  # of HBM bandwidth a decode step's reads reach
    layer_overhead_s: float = 153e-6  # per layer and pass: instruction issue, synchronisation
    collective_overhead_s: float = 0.970e-6  # per collective beyond its hops


CALIBRATION = Calibration()


@dataclass(frozen=True)
class TrainingLayout:
    """How a training run is laid out (the fields of AWS's published training figures)."""

    instance: Instance
    nodes: int
    seq: int
    micro_batch: int
    global_batch: int
    tp: int = 1
    pp: int = 1
    dp: int = 1
    sequence_parallel: bool = False
    zero1: bool = False
    cp: int = 1  # context parallelism: the sequence split over cp ranks
    ep: int = 1  # expert parallelism: a mixture of experts' experts over ep of the dp x cp ranks
    fsdp: bool = False  # ZeRO-3 over the dp x cp ranks: parameters, gradients, optimizer state
    checkpointing: str = "none"  # "none", "selective" or "full"
    precision: str = "bf16"  # "bf16" (bf16 weights), "mixed" (bf16 compute, fp32 master), "fp32"
    flash_attention: bool = True  # False: scores materialised (see _layer_forward)

    def __post_init__(self) -> None:
        for name in ("nodes", "seq", "micro_batch", "global_batch", "tp", "pp", "dp", "cp", "ep"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        cores = self.instance.cores * self.nodes
        used = self.tp * self.pp * self.dp * self.cp
        # One instance may be used in part; several instances are used whole.
        if used > cores or (self.nodes > 1 and used != cores):
            cp = f" x cp {self.cp}" if self.cp > 1 else ""
            raise ValueError(
                f"tp {self.tp} x pp {self.pp} x dp {self.dp}{cp} = {used} cores does not lay out "
                f"on {self.nodes} x {self.instance.name} ({self.instance.cores} cores each): use "
                f"{cores} cores{'' if self.nodes > 1 else ' or fewer'}"
            )
        if self.tp * self.cp > self.instance.cores:
            raise ValueError(
                f"tp {self.tp} x cp {self.cp} is more than the {self.instance.cores} cores of "
                f"{self.instance.name}: the model passes the ring's blocks over NeuronLink"
            )
        if self.seq % self.cp:
            raise ValueError(f"sequence {self.seq} does not split into cp {self.cp} shards")
        if self.fsdp and self.zero1:
            raise ValueError("fsdp shards the optimizer state already (ZeRO-3): drop zero1")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(
                f"ep {self.ep} does not divide dp {self.dp} x cp {self.cp}: expert-parallel "
                "groups are made of data-parallel ranks"
            )
        if self.ep > 1 and self.ep > self.instance.cores // (self.tp * self.pp):
            raise ValueError(
                f"ep {self.ep} x tp {self.tp} x pp {self.pp} is more than the "
                f"{self.instance.cores} cores of {self.instance.name}: the model sends the "
                "experts' all-to-alls over NeuronLink"
            )
        if self.global_batch % (self.dp * self.micro_batch):
            raise ValueError(
                f"global batch {self.global_batch} is not a multiple of dp {self.dp} x "
                f"micro-batch {self.micro_batch}"
            )
        if self.checkpointing not in ("none", "selective", "full"):
            raise ValueError(f"checkpointing {self.checkpointing!r}: none, selective or full")
        if self.precision not in ("bf16", "mixed", "fp32"):
            raise ValueError(f"precision {self.precision!r}: bf16, mixed or fp32")

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)


@dataclass(frozen=True)
class InferenceRequest:
    instance: Instance
    tp: int
    batch: int
    input_len: int
    output_len: int
    weight_bytes: int = 2  # bf16; 1 for int8 weights
    flash_attention: bool = True  # False: the prefill's scores are materialised
    # True: KV heads tp does not divide are replicated to one per query head, as
    # transformers-neuronx did up to SDK 2.18 (Shape.as_multi_head); False: NxD Inference
    kv_heads_as_query_heads: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "batch", "input_len", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tp > self.instance.cores:
            raise ValueError(
                f"tp {self.tp} is more than the {self.instance.cores} cores of {self.instance.name}"
            )
        if self.weight_bytes not in (1, 2):
            raise ValueError(f"weight_bytes {self.weight_bytes}: 2 (bf16) or 1 (int8)")


@dataclass
class Breakdown:
    """Seconds by kind, for the report."""

    parts: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.parts[name] = self.parts.get(name, 0.0) + seconds

    def scaled(self, factor: float) -> Breakdown:
        return Breakdown({k: v * factor for k, v in self.parts.items()})

    def merged(self, other: Breakdown) -> Breakdown:
        out = Breakdown(dict(self.parts))
        for k, v in other.parts.items():
            out.add(k, v)
        return out

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def tile_efficiency(*dims: int) -> float:
    """The share of the 128x128 array a matmul keeps busy when these dims are cut into tiles."""
    return math.prod(d / (128 * math.ceil(d / 128)) for d in dims)


def collective_phase_seconds(
    size: float, ranks: int, bandwidth: float, hop: float, cal: Calibration
) -> float:
    """One phase (reduce-scatter or all-gather) of `size` bytes over `ranks` ranks inside an
    instance. The bandwidth term is a ring's; the latency term follows the algorithm the
    runtime picks by size: Mesh (one step) below 1 MB, recursive doubling/halving (log2 steps)
    to 56 MB, a ring (ranks - 1 steps) above
    (neuron-runtime/explore/intranode-collective-comm.rst:160-189)."""
    if ranks <= 1:
        return 0.0
    if size < 1 << 20:
        steps = 1
    elif size < 56 << 20:
        steps = math.ceil(math.log2(ranks))
    else:
        steps = ranks - 1
    return (
        (ranks - 1) / ranks * size / (bandwidth * cal.link_efficiency)
        + steps * hop
        + cal.collective_overhead_s
    )


def data_parallel_seconds(grad_bytes: float, layout: TrainingLayout, cal: Calibration) -> float:
    """Gradient reduce-scatter and parameter all-gather (or an all-reduce: the same traffic)
    over the ranks holding the same weights (dp x cp), hierarchically: among those inside an
    instance over NeuronLink, then among instances over EFA, which every rank of an instance
    shares."""
    inst, dp = layout.instance, layout.dp * layout.cp  # cp ranks hold the same weights
    per_replica = layout.tp * layout.pp
    local = max(1, min(dp, inst.cores // per_replica))  # dp ranks inside one instance
    across = dp // local
    seconds = 2 * collective_phase_seconds(
        grad_bytes, local, inst.link_bytes_per_s, inst.hop_latency_s, cal
    )
    if across > 1:
        ranks_per_instance = min(inst.cores, per_replica * dp // layout.nodes)
        traffic = ranks_per_instance * (across - 1) / across * grad_bytes / local
        seconds += 2 * (
            traffic / (inst.network_bytes_per_s * cal.link_efficiency)
            + math.ceil(math.log2(across)) * inst.network_latency_s
            + cal.collective_overhead_s
        )
    return seconds


def _layer_forward(
    shape: Shape,
    inst: Instance,
    batch: int,
    queries: int,
    keys: int,
    tp: int,
    sequence_parallel: bool,
    cal: Calibration,
    flash: bool = True,
    cp: int = 1,
) -> tuple[Breakdown, float]:
    """(compute by kind, attention's share) of one layer's forward on one TP rank (of `cp`
    context-parallel ranks, each holding queries / cp tokens and, load-balanced, 1 / cp of
    the attention's score blocks). Matmuls
    run at the BF16 rate whatever the model's dtype: "By default, the Neuron Compiler will
    automatically cast FP32 matrix multiplication operations to BF16" (AWS, "Mixed Precision
    and Performance-accuracy Tuning (neuronx-cc)").

    Without a flash kernel (`flash` False) attention materialises its scores: every score is
    computed and masked, and when the layer's FP32 scores (TensorE writes FP32,
    nki/guides/architecture/trainium_inferentia2_arch.rst:103-105) outgrow the SBUF they pass
    through HBM: the scores written and read back for the softmax, the BF16 probabilities
    written and read back for AV (12 bytes a score), at the HBM efficiency of decode's reads.
    The softmax then runs at the slower of its engines and that traffic (DMA runs beside the
    engines, same file :589-590)."""
    peak = inst.matmul_bf16_flops * cal.matmul_efficiency
    tokens = batch * queries / cp
    tiles = tile_efficiency(shape.hidden, shape.hidden // tp, shape.ffn // tp)
    out = Breakdown()
    out.add("matmul", shape.layer_matmul_flops(tokens, tp) / (peak * tiles))
    flops = shape.layer_attention_flops(batch, queries, keys, tp, flash) / cp
    attention = flops / (peak * tile_efficiency(shape.head_dim))
    scores = flops / (4 * shape.head_dim)
    softmax = scores / inst.scalar_elements_per_s + 2 * scores / inst.vector_elements_per_s
    if not flash and scores * 4 > inst.sbuf_bytes:
        softmax = max(softmax, scores * 12 / (inst.hbm_bytes_per_s * cal.hbm_efficiency))
    out.add("attention", attention + softmax)
    out.add(
        "vector",
        shape.layer_elementwise(tokens, tp, sequence_parallel) / inst.vector_elements_per_s,
    )
    out.add("overhead", cal.layer_overhead_s)
    return out, attention + softmax


def _tp_collectives(
    shape: Shape, inst: Instance, tokens: int, tp: int, element: int, cal: Calibration
) -> float:
    """Tensor parallelism's forward collectives in one layer: with or without sequence
    parallelism, four ring phases of the layer's hidden states (two all-gathers and two
    reduce-scatters, or two all-reduces)."""
    size = tokens * shape.hidden * element
    return 4 * collective_phase_seconds(size, tp, inst.link_bytes_per_s, inst.hop_latency_s, cal)


def context_exchange_seconds(
    shape: Shape, layout: TrainingLayout, element: int, cal: Calibration
) -> float:
    """One layer's forward ring of context parallelism: cp - 1 steps, each passing a rank's
    key and value blocks (seq / cp tokens of its KV heads) to the next rank over NeuronLink."""
    if layout.cp <= 1:
        return 0.0
    inst = layout.instance
    block = (
        layout.micro_batch * layout.seq / layout.cp
        * 2 * shape.kv_heads_per_rank(layout.tp) * shape.head_dim * element
    )  # fmt: skip
    step = block / (inst.link_bytes_per_s * cal.link_efficiency) + inst.hop_latency_s
    return (layout.cp - 1) * (step + cal.collective_overhead_s)


def expert_all_to_all_seconds(
    shape: Shape, layout: TrainingLayout, element: int, cal: Calibration
) -> float:
    """One all-to-all of a mixture-of-experts layer over the ep ranks: each of the rank's
    tokens (seq / cp a sequence) goes to its top-k experts, (ep - 1) / ep of them on other
    ranks, as a hidden-sized vector (tokens routed evenly, no capacity padding)."""
    if layout.ep <= 1:
        return 0.0
    inst = layout.instance
    tokens = layout.micro_batch * layout.seq / layout.cp
    size = tokens * shape.experts_per_token * shape.hidden * element
    return collective_phase_seconds(size, layout.ep, inst.link_bytes_per_s, inst.hop_latency_s, cal)


def fsdp_layer_seconds(
    shape: Shape, layout: TrainingLayout, cal: Calibration
) -> tuple[float, float]:
    """(all-gather, reduce-scatter) seconds of one layer's FSDP collectives over the dp x cp
    ranks (hierarchical, as data_parallel_seconds): its parameters gathered in the compute dtype
    (BF16 unless fp32), its gradients reduce-scattered in the master weights' (FP32 unless
    bf16)."""
    weights = shape.layer_weights_per_rank(layout.tp, layout.ep)
    gather = 4 if layout.precision == "fp32" else 2
    reduce = 2 if layout.precision == "bf16" else 4
    # data_parallel_seconds is two phases (reduce-scatter and all-gather) of its bytes
    return (
        data_parallel_seconds(weights * gather, layout, cal) / 2,
        data_parallel_seconds(weights * reduce, layout, cal) / 2,
    )


def training_step(
    shape: Shape, layout: TrainingLayout, cal: Calibration = CALIBRATION
) -> Breakdown:
    """Seconds of one optimizer step (all microbatches of the global batch), by kind."""
    inst, tp, pp, dp = layout.instance, layout.tp, layout.pp, layout.dp
    if layout.ep > 1 and not shape.moe:
        raise ValueError(f"ep {layout.ep}: expert parallelism needs a mixture-of-experts model")
    if shape.moe and shape.experts % layout.ep:
        raise ValueError(f"ep {layout.ep} does not divide the model's {shape.experts} experts")
    fp32 = layout.precision == "fp32"
    element = 4 if fp32 else 2
    b, s, cp = layout.micro_batch, layout.seq, layout.cp
    forward, attention = _layer_forward(
        shape, inst, b, s, s, tp, layout.sequence_parallel, cal, layout.flash_attention, cp
    )
    comms = _tp_collectives(shape, inst, b * s // cp, tp, element, cal)
    layer = forward.scaled(3.0)  # forward, and a backward of twice its work
    # The forward's collectives sit between dependent matmuls: exposed. In the backward each
    # linear layer's input gradient and weight gradient are independent matmuls, so the
    # collective on the input gradient runs while the weight gradient (as much Tensor-engine
    # work as the forward's projections) is computed; only what outlasts it is exposed.
    layer.add("tp collectives", comms + max(0.0, comms - forward.parts["matmul"]))
    # Context parallelism: each ring step's blocks travel while the blocks already held are
    # computed, so only what outlasts the attention is exposed; the backward passes keys,
    # values and their gradients (twice the bytes) beside twice the work.
    ring = context_exchange_seconds(shape, layout, element, cal)
    layer.add("cp exchange", max(0.0, ring - attention) + max(0.0, 2 * ring - 2 * attention))
    # Expert parallelism: tokens to their experts' ranks and back (dispatch and combine), in
    # the forward and, as gradients, in the backward; each sits between the router and the
    # experts or the experts and the next layer, so all four are exposed.
    all_to_all = expert_all_to_all_seconds(shape, layout, element, cal)
    layer.add("ep all-to-all", 4 * all_to_all)
    if layout.checkpointing == "full":
        layer = layer.merged(forward)
        layer.add("tp collectives", comms)
        layer.add("cp exchange", max(0.0, ring - attention))
        layer.add("ep all-to-all", 2 * all_to_all)
    elif layout.checkpointing == "selective":
        layer.add("attention", attention)
        layer.add("cp exchange", max(0.0, ring - attention))
    sharded = layout.fsdp and dp * cp > 1  # FSDP's mesh holds the cp ranks too (TorchTitan)
    gather, scatter = fsdp_layer_seconds(shape, layout, cal) if sharded else (0.0, 0.0)
    if sharded:
        # FSDP2 prefetches: a layer's all-gather runs during the previous layer's forward, its
        # gradients' reduce-scatter and the next all-gather during the following layer's
        # backward; per microbatch, since gradients are reduced after each backward.
        compute = forward.total
        layer.add("fsdp collectives", max(0.0, gather - compute))
        layer.add("fsdp collectives", max(0.0, gather + scatter - 2 * compute))
    layers_per_stage = math.ceil(shape.layers / pp)
    stage = layer.scaled(layers_per_stage)
    peak = inst.matmul_bf16_flops * cal.matmul_efficiency
    stage.add("matmul", 3 * shape.head_flops(b * s // cp, tp) / peak)  # on the last stage
    if pp > 1:  # activations to the next stage and gradients back, per microbatch
        shard = b * s // cp * shape.hidden * element / (tp if layout.sequence_parallel else 1)
        stage.add("pp transfers", 2 * shard / inst.link_bytes_per_s + 2 * inst.hop_latency_s)
    if sharded:
        # the first layer's gather of each pass, and the last reduce-scatter, have nothing
        # before or after them to hide behind
        stage.add("fsdp collectives", 2 * gather + scatter)
    step = stage.scaled(layout.microbatches + pp - 1)  # 1F1B: S - 1 slots of bubble

    # each rank holds its ep-th of the experts
    held = shape.parameters() - shape.expert_parameters() * (1 - 1 / layout.ep)
    params_per_rank = held / (tp * pp)
    grad_bytes = params_per_rank * (2 if layout.precision == "bf16" else 4)
    if dp * cp > 1 and not layout.fsdp:
        sync = data_parallel_seconds(grad_bytes, layout, cal)
        if tp * pp > 1:
            # Model-parallel runs (NxD, NeMo) trace the step as one graph, so the last
            # microbatch's backward and the gradient reduction are scheduled together: each
            # layer's gradients are reduced once final, behind the backward of the layers
            # before it; the last layer's (one bucket of 1 / layers_per_stage) cannot be.
            last_backward = 2 / 3 * (stage.total - stage.parts.get("pp transfers", 0.0))
            sync = max(sync - last_backward, sync / layers_per_stage)
        # Pure data parallelism is the BERT example, whose loader marks a step per microbatch
        # and whose "Allreduce occurs before optimizer step, after gradient accumulations"
        # (frameworks/torch/torch-neuronx/tutorials/training/bert.rst:20,120): all exposed.
        step.add("dp collectives", sync)
    # AdamW/LAMB: read parameter, gradient and two moments, write parameter and moments (fp32
    # master copies under "mixed" and "fp32", plus the bf16 copy under "mixed").
    state_bytes = {"bf16": 2 * 7, "mixed": 4 * 7 + 2, "fp32": 4 * 7}[layout.precision]
    shard = params_per_rank / (dp * cp if layout.fsdp else dp if layout.zero1 else 1)
    step.add("optimizer", shard * state_bytes / inst.hbm_bytes_per_s)
    return step


@dataclass(frozen=True)
class InferenceEstimate:
    ttft: float  # seconds to the first token (prefill)
    tpot: float  # seconds per output token after it (decode)
    batch: int
    output_len: int

    @property
    def output_tokens_per_s(self) -> float:
        return self.batch * self.output_len / (self.ttft + (self.output_len - 1) * self.tpot)


def mean_attended_length(input_len: int, output_len: int) -> float:
    """The KV-cache length a decode step attends to, averaged over the output: each step runs
    the graph of its token-generation bucket, the smallest power of two from 128 at or above
    its position, the last bucket being the sequence length
    (archive/transformers-neuronx/transformers-neuronx-developer-guide.rst:1075-1091), so it
    reads the bucket's KV cache, not only the positions filled."""
    total_len = input_len + output_len
    attended, position = 0.0, input_len
    while position < total_len:
        bucket = min(total_len, max(128, 1 << math.ceil(math.log2(position + 1))))
        attended += (bucket - position) * bucket
        position = bucket
    return attended / output_len


def inference(
    shape: Shape, request: InferenceRequest, cal: Calibration = CALIBRATION
) -> InferenceEstimate:
    """Prefill of the prompt, then decode steps at the mean context length."""
    inst, tp, b = request.instance, request.tp, request.batch
    if request.kv_heads_as_query_heads and shape.kv_heads % tp:
        shape = shape.as_multi_head()
    prefill, _ = _layer_forward(
        shape, inst, b, request.input_len, request.input_len, tp, True, cal,
        request.flash_attention,
    )  # fmt: skip
    prefill_layer = prefill.total + _tp_collectives(shape, inst, b * request.input_len, tp, 2, cal)
    weight_read = shape.head_flops(1, tp) / 2 * request.weight_bytes
    head_seconds = weight_read / (inst.hbm_bytes_per_s * cal.hbm_efficiency)
    ttft = shape.layers * prefill_layer + head_seconds

    context = mean_attended_length(request.input_len, request.output_len)
    weights = shape.layer_decode_weights_per_rank(tp, b) * request.weight_bytes
    kv = b * context * 2 * shape.kv_heads_per_rank(tp) * shape.head_dim * 2
    memory = (weights + kv) / (inst.hbm_bytes_per_s * cal.hbm_efficiency)
    decode, _ = _layer_forward(shape, inst, b, 1, int(context), tp, False, cal)
    compute = decode.total - cal.layer_overhead_s
    comms = _tp_collectives(shape, inst, b, tp, 2, cal)
    tpot = shape.layers * (max(memory, compute) + cal.layer_overhead_s + comms) + head_seconds
    return InferenceEstimate(ttft, tpot, b, request.output_len)
