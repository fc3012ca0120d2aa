"""python -m torchneuron.fidelity.projection MODEL [options]: projected training step time,
tokens/s and MFU, or inference TTFT, TPOT and throughput, on Trainium and Inferentia2
instances, by the calibrated analytic model (docs/fidelity.md §4-5).

python -m torchneuron.fidelity.projection [--instance I] --script train.py [its arguments]:
runs the script on neuron and projects each graph it compiles (per call, per optimizer step
and for the whole run) on each instance's NeuronCore.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..html_report import page, stacked_bars, table
from . import (
    INSTANCES,
    InferenceEstimate,
    InferenceRequest,
    Instance,
    TrainingLayout,
    TrainingProjection,
    find_instance,
    project_inference,
    project_training,
    resolve_shape,
)

T = TypeVar("T")

# --chip names the instance of that chip AWS publishes figures for.
CHIP_INSTANCES = {
    "trn1": "trn1.32xlarge",
    "trn1n": "trn1n.32xlarge",
    "inf2": "inf2.48xlarge",
    "trn2": "trn2.48xlarge",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m torchneuron.fidelity.projection",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", nargs="?", help="published model, fit preset, config.json or dir")
    p.add_argument("--instance", action="append", help=f"{', '.join(INSTANCES)} (repeatable)")
    p.add_argument("--chip", action="append", help=f"{', '.join(CHIP_INSTANCES)}: its instance")
    p.add_argument("--nodes", type=int, help="instances (default: the fewest the layout needs)")
    p.add_argument("--seq", type=int, default=2048, help="training sequence length")
    p.add_argument("--batch", type=int, default=1, help="micro-batch (training), batch (inference)")
    p.add_argument("--global-batch", type=int, help="sequences per step (default batch x dp)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (1F1B)")
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism with tp")
    p.add_argument("--zero1", action="store_true", help="optimizer state sharded over dp")
    p.add_argument("--checkpointing", choices=("none", "selective", "full"), default="none")
    p.add_argument("--grad-checkpointing", action="store_true", help="= --checkpointing full")
    p.add_argument(
        "--precision",
        choices=("bf16", "mixed", "fp32"),
        help="bf16 weights, mixed (bf16 compute, fp32 master weights) or fp32 "
        "(default from --dtype and --autocast)",
    )
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--autocast", action="store_true", help="with --dtype fp32: mixed")
    p.add_argument("--cp", type=int, default=1, help="context parallelism (ring attention)")
    p.add_argument("--ep", type=int, default=1, help="expert parallelism (mixture of experts)")
    p.add_argument(
        "--fsdp", action="store_true", help="FSDP (ZeRO-3): all state sharded over dp x cp"
    )
    p.add_argument("--inference", action="store_true", help="TTFT, TPOT and throughput")
    p.add_argument("--input-len", type=int, help="prompt tokens (default --seq)")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens")
    p.add_argument("--weights", choices=("bf16", "int8"), default="bf16")
    p.add_argument("--html", type=Path, help="write a self-contained HTML report")
    return p


def _instances(a: argparse.Namespace) -> list[str]:
    names = list(a.instance or [])
    for chip in a.chip or []:
        if chip.partition(":")[0] not in CHIP_INSTANCES:
            raise ValueError(
                f"no instance for chip {chip!r}: the model knows {', '.join(CHIP_INSTANCES)} "
                "(the chips AWS publishes figures for; Trn3 has none to calibrate against)"
            )
        names.append(CHIP_INSTANCES[chip.partition(":")[0]])
    if not names:
        names = (
            ["trn1.32xlarge", "inf2.48xlarge", "trn2.48xlarge"]
            if a.inference
            else ["trn1.32xlarge", "trn2.48xlarge"]
        )
    return list(dict.fromkeys(names))


def _precision(a: argparse.Namespace) -> str:
    if a.precision:
        return str(a.precision)
    if a.dtype == "fp32":
        return "mixed" if a.autocast else "fp32"
    return "bf16"


def _per_instance(
    a: argparse.Namespace, build: Callable[[Instance], T]
) -> tuple[list[T], list[str]]:
    """build() on each instance; where the layout does not fit an instance the user did not
    name, that instance is skipped with the reason (named ones raise)."""
    named = bool(a.instance or a.chip)
    built, skipped = [], []
    for name in _instances(a):
        try:
            built.append(build(find_instance(name)))
        except ValueError as error:
            if named:
                raise
            skipped.append(f"{name}: {error}")
    if not built:
        raise ValueError("the layout fits no instance: " + "; ".join(skipped))
    return built, skipped


def training_layouts(a: argparse.Namespace) -> tuple[list[TrainingLayout], list[str]]:
    def build(inst: Instance) -> TrainingLayout:
        cores = a.tp * a.pp * a.dp * a.cp
        return TrainingLayout(
            instance=inst,
            nodes=a.nodes or max(1, math.ceil(cores / inst.cores)),
            seq=a.seq,
            micro_batch=a.batch,
            global_batch=a.global_batch or a.batch * a.dp,
            tp=a.tp,
            pp=a.pp,
            dp=a.dp,
            sequence_parallel=a.sp,
            zero1=a.zero1,
            cp=a.cp,
            ep=a.ep,
            fsdp=a.fsdp,
            checkpointing="full" if a.grad_checkpointing else a.checkpointing,
            precision=_precision(a),
        )

    return _per_instance(a, build)


def inference_requests(a: argparse.Namespace) -> tuple[list[InferenceRequest], list[str]]:
    if a.pp != 1 or a.dp != 1 or a.cp != 1 or a.ep != 1 or a.fsdp:
        raise ValueError(
            "inference projects one tensor-parallel replica: --pp, --dp, --cp and --ep are 1, "
            "no --fsdp"
        )

    def build(inst: Instance) -> InferenceRequest:
        return InferenceRequest(
            instance=inst,
            tp=a.tp,
            batch=a.batch,
            input_len=a.input_len or a.seq,
            output_len=a.output_len,
            weight_bytes=1 if a.weights == "int8" else 2,
        )

    return _per_instance(a, build)


def format_training(model: str, rows: list[TrainingProjection]) -> str:
    first = rows[0].layout
    plural = "es" if first.microbatches > 1 else ""
    lines = [
        f"{model}: training, seq {first.seq}, micro-batch {first.micro_batch}, global batch "
        f"{first.global_batch} ({first.microbatches} microbatch{plural} per replica), "
        f"tp {first.tp} pp {first.pp} dp {first.dp}{f' cp {first.cp}' if first.cp > 1 else ''}"
        f"{f' ep {first.ep}' if first.ep > 1 else ''}"
        f"{' sp' if first.sequence_parallel else ''}{' zero1' if first.zero1 else ''}"
        f"{' fsdp' if first.fsdp else ''}, checkpointing {first.checkpointing}, "
        f"{first.precision} precision",
        f"{'instance':<16}{'nodes':>6}{'step s':>10}{'seq/s':>10}{'tokens/s':>12}{'MFU':>7}",
    ]
    for p in rows:
        lines.append(
            f"{p.layout.instance.name:<16}{p.layout.nodes:>6}{p.seconds:>10.4f}"
            f"{p.sequences_per_s:>10.2f}{p.tokens_per_s:>12,.0f}{p.mfu:>7.1%}"
        )
        parts = sorted(p.step.parts.items(), key=lambda kv: -kv[1])
        lines.append(
            "    " + ", ".join(f"{k} {v:.4f} s ({v / p.seconds:.0%})" for k, v in parts if v > 0)
        )
    return "\n".join(lines)


def format_inference(model: str, rows: list[tuple[InferenceRequest, InferenceEstimate]]) -> str:
    r0 = rows[0][0]
    lines = [
        f"{model}: inference, tp {r0.tp}, batch {r0.batch}, input {r0.input_len}, output "
        f"{r0.output_len}, {'int8' if r0.weight_bytes == 1 else 'bf16'} weights",
        f"{'instance':<16}{'TTFT ms':>10}{'TPOT ms':>10}{'tokens/s':>12}",
    ]
    for request, e in rows:
        lines.append(
            f"{request.instance.name:<16}{e.ttft * 1e3:>10.1f}{e.tpot * 1e3:>10.2f}"
            f"{e.output_tokens_per_s:>12,.1f}"
        )
    return "\n".join(lines)


def html_training(model: str, rows: list[TrainingProjection]) -> str:
    bars = [(p.layout.instance.name, list(p.step.parts.items()), 0.0) for p in rows]
    return page(
        f"Projected training step: {model}",
        [
            ("Summary", f"<pre>{format_training(model, rows)}</pre>"),
            ("Step time by kind (s)", stacked_bars(bars, unit="s", scale=1.0)),
        ],
    )


def html_inference(model: str, rows: list[tuple[InferenceRequest, InferenceEstimate]]) -> str:
    return page(
        f"Projected inference: {model}",
        [
            ("Summary", f"<pre>{format_inference(model, rows)}</pre>"),
            (
                "Latency",
                table(
                    ("instance", "TTFT ms", "TPOT ms", "tokens/s"),
                    [
                        (
                            q.instance.name,
                            f"{e.ttft * 1e3:.1f}",
                            f"{e.tpot * 1e3:.2f}",
                            f"{e.output_tokens_per_s:.1f}",
                        )
                        for q, e in rows
                    ],
                ),
            ),
        ],
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script: list[str] = []
    if "--script" in argv:  # everything after the script's path is the script's own
        at = argv.index("--script")
        argv, script = argv[:at], argv[at + 1 :]
        if not script:
            print("error: --script needs the path of a Python script", file=sys.stderr)
            return 2
    a = _parser().parse_args(argv)
    try:
        if script:
            from .graphs import project_script

            return project_script(script, _instances(a), a.html)
        if not a.model:
            raise ValueError("name a model (or --script train.py ...)")
        shape = resolve_shape(a.model)
        if a.inference:
            requests, skipped = inference_requests(a)
            results = [(q, project_inference(shape, q)) for q in requests]
            print(format_inference(a.model, results))
            report = html_inference(a.model, results)
        else:
            layouts, skipped = training_layouts(a)
            projected = [project_training(shape, lay) for lay in layouts]
            print(format_training(a.model, projected))
            report = html_training(a.model, projected)
        for reason in skipped:
            print(f"not projected on {reason}")
        if a.html:
            a.html.write_text(report)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
