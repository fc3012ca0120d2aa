"""The analytic projection against every AWS figure whose configuration is fully stated.

``python -m torchneuron.fidelity.projection.published`` prints, per published figure
(aws_figures/training.csv and inference.csv: each row names its source file, commit and
line in aws-neuron/aws-neuron-sdk), the projection and its error, then the error
distribution of the calibration rows and of the held-out rows separately. ``--markdown``
prints the tables docs/fidelity.md carries (tests/test_projection_published.py checks they
are the same); ``--calibrate`` fits the five constants of ``analytic.Calibration`` on the
calibration rows and prints them.

The calibration rows are those of the models in ``CALIBRATION_MODELS``; every other row is
held out, so a model's figures are either all fitted or all predicted. An inference row whose
published throughput contradicts its own published latencies is judged against the throughput
its P50 TTFT and TPOT imply (``contradicts_its_latencies``). The fit leaves out the
fp32 training rows (``Row.modelled``), whose cost the model has no mechanism for.
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import statistics
import sys
from dataclasses import dataclass, fields
from pathlib import Path

from .analytic import (
    CALIBRATION,
    Calibration,
    InferenceEstimate,
    InferenceRequest,
    TrainingLayout,
    inference,
    training_step,
)
from .hardware import find_instance
from .shapes import find_shape

FIGURES = Path(__file__).parent / "aws_figures"
# Where the fit starts: round guesses, not the fitted values, so refitting reproduces them.
FIT_START = Calibration(
    matmul_efficiency=0.5,
    link_efficiency=0.5,
    hbm_efficiency=0.7,
    layer_overhead_s=50e-6,
    collective_overhead_s=20e-6,
)
CALIBRATION_MODELS = {"bert-large", "llama-2-13b", "gpt3-46b", "llama-3.1-8b", "llama-3-70b"}


@dataclass(frozen=True)
class Row:
    """One published figure and its projection."""

    id: str
    kind: str  # "training" or "inference"
    model: str
    config: str
    published: float
    projected: float
    unit: str
    source: str
    calibration: bool
    extra: str = ""  # inference: TTFT and TPOT, published and projected
    # False for fp32 training: its published cost (1.8x bf16 at sequence 128, 2.2x at 512) has
    # no mechanism in the documented engine rates, so those rows are reported but not fitted.
    modelled: bool = True
    # Inference: the throughput the row's own published P50 TTFT and TPOT imply, when the
    # published throughput contradicts its latencies (see CONTRADICTION); 0 otherwise.
    implied: float = 0.0

    @property
    def reference(self) -> float:
        """The figure the projection is judged against."""
        return self.implied or self.published

    @property
    def error(self) -> float:
        return self.projected / self.reference - 1.0


def _flag(value: str) -> bool:
    return value.strip().lower() == "true"


_NOT_CONFIGURATION = {
    "id",
    "sdk",
    "source",
    "note",
    "sequences_per_s",
    "ttft_ms",
    "tpot_ms",
    "ttft_p99_ms",
    "tpot_p99_ms",
    "output_tokens_per_s",
}


def _sdk_key(row: dict[str, str]) -> tuple[int, ...]:
    """Orders SDK labels; unlabelled and unstated figures are the oldest."""
    try:
        return tuple(int(part) for part in row["sdk"].split("."))
    except ValueError:
        return ()


@functools.cache
def _load(name: str, newest_only: bool = True) -> tuple[dict[str, str], ...]:
    """The figures of aws_figures/`name`; with `newest_only`, the one of the newest SDK per
    configuration (the projection models current software; AWS republished many
    configurations as each SDK improved them)."""
    with open(FIGURES / name, newline="") as f:
        rows = list(csv.DictReader(f))
    if not newest_only:
        return tuple(rows)
    newest: dict[tuple[str, ...], dict[str, str]] = {}
    for row in rows:
        key = tuple(v for k, v in row.items() if k not in _NOT_CONFIGURATION)
        if key not in newest or _sdk_key(row) >= _sdk_key(newest[key]):
            newest[key] = row
    return tuple(sorted(newest.values(), key=lambda r: r["id"]))


# Flash attention came with SDK 2.19: enabled by default in NxD training
# (libraries/neuronx-distributed/tutorials/training_llama_tp_zero1.rst:186-189 at 215b421ac4,
# the 2.19 release) and used by transformers-neuronx above 8k prompt tokens
# (libraries/transformers-neuronx/transformers-neuronx-developer-guide.rst:839, same commit);
# no document of an earlier SDK mentions it. The BERT example runs Hugging Face's attention,
# which materialises its scores, in every SDK.
FLASH_SDK = (2, 19)
FLASH_INFERENCE_ABOVE = 8192


def _flash_attention(row: dict[str, str], prompt: int | None = None) -> bool:
    """Whether the figure's software ran attention as a flash kernel. Trn2 arrived after
    2.19, so its figures (whose SDK is unstated) are on the newer side."""
    trn2 = row["instance"].startswith("trn2")
    if not (trn2 or _sdk_key(row) >= FLASH_SDK) or not find_shape(row["model"]).causal:
        return False
    return trn2 or prompt is None or prompt > FLASH_INFERENCE_ABOVE


# transformers-neuronx turned a grouped-query model into multi-head attention when tp did not
# divide its KV heads (Shape.as_multi_head) until its June 2024 release
# (aws-neuron/transformers-neuronx@c8d6bdc, utils.get_qkv_padding: "Partial replication"), the
# one SDK 2.19 shipped; every earlier inference figure ran transformers-neuronx.
PARTIAL_KV_REPLICATION_SDK = (2, 19)


def _kv_heads_as_query_heads(row: dict[str, str]) -> bool:
    sdk = _sdk_key(row)
    return bool(sdk) and sdk < PARTIAL_KV_REPLICATION_SDK


def _is_calibration(model: str) -> bool:
    key = model.lower().removesuffix("-instruct").removesuffix("-hf")
    return key in CALIBRATION_MODELS


def training_rows(cal: Calibration = CALIBRATION, newest_only: bool = True) -> list[Row]:
    rows = []
    for r in _load("training.csv", newest_only):
        layout = TrainingLayout(
            instance=find_instance(r["instance"]),
            nodes=int(r["nodes"]),
            seq=int(r["seq"]),
            micro_batch=int(r["micro_batch"]),
            global_batch=int(r["global_batch"]),
            tp=int(r["tp"]),
            pp=int(r["pp"]),
            dp=int(r["dp"]),
            sequence_parallel=_flag(r["sp"]),
            zero1=_flag(r["zero1"]),
            checkpointing=r["checkpointing"],
            precision=r["precision"],
            flash_attention=_flash_attention(r),
        )
        step = training_step(find_shape(r["model"]), layout, cal)
        config = (
            f"{r['nodes']}n s{r['seq']} tp{r['tp']} pp{r['pp']} dp{r['dp']}"
            f"{' sp' if layout.sequence_parallel else ''}{' z1' if layout.zero1 else ''}"
            f" ckpt={r['checkpointing']} mb{r['micro_batch']} gb{r['global_batch']} "
            f"{r['precision']} sdk {r['sdk']}"
        )
        rows.append(
            Row(
                r["id"], "training", r["model"], config, float(r["sequences_per_s"]),
                layout.global_batch / step.total, "seq/s", r["source"], _is_calibration(r["model"]),
                modelled=layout.precision != "fp32",
            )
        )  # fmt: skip
    return rows


def _inference_estimate(r: dict[str, str], cal: Calibration) -> InferenceEstimate:
    request = InferenceRequest(
        instance=find_instance(r["instance"]),
        tp=int(r["tp"]),
        batch=int(r["batch"]),
        input_len=int(r["input_len"]),
        output_len=int(r["output_len"]),
        weight_bytes=1 if r["weights"] == "int8" else 2,
        flash_attention=_flash_attention(r, int(r["input_len"])),
        kv_heads_as_query_heads=_kv_heads_as_query_heads(r),
    )
    return inference(find_shape(r["model"]), request, cal)


# A published throughput is judged against unless it contradicts the row's own published
# latencies. AWS's P50 TTFT and TPOT imply batch x output / (TTFT + (output - 1) x TPOT) tokens a
# second, its P99s a lower figure; when the published throughput is more than this far outside
# that range (a projection reproducing the latencies, median or tail, would miss it by more than
# the 35% band), the projection is judged against the P50s' figure. Decided from the published
# figures alone.
CONTRADICTION = 0.35


def latency_implied_throughput(r: dict[str, str], percentile: str = "") -> float:
    """Output tokens per second from the row's published P50 (or, with percentile "_p99", P99)
    TTFT and TPOT."""
    output = int(r["output_len"])
    ttft, tpot = float(r[f"ttft{percentile}_ms"]), float(r[f"tpot{percentile}_ms"])
    return int(r["batch"]) * output / ((ttft + (output - 1) * tpot) / 1e3)


def contradicts_its_latencies(r: dict[str, str]) -> bool:
    """Whether the row's throughput lies beyond CONTRADICTION of every throughput its P50 and
    (where published) P99 latencies imply."""
    published = float(r["output_tokens_per_s"])
    implied = [latency_implied_throughput(r)]
    if r["ttft_p99_ms"] and r["tpot_p99_ms"]:
        implied.append(latency_implied_throughput(r, "_p99"))
    low, high = min(implied), max(implied)
    nearest = min(max(published, low), high)
    return abs(nearest / published - 1) > CONTRADICTION


def inference_rows(cal: Calibration = CALIBRATION, newest_only: bool = True) -> list[Row]:
    rows = []
    for r in _load("inference.csv", newest_only):
        estimate = _inference_estimate(r, cal)
        config = (
            f"{r['instance']} tp{r['tp']} b{r['batch']} in{r['input_len']} "
            f"out{r['output_len']} {r['weights']} sdk {r['sdk']}"
        )
        extra = (
            f"TTFT {float(r['ttft_ms']):.0f}/{estimate.ttft * 1e3:.0f} ms, "
            f"TPOT {float(r['tpot_ms']):.1f}/{estimate.tpot * 1e3:.1f} ms"
        )
        implied = latency_implied_throughput(r) if contradicts_its_latencies(r) else 0.0
        rows.append(
            Row(
                r["id"], "inference", r["model"], config, float(r["output_tokens_per_s"]),
                estimate.output_tokens_per_s, "tok/s", r["source"], _is_calibration(r["model"]),
                extra, implied=implied,
            )
        )  # fmt: skip
    return rows


def all_rows(cal: Calibration = CALIBRATION, newest_only: bool = True) -> list[Row]:
    return training_rows(cal, newest_only) + inference_rows(cal, newest_only)


def _latency_errors(cal: Calibration, calibration: bool) -> list[float]:
    """log errors of TTFT and TPOT of the inference rows (the fit uses them too)."""
    errors = []
    for r in _load("inference.csv"):
        if _is_calibration(r["model"]) != calibration:
            continue
        estimate = _inference_estimate(r, cal)
        errors.append(math.log(estimate.ttft * 1e3 / float(r["ttft_ms"])))
        errors.append(math.log(estimate.tpot * 1e3 / float(r["tpot_ms"])))
    return errors


def calibrate() -> Calibration:
    """The constants that minimise the mean absolute log error of the calibration rows'
    throughputs, TTFTs and TPOTs (Nelder-Mead over the constants' logarithms)."""
    from scipy.optimize import minimize

    names = [f.name for f in fields(Calibration)]
    start = [math.log(getattr(FIT_START, n)) for n in names]

    def loss(logs: list[float]) -> float:
        cal = Calibration(**{n: math.exp(v) for n, v in zip(names, logs, strict=True)})
        if cal.matmul_efficiency > 1 or cal.link_efficiency > 1 or cal.hbm_efficiency > 1:
            return 1e9
        errors = [math.log(1 + r.error) for r in all_rows(cal) if r.calibration and r.modelled]
        errors += _latency_errors(cal, calibration=True)
        return sum(abs(e) for e in errors) / len(errors)

    result = minimize(loss, start, method="Nelder-Mead", options={"maxiter": 2000, "xatol": 1e-4})
    return Calibration(**{n: math.exp(v) for n, v in zip(names, result.x, strict=True)})


def summary(rows: list[Row]) -> str:
    lines = []
    for label, chosen in (
        ("calibration", [r for r in rows if r.calibration]),
        ("held out", [r for r in rows if not r.calibration]),
        ("all", rows),
    ):
        errors = sorted(abs(r.error) for r in chosen)
        if not errors:
            continue
        within = sum(e <= 0.35 for e in errors)
        lines.append(
            f"{label}: {len(errors)} figures, median |error| {statistics.median(errors):.1%}, "
            f"largest {errors[-1]:.1%}, {within} within 35%"
        )
    contradicted = [r.id for r in rows if r.implied]
    if contradicted:
        lines.append(
            f"judged against the throughput their P50 TTFT and TPOT imply ({len(contradicted)}, "
            f"the published throughput contradicts them): {', '.join(contradicted)}"
        )
    return "\n".join(lines)


def _published_cell(r: Row) -> str:
    cell = f"{r.published:,.1f} {r.unit}"
    if r.implied:
        cell += f" (judged against {r.implied:,.1f}: its P50 TTFT and TPOT)"
    return cell


def markdown(rows: list[Row]) -> str:
    out = ["| id | model | configuration | published | projected | error | set | source |"]
    out.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        config = f"{r.config}; {r.extra}" if r.extra else r.config
        out.append(
            f"| {r.id} | {r.model} | {config} | {_published_cell(r)} | "
            f"{r.projected:,.1f} | {r.error:+.1%} | {'fit' if r.calibration else 'held out'} | "
            f"{r.source} |"
        )
    return "\n".join(out)


def html_page(rows: list[Row]) -> str:
    """Projected against published figures, log-log, training and inference apart."""
    from ..html_report import log_scatter, page

    def points(kind: str) -> list[tuple[float, float, str, str]]:
        return [
            (
                r.reference,
                r.projected,
                f"{r.id} {r.model} {r.config}: {_published_cell(r)} published, "
                f"{r.projected:,.1f} projected ({r.error:+.1%})",
                f"{r.config.split()[0] if kind == 'inference' else 'trn1/trn1n'}, "
                f"{'fit' if r.calibration else 'held out'}",
            )
            for r in rows
            if r.kind == kind
        ]

    return page(
        "Projected against AWS's published figures",
        [
            ("Summary", f"<pre>{summary(rows)}</pre>"),
            ("Training (sequences/s)", log_scatter(sorted(points("training"), key=lambda p: p[3]))),
            (
                "Inference (output tokens/s)",
                log_scatter(sorted(points("inference"), key=lambda p: p[3])),
            ),
            ("Every figure", f"<pre>{markdown(rows)}</pre>"),
        ],
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m torchneuron.fidelity.projection.published", description=__doc__
    )
    p.add_argument("--markdown", action="store_true", help="the tables of docs/fidelity.md")
    p.add_argument("--calibrate", action="store_true", help="fit the calibrated constants")
    p.add_argument(
        "--all", action="store_true", help="every figure, not only each configuration's newest"
    )
    p.add_argument("--html", type=Path, help="write the projected-against-published plots")
    a = p.parse_args(argv)
    if a.calibrate:
        print(calibrate())
        return 0
    rows = all_rows(newest_only=not a.all)
    if a.markdown:
        print(markdown(rows))
    else:
        for r in rows:
            print(
                f"{r.id:<6}{r.model:<26}{r.reference:>12.1f}{r.projected:>12.1f} {r.unit:<6}"
                f"{r.error:>+8.1%}  {'fit' if r.calibration else 'held out'}  {r.extra}"
                f"{'  (judged against its P50 TTFT and TPOT)' if r.implied else ''}"
            )
    print()
    print(summary(rows))
    if a.html:
        a.html.write_text(html_page(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
