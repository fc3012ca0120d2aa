"""Decode attention: neuron's native kernel vs CPU eager F.scaled_dot_product_attention.

One decode step of a ~1B Llama's attention layer (32 query heads, 8 kv heads, head_dim 64)
against a KV cache of 512, 2048 and 4096 positions, batch 1, float32 and bfloat16, on 1 and 2
intra-op threads. Both sides run F.scaled_dot_product_attention on the same inputs (CPU
tensors vs neuron tensors); blocks alternate and medians are compared. Three cases:

  gqa      enable_gqa=True, no mask: the whole cache is read (8 kv heads).
  hf       what Hugging Face's static cache gives: K/V expanded to 32 heads (repeat_kv, done
           once outside the timing) and an additive mask hiding the unused half of the cache.
  rows=N   as gqa with N = 2, 4, 8 query rows (speculative or chunked decode; 8 is the
           native kernel's limit, longer queries run the CPU kernel).

Each call reads a different copy of K/V (copies spanning 128 MiB, 4x this host's L3), so the
cache is read from memory as in a model, where 16-32 layers' caches pass between reuses.
The roofline column is the time to stream the K and V bytes the step must read (the used
positions of the cache, per kv head actually stored) at the host's measured read bandwidth
with the same number of threads (benchmarks/hf_generate.py's read_bandwidth: a 512 MiB
float32 sum), divided by the native kernel's time: 100% means the kernel runs at memory
speed.

    python benchmarks/sdpa_decode.py            # all shapes (about a minute)
    python benchmarks/sdpa_decode.py --quick    # cache 2048 only
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from _harness import Table, calibrate, fmt, gc_paused, interleaved, parse_and_start, print_table
from hf_generate import read_bandwidth

import torchneuron

OP = "aten::_scaled_dot_product_flash_attention_for_cpu"
Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 64
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Case:
    name: str
    cache: int
    rows: int = 1


# K/V copies are cycled so that each call reads them from memory, not from the last call's
# cache contents: together they span this many bytes (4x a 32 MiB L3).
ROTATION_BYTES = 128 << 20


@dataclass
class Inputs:
    q: torch.Tensor
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # copies of (K, V), used in turn
    mask: torch.Tensor | None
    enable_gqa: bool
    bytes_read: int  # K and V bytes the step must read
    turn: int = 0

    def to(self, device: str) -> Inputs:
        mask = None if self.mask is None else self.mask.to(device)
        kv = [(k.to(device), v.to(device)) for k, v in self.kv]
        return Inputs(self.q.to(device), kv, mask, self.enable_gqa, self.bytes_read)

    def call(self) -> torch.Tensor:
        k, v = self.kv[self.turn]
        self.turn = (self.turn + 1) % len(self.kv)
        return F.scaled_dot_product_attention(
            self.q, k, v, attn_mask=self.mask, enable_gqa=self.enable_gqa
        )


def inputs(case: Case, dtype: torch.dtype) -> Inputs:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, Q_HEADS, case.rows, HEAD_DIM, generator=g).to(dtype)
    k = torch.randn(1, KV_HEADS, case.cache, HEAD_DIM, generator=g).to(dtype)
    v = torch.randn(1, KV_HEADS, case.cache, HEAD_DIM, generator=g).to(dtype)
    per_position = 2 * HEAD_DIM * k.element_size()
    mask = None
    bytes_read = KV_HEADS * case.cache * per_position
    if case.name == "hf":
        used = case.cache // 2
        mask = torch.zeros(1, 1, 1, case.cache)
        mask[..., used:] = float("-inf")
        mask = mask.to(dtype)
        repeat = Q_HEADS // KV_HEADS
        k, v = (t[:, :, None].expand(1, KV_HEADS, repeat, case.cache, HEAD_DIM) for t in (k, v))
        k, v = (t.reshape(1, Q_HEADS, case.cache, HEAD_DIM) for t in (k, v))
        bytes_read = Q_HEADS * used * per_position
    stored = 2 * k.numel() * k.element_size()
    copies = max(1, -(-ROTATION_BYTES // stored))
    kv = [(k.clone(), v.clone()) for _ in range(copies)]
    return Inputs(q, kv, mask, case.name != "hf", bytes_read)


def cases(quick: bool) -> list[Case]:
    caches = (2048,) if quick else (512, 2048, 4096)
    out = [Case(name, cache) for cache in caches for name in ("gqa", "hf")]
    return out + [Case(f"rows={rows}", 2048, rows=rows) for rows in (2, 4, 8)]


def native_runs() -> int:
    return dict(torchneuron._C._native_kernel_runs()).get(OP, 0)


def main(argv: list[str] | None = None) -> int:
    args = parse_and_start(__doc__.split("\n")[0], "cache 2048 only", argv)
    if args is None:
        return 1
    info = torchneuron._C._kernel_isa()
    print(f"CPU {info['model']}, kernel ISA {info['isa']}", flush=True)
    header = ["threads", "case", "cache", "dtype", "CPU us", "neuron us", "speedup", "roofline"]
    body = []
    before = native_runs()
    with gc_paused(), torch.inference_mode():
        for threads in (1, 2):
            torch.set_num_threads(threads)
            bandwidth = read_bandwidth()
            print(f"{threads} thread(s): read bandwidth {bandwidth / 1e9:.1f} GB/s", flush=True)
            for case in cases(args.quick):
                for name, dtype in DTYPES.items():
                    cpu = inputs(case, dtype)
                    dev = cpu.to("neuron")
                    fns = {"cpu": cpu.call, "neuron": dev.call}
                    iterations = calibrate(dev.call, "neuron", 0.05)
                    times = interleaved(fns, iterations, 3 if args.quick else 7)
                    roofline = cpu.bytes_read / bandwidth / times["neuron"]
                    row = [
                        str(threads),
                        case.name,
                        str(case.cache),
                        name,
                        fmt(times["cpu"] * 1e6),
                        fmt(times["neuron"] * 1e6),
                        f"{times['cpu'] / times['neuron']:.2f}x",
                        f"{roofline * 100:.0f}%",
                    ]
                    body.append(row)
                    print("  ".join(row), flush=True)
    if native_runs() == before:
        print("the native kernel never ran (TORCHNEURON_NATIVE_KERNELS=0?)", flush=True)
    print_table(Table(header, body), args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
