"""Transformers causal-LM architecture coverage on the ``neuron`` device.

For every entry of the installed Transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` this
builds a small configuration generically from the config class's defaults (``shrink_config``:
two layers, hidden size 64, 4 heads / 2 KV heads, FFN 128, vocabulary 256, 4 experts with 2
per token, sub-configs shrunk recursively), seeds, creates the model with random weights on
the CPU (float32, eval), deep-copies it to ``neuron`` and checks:

(a) fp32 forward logits on fixed ``input_ids`` (batch 2, sequence 12):
    ``torch.allclose(neuron, cpu, atol=1e-4, rtol=1e-4)``.
(b) greedy ``generate`` of 8 new tokens with ``cache_implementation="static"``: identical
    tokens to the CPU's eager generation, twice on neuron:
    - *eager*: ``disable_compile=True``;
    - *compiled*: the default, what users get: on a neuron device a static cache makes
      Transformers compile the forward with backend "neuron" (into a cache directory fresh
      for the run). This costs a compile per architecture (measured: 8-81 s, 31 s on
      average, on 2 shared cores; about 95 min for all 185 static-cache architectures), so
      ``--compiled`` chooses the architectures it runs for (all by default).
    Only when the architecture cannot generate with a static cache on the CPU either does the
    eager check use the model's default cache (on both devices; the row says so); the compiled
    check is then not applicable (Transformers compiles only static caches).
(c) bf16 forward (the fp32 model cast with ``.to(torch.bfloat16)`` on each device) against
    CPU bf16: ``torch.allclose(neuron, cpu, atol=2e-2, rtol=2e-2)`` on the logits. bfloat16
    keeps 8 significant bits (unit roundoff 2**-8 = 3.9e-3), so an equally valid but
    different accumulation order in a two-layer model moves a logit by a few units in the
    last place; 2e-2 is about five ulps relative (torch.testing's own bf16 default is
    rtol=1.6e-2) and, since these random-init models have logits of order 0.1-1, the
    absolute part is on the same scale. A real kernel bug (wrong mask, wrong cast, lost bias)
    shows up as errors of order 1. The argmax agreement is recorded next to it.

The generic shrinking is retried in a fixed ladder of variants when the CPU reference fails
(multi-head instead of grouped KV heads, default sliding window, a longer layer prefix that
keeps every layer kind twice); the first variant whose CPU reference works is used and named
in the report. Hand-written special cases (``SPECIAL``) exist only where the defaults of the
installed Transformers cannot run at all, each with its reason.

An architecture whose CPU reference itself fails (missing optional package, needs inputs
beyond text, broken at any size) is listed apart and not counted; the failure is re-run on
the CPU with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` to show torchneuron is not the cause. Each
architecture runs in a worker process with a time limit; a worker that hangs or crashes is
replaced.

    python benchmarks/hf_arch_coverage.py                 # all; writes docs/hf_coverage.md
    python benchmarks/hf_arch_coverage.py --only llama    # one (or a comma list)
    python benchmarks/hf_arch_coverage.py --limit 10      # the first 10 architectures
    python benchmarks/hf_arch_coverage.py --compiled none # eager generation only (minutes)
    python benchmarks/hf_arch_coverage.py --compiled llama,afmoe  # compiled only for these

``--only``/``--limit`` runs print to stdout and write a report only with ``--report PATH``.
The last line of stdout and of the report is the share of CPU-working architectures that pass
all three checks on ``neuron`` (fp32, eager generate, bf16), then how many of those run
compiled generate the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

# the modules beside this script, also under ``python -m benchmarks.hf_arch_coverage``
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_arch_report import headline, summary_line, write_report  # noqa: E402
from hf_arch_run import worker_main  # noqa: E402
from hf_arch_workers import ROOT, Runner  # noqa: E402

REPORT = os.path.join(ROOT, "docs", "hf_coverage.md")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", help="architecture name(s), comma-separated (mapping keys)")
    p.add_argument("--limit", type=int, help="only the first N architectures")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per architecture")
    p.add_argument(
        "--compile-timeout",
        type=float,
        default=900.0,
        help="extra seconds for an architecture whose generation is also compiled",
    )
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    p.add_argument("--recycle", type=int, default=20, help="architectures per worker process")
    p.add_argument(
        "--compiled",
        default="all",
        help="architectures whose generation is also run the default (compiled) way: "
        "'all' (default), 'none', or a comma list",
    )
    p.add_argument("--report", help="report path (default docs/hf_coverage.md for full runs)")
    p.add_argument("--json", help="also write the raw results as JSON here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cpu-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker_main(args)
        return

    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # the parent needs no device
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]
        if unknown:
            p.error(f"not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES: {', '.join(unknown)}")
        names = wanted
    if args.limit:
        names = names[: args.limit]
    report = args.report or (REPORT if not args.only and not args.limit else None)
    if args.compiled in ("all", "none"):
        compiled = set(names) if args.compiled == "all" else set()
    else:
        compiled = {n.strip() for n in args.compiled.split(",") if n.strip()}
        unknown = sorted(compiled - set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
        if unknown:
            p.error(f"--compiled: not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES: {', '.join(unknown)}")

    log_dir = tempfile.mkdtemp(prefix="hf_coverage_")
    # compiled generation starts from an empty compile cache, as a new user's would
    os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = os.path.join(log_dir, "neff_cache")
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    print(f"[coverage] {len(names)} architectures; worker logs in {log_dir}", flush=True)
    start = time.time()
    results: list[dict] = []
    runner = Runner(args, cpu_only=False, log_dir=log_dir)
    try:
        for i, name in enumerate(names):
            r = runner.run(name, compiled=name in compiled)
            if name in compiled:
                r["compiled_requested"] = True
            results.append(r)
            print(f"[{i + 1:3d}/{len(names)}] {summary_line(r)}", flush=True)
    finally:
        runner.close()
        shutil.rmtree(os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"], ignore_errors=True)
    # CPU failures: confirm without torchneuron loaded
    # CPU failures, timeouts and crashes: the CPU reference alone, without torchneuron
    failing = [r for r in results if not r.get("cpu_ok")]
    if failing:
        print(f"[coverage] re-running {len(failing)} CPU failures without torchneuron", flush=True)
        cpu_runner = Runner(args, cpu_only=True, log_dir=log_dir)
        try:
            for r in failing:
                c = cpu_runner.run(r["arch"])
                if c.get("harness_error"):
                    r["cpu_only_check"] = "not confirmed: " + c["harness_error"]
                elif c.get("cpu_ok") and r.get("harness_error"):
                    # the CPU reference works: the time limit / crash is neuron's
                    r["cpu_ok_alone"] = True
                    r["cpu_only_check"] = "CPU reference alone works"
                elif c.get("cpu_ok"):
                    r["cpu_fails_only_with_neuron"] = True
                    r["cpu_only_check"] = "PASSES without torchneuron"
                else:
                    same = set(c.get("cpu_errors", {})) == set(r.get("cpu_errors", {}))
                    r["cpu_only_check"] = (
                        "fails the same way"
                        if same
                        else (
                            "fails: " + "; ".join(f"{k}: {v}" for k, v in c["cpu_errors"].items())
                        )
                    )
                print(f"    {r['arch']:28s} {r['cpu_only_check'][:120]}", flush=True)
        finally:
            cpu_runner.close()
    elapsed = time.time() - start
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    line, _, _ = headline(results)
    if report:
        write_report(report, results, args, elapsed)
        print(f"[coverage] report written to {os.path.relpath(report, os.getcwd())}", flush=True)
    print(line, flush=True)


if __name__ == "__main__":
    main()
