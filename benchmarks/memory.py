"""Peak memory of the benchmarks' steps, neuron against CPU eager: the SFT training step of
benchmarks/training.py (the 20.0M Llama, batch 4 x 128, fused AdamW; float32 and bf16
autocast) and the FLUX.1 and Qwen-Image denoising steps of benchmarks/diffusion.py at 512 px
(float32 and bfloat16), each side in a process of its own so that one side's memory cannot
count against the other.

In each process the model is put on its device (the Llama built there, ``with
torch.device(...)``; the diffusion transformers, a few MiB, moved), one step runs (the
optimizer state and the allocator's pools come into being), then the peak resident set is
reset (``/proc/self/clear_refs``) and STEPS steps run: "peak RSS" is the process's largest
resident set during them (VmHWM), "step growth" that peak less the resident set before them;
"anon" and "file" split the resident set after them into anonymous memory (heap, tensors) and
mapped files (mostly the pages of torch's libraries that the run executed, which other
processes share).
Device memory is host memory here, so RSS counts both sides whole; the neuron side also
reports ``torch.neuron.max_memory_allocated()`` over the same steps (what its caching
allocator handed out) and ``memory_reserved()`` (what it holds). Target (issue 33): neuron's
peak RSS no more than CPU eager's.

    python benchmarks/memory.py             # every workload
    python benchmarks/memory.py --markdown  # also print the table as Markdown
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

STEPS = 5
MIB = 2**20


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)
    assert match, field
    return int(match.group(1))


WORKLOADS = {  # name -> the dtypes it runs in
    "SFT step": ("float32", "bf16 autocast"),
    "FLUX.1 step 512 px": ("float32", "bfloat16"),
    "Qwen-Image step 512 px": ("float32", "bfloat16"),
}


def _step(workload: str, device: str, dtype: str) -> Callable[[], object]:
    """One step of `workload` on `device` as a closure."""
    import torch

    if workload == "SFT step":
        from training import BATCH, SEQ, llama_config, make_step
        from transformers import LlamaForCausalLM

        torch.manual_seed(0)
        with torch.device(device):
            model = LlamaForCausalLM(llama_config()).train()
        ids = torch.randint(1, 8000, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
        return make_step(model, model, ids.to(device), dtype == "bf16 autocast")[0]
    import diffusion

    build, inputs = diffusion.MODELS[workload.split(" step")[0]]
    torch_dtype = getattr(torch, dtype)
    model = build(torch_dtype).to(device)
    return diffusion.step(model, diffusion.on(device, inputs(512, torch_dtype)))


def child(workload: str, device: str, dtype: str) -> dict[str, float]:
    """Runs in its own process: the measurements of one side."""
    import torch

    step = _step(workload, device, dtype)
    step()
    neuron = device == "neuron"
    if neuron:
        torch.neuron.synchronize()
        torch.neuron.reset_peak_memory_stats()
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    for _ in range(STEPS):
        step()
    if neuron:
        torch.neuron.synchronize()
    result = {"peak": _status_kib("VmHWM") * 1024 / MIB, "before": before * 1024 / MIB}
    result["anon"] = _status_kib("RssAnon") * 1024 / MIB
    result["file"] = _status_kib("RssFile") * 1024 / MIB
    if neuron:
        result["allocated"] = torch.neuron.max_memory_allocated() / MIB
        result["reserved"] = torch.neuron.memory_reserved() / MIB
    return result


def _run_side(workload: str, device: str, dtype: str) -> dict[str, float]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", device]
    done = subprocess.run(
        [*argv, "--workload", workload, "--dtype", dtype],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{device} side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    parser.add_argument("--child", choices=("cpu", "neuron"), help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=tuple(WORKLOADS), help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.workload, args.child, args.dtype)))
        return 0

    from _harness import Table, host_banner, print_table

    print(host_banner())
    header = ["workload", "dtype", "cpu peak RSS MiB", "neuron peak RSS MiB", "neuron / cpu"]
    header += ["cpu step growth", "neuron step growth", "anon cpu / neuron", "file cpu / neuron"]
    header += ["neuron allocated", "neuron reserved"]
    header += ["pass/miss"]
    body = []
    for workload, dtypes in WORKLOADS.items():
        for dtype in dtypes:
            cpu, neuron = _run_side(workload, "cpu", dtype), _run_side(workload, "neuron", dtype)
            body.append(_row(workload, dtype, cpu, neuron))
    print_table(Table(header, body), args.markdown)
    return 0


def _row(workload: str, dtype: str, cpu: dict[str, float], neuron: dict[str, float]) -> list[str]:
    ratio = neuron["peak"] / cpu["peak"]
    return [
        workload,
        dtype,
        f"{cpu['peak']:.0f}",
        f"{neuron['peak']:.0f}",
        f"{ratio:.2f}",
        f"{cpu['peak'] - cpu['before']:.0f}",
        f"{neuron['peak'] - neuron['before']:.0f}",
        f"{cpu['anon']:.0f} / {neuron['anon']:.0f}",
        f"{cpu['file']:.0f} / {neuron['file']:.0f}",
        f"{neuron['allocated']:.0f}",
        f"{neuron['reserved']:.0f}",
        "pass" if ratio <= 1.0 else "MISS",
    ]


if __name__ == "__main__":
    sys.exit(main())
