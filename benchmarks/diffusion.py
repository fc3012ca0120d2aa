"""Seconds per denoising step of FLUX.1 and Qwen-Image transformers: neuron against the CPU.

One denoising step is one forward of the transformer (no_grad, batch 1), which is where a
diffusion pipeline spends its time. Both transformers are built from configs (no download)
at a small but real width: 256 channels (4 heads of 64), 64 text tokens, 64 latent channels
per token; FLUX.1 has 1 double-stream and 2 single-stream blocks, Qwen-Image 2 blocks. Two
image sizes: 256x256 and 512x512 pixels (256 and 1024 image tokens after the VAE's 8x and
the 2x2 patching). Each in float32 and in bfloat16 (the model cast, as pipelines run with
``torch_dtype=torch.bfloat16``), four ways:

- CPU eager and neuron eager: ratio = CPU time / neuron time;
- CPU compiled by Inductor (``torch.compile(model)``) and neuron compiled
  (``torch.compile(model, backend="neuron")``): ratio = Inductor time / neuron time.

Target >= 1.0 per ratio (issue 12). Both devices run one intra-op thread (--threads),
alternate in blocks and report medians (_harness.py); graphs compile (``dynamic=False``,
one per size) before timing.

    python benchmarks/diffusion.py              # full run
    python benchmarks/diffusion.py --quick      # fewer rounds
    python benchmarks/diffusion.py --markdown   # also print the table as Markdown
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import dataclass

import torch
from _harness import Table, calibrate, fmt, gc_paused, interleaved, parse_and_start, print_table

TARGET = 1.0
WIDTH, HEADS, TEXT_TOKENS, LATENT_CHANNELS = 256, 4, 64, 64
SIZES = (256, 512)  # pixels; image tokens = (size / 16) ** 2
DTYPES = (torch.float32, torch.bfloat16)


def flux(dtype: torch.dtype) -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    head_dim = WIDTH // HEADS
    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=LATENT_CHANNELS,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=head_dim,
        num_attention_heads=HEADS,
        joint_attention_dim=WIDTH,
        pooled_projection_dim=WIDTH,
        axes_dims_rope=[head_dim // 4, 3 * head_dim // 8, 3 * head_dim // 8],
    )
    return model.to(dtype).eval()


def flux_inputs(size: int, dtype: torch.dtype) -> dict[str, object]:
    side = size // 16
    g = torch.Generator().manual_seed(1)
    img_ids = torch.zeros(side, side, 3)
    img_ids[..., 1] = torch.arange(side)[:, None]
    img_ids[..., 2] = torch.arange(side)[None, :]
    return {
        "hidden_states": torch.randn(1, side * side, LATENT_CHANNELS, generator=g, dtype=dtype),
        "encoder_hidden_states": torch.randn(1, TEXT_TOKENS, WIDTH, generator=g, dtype=dtype),
        "pooled_projections": torch.randn(1, WIDTH, generator=g, dtype=dtype),
        "timestep": torch.tensor([0.5], dtype=dtype),
        "img_ids": img_ids.reshape(-1, 3),
        "txt_ids": torch.zeros(TEXT_TOKENS, 3),
        "return_dict": False,
    }


def qwenimage(dtype: torch.dtype) -> torch.nn.Module:
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    head_dim = WIDTH // HEADS
    model = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS // 4,
        num_layers=2,
        attention_head_dim=head_dim,
        num_attention_heads=HEADS,
        joint_attention_dim=WIDTH,
        axes_dims_rope=(head_dim // 4, 3 * head_dim // 8, 3 * head_dim // 8),
    )
    return model.to(dtype).eval()


def qwenimage_inputs(size: int, dtype: torch.dtype) -> dict[str, object]:
    side = size // 16
    g = torch.Generator().manual_seed(1)
    return {
        "hidden_states": torch.randn(1, side * side, LATENT_CHANNELS, generator=g, dtype=dtype),
        "encoder_hidden_states": torch.randn(1, TEXT_TOKENS, WIDTH, generator=g, dtype=dtype),
        "encoder_hidden_states_mask": torch.ones(1, TEXT_TOKENS, dtype=torch.long),
        "timestep": torch.tensor([0.5], dtype=dtype),
        "img_shapes": [(1, side, side)],
        "return_dict": False,
    }


MODELS: dict[str, tuple[Callable[..., torch.nn.Module], Callable[..., dict[str, object]]]] = {
    "FLUX.1": (flux, flux_inputs),
    "Qwen-Image": (qwenimage, qwenimage_inputs),
}


def on(device: str, inputs: dict[str, object]) -> dict[str, object]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def step(model: Callable[..., object], inputs: dict[str, object]) -> Callable[[], object]:
    def run() -> object:
        with torch.no_grad():
            return model(**inputs)

    return run


@dataclass
class Row:
    model: str
    size: int
    dtype: torch.dtype
    pair: str
    base_s: float
    neuron_s: float
    doubt: str | None = None  # why the pair is not a measurement (harness.Medians.doubt)

    @property
    def ratio(self) -> float:
        return self.base_s / self.neuron_s

    @property
    def verdict(self) -> str:
        if self.doubt:
            return "unstable"
        return f">= {TARGET} " + ("pass" if self.ratio >= TARGET else "MISS")


def measure(quick: bool) -> list[Row]:
    rows: list[Row] = []
    for name, (build, make_inputs) in MODELS.items():
        for dtype in DTYPES:
            cpu, neuron = build(dtype), build(dtype).to("neuron")
            compiled_cpu = torch.compile(cpu, dynamic=False)
            compiled_neuron = torch.compile(neuron, backend="neuron", dynamic=False)
            for size in SIZES:
                inputs = make_inputs(size, dtype)
                fns = {
                    "cpu eager": step(cpu, inputs),
                    "neuron eager": step(neuron, on("neuron", inputs)),
                    "cpu inductor": step(compiled_cpu, inputs),
                    "neuron compiled": step(compiled_neuron, on("neuron", inputs)),
                }
                label = f"{name} {size}px {str(dtype).removeprefix('torch.')}"
                print(f"{label}: compiling (Inductor CPU, neuron) ...", flush=True)
                for fn in fns.values():
                    fn()
                iterations = calibrate(fns["cpu eager"], "cpu", 0.1 if quick else 0.3)
                rounds = 3 if quick else 7
                with gc_paused():
                    t = interleaved(fns, iterations, rounds)
                for pair, base, dev in (
                    ("eager", "cpu eager", "neuron eager"),
                    ("compiled", "cpu inductor", "neuron compiled"),
                ):
                    doubt = t.doubt(base) or t.doubt(dev)
                    rows.append(Row(name, size, dtype, pair, t[base], t[dev], doubt))
            torch._dynamo.reset()
            del cpu, neuron, compiled_cpu, compiled_neuron, fns
            torch.neuron.empty_cache()
    return rows


def table(rows: list[Row]) -> Table:
    header = ["model", "image", "dtype", "pair", "CPU s/step", "neuron s/step", "ratio", "target"]
    body = [
        [
            r.model,
            f"{r.size}px",
            str(r.dtype).removeprefix("torch."),
            "neuron eager vs CPU eager" if r.pair == "eager" else "neuron compiled vs Inductor",
            fmt(r.base_s),
            fmt(r.neuron_s),
            "unstable" if r.doubt else f"{r.ratio:.3f}",
            r.verdict,
        ]
        for r in rows
    ]
    return Table(header, body)


def cpu_model() -> str:
    """The host CPU's model name (Linux), for the banner."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    args = parse_and_start(__doc__.split("\n")[0], "fewer rounds", argv)
    if args is None:
        return 1
    print(f"CPU: {cpu_model()}, ISA used by PyTorch: {torch.backends.cpu.get_cpu_capability()}")
    rows = measure(args.quick)
    print_table(table(rows), args.markdown)
    measured = [r for r in rows if not r.doubt]
    passed = sum(r.ratio >= TARGET for r in measured)
    print(f"\n{passed}/{len(measured)} ratios >= {TARGET}", end="")
    print(
        f" ({len(rows) - len(measured)} not measured: unstable)"
        if len(measured) < len(rows)
        else ""
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
