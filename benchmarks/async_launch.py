"""What asynchronous launches buy: host work overlapping device work (issue 15).

Each workload runs in two fresh processes, one per launch mode (the mode is read once per
process), in the same run: NEURON_LAUNCH_BLOCKING=1 (every op completes before its call
returns) and the default asynchronous launches. Workloads:

  - overlap: per step, a 768x768x768 float32 product chain on the device, then pure-Python
    host work of about the same duration (a tokenizer, a data loader, a logging hook). With
    asynchronous launches the host work runs while the device computes: at best
    max(host, device) instead of host + device per step.
  - decode: greedy static-cache decode of a small Llama (4 layers, hidden 512), the
    Transformers generation loop, where Python and dispatch between ops are the host work.
  - launch-add, launch-gemv, launch-softmax: what one op costs the calling thread (3000
    calls without synchronizing in between: a tiny add, a 64x1024 GEMV, a 64x1024 softmax),
    with TORCHNEURON_ASYNC_MIN_BYTES=0 in the asynchronous process so every call launches.

speedup = blocking seconds per step / asynchronous seconds per step (> 1: async is faster).
The device computes with 1 intra-op thread, so the stream worker and the Python thread use
the 2 cores of this host between them; CPU eager with 1 thread is in the same table.

    python benchmarks/async_launch.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from _harness import Table, fmt, print_table

_CHILD = r"""
import json, statistics, sys, time
import torch, torchneuron
torch.set_num_threads(1)
workload = sys.argv[1]
device = sys.argv[2]

def host_work(n):
    # Python-level work standing in for tokenization or a data loader.
    total = 0
    for i in range(n):
        total += hash(str(i)) & 7
    return total

def timed(step, steps, sync):
    for _ in range(2):
        step()
    sync()
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        samples.append((time.perf_counter() - start) / steps)
    return statistics.median(samples)

sync = torch.neuron.synchronize if device == "neuron" else (lambda: None)
if workload.startswith("launch-"):
    x = torch.randn(1024, device=device)
    w = torch.randn(64, 1024, device=device)
    op = {"launch-add": lambda: x + 1, "launch-gemv": lambda: torch.mm(w, x[:, None]),
          "launch-softmax": lambda: torch.softmax(w, -1)}[workload]
    op(); sync()
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(3000):
            op()
        samples.append((time.perf_counter() - start) / 3000)  # calling thread only
        sync()
    print(json.dumps({"seconds": statistics.median(samples)}))
elif workload == "overlap":
    torch.manual_seed(0)
    x = torch.randn(768, 768, device=device)
    w = torch.randn(768, 768, device=device) / 28
    def device_part():
        y = x
        for _ in range(3):
            y = torch.tanh(y @ w)
        return y
    # Calibrate the host work to the device part's time on this host.
    start = time.perf_counter(); device_part(); sync(); device_s = time.perf_counter() - start
    start = time.perf_counter(); host_work(20000); host_s = (time.perf_counter() - start) / 20000
    n = max(1000, int(device_s / host_s))
    def step():
        device_part()
        host_work(n)
    print(json.dumps({"seconds": timed(step, 10, sync)}))
else:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1376,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval().to(device)
    prompt = torch.randint(0, 8000, (1, 32), device=device)
    new_tokens = 32
    def step():
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, cache_implementation="static",
                           disable_compile=True, pad_token_id=0)
    print(json.dumps({"seconds": timed(step, 1, sync) / new_tokens}))
"""


def run(workload: str, device: str, blocking: bool) -> float:
    env = dict(os.environ)
    env.pop("NEURON_LAUNCH_BLOCKING", None)
    if blocking:
        env["NEURON_LAUNCH_BLOCKING"] = "1"
    elif workload.startswith("launch-"):
        env["TORCHNEURON_ASYNC_MIN_BYTES"] = "0"
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CHILD), workload, device],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{workload} on {device} failed:\n{result.stderr[-3000:]}")
    return float(json.loads(result.stdout.strip().splitlines()[-1])["seconds"])


def main() -> int:
    import torch

    import torchneuron

    isa = torchneuron._C._kernel_isa()
    print(
        f"torch {torch.__version__}, {os.cpu_count()} cores, CPU {isa['model']}, "
        f"kernel ISA {isa['isa']}, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    table = Table(
        ["workload", "CPU eager ms/step", "neuron blocking ms", "neuron async ms", "speedup"],
        # launch-*: milliseconds per call on the calling thread
        [],
    )
    for workload in ("overlap", "decode", "launch-add", "launch-gemv", "launch-softmax"):
        cpu = run(workload, "cpu", blocking=True)
        blocking = run(workload, "neuron", blocking=True)
        asynchronous = run(workload, "neuron", blocking=False)
        table.body.append(
            [
                workload,
                fmt(cpu * 1e3),
                fmt(blocking * 1e3),
                fmt(asynchronous * 1e3),
                f"{blocking / asynchronous:.2f}x",
            ]
        )
        print(f"{workload}: done", flush=True)
    print_table(table, markdown=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
