"""One architecture of the coverage run: CPU references, neuron checks, the worker loop.

Runs inside a worker process (``hf_arch_coverage.py --worker``): ``worker_main`` reads
architecture names on stdin and prints one tagged JSON result per name; progress goes out as
tagged stage lines, so the parent can say where a worker hung or died.
"""

from __future__ import annotations

import copy
import gc
import json
import sys
import time
import traceback

from hf_arch_config import (
    BOS,
    INPUT_HIGH,
    INPUT_LOW,
    PAD,
    VARIANTS,
    _get,
    _int,
    shrink_config,
)

RESULT_TAG = "@@HF_COVERAGE_RESULT@@ "
STAGE_TAG = "@@HF_COVERAGE_STAGE@@ "
READY_TAG = "@@HF_COVERAGE_READY@@"

FP32_TOL = {"atol": 1e-4, "rtol": 1e-4}
BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}
BATCH, SEQ, NEW_TOKENS = 2, 12, 8


def _stage(name: str, stage: str) -> None:
    print(f"{STAGE_TAG}{name} {stage}", flush=True)


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    text = " ".join(text.split())
    return text[:400]


def _where(exc: BaseException) -> str:
    """file:line of the innermost frame inside transformers/torch (for the report)."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "site-packages" in frame.filename:
            path = frame.filename.split("site-packages/")[-1]
            return f"{path}:{frame.lineno}"
    return ""


def _located(exc: BaseException) -> str:
    """The exception in short, with where it was raised: a report's failure reason."""
    return _short(exc) + f" [{_where(exc)}]"


def _logits(output):
    import torch

    value = getattr(output, "logits", None)
    if value is None:
        value = output[0]
    if isinstance(value, (list, tuple)):
        value = torch.cat([v.reshape(-1) for v in value])
    return value


def _inputs(model_type: str, config, device: str):
    import torch

    rows = BATCH
    codebooks = _get(getattr(config, "decoder", config), "num_codebooks")
    if model_type.startswith("musicgen") and _int(codebooks):
        rows = BATCH * codebooks  # MusicgenForCausalLM takes (batch x codebooks, seq)
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(INPUT_LOW, INPUT_HIGH, (rows, SEQ), generator=g)
    return ids.to(device)


def _build_model(model_type: str, config):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    torch.manual_seed(0)
    class_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    if model_type.startswith("musicgen"):
        model = getattr(transformers, class_name)(config.decoder)
    else:
        try:
            model = AutoModelForCausalLM.from_config(config)
        except Exception:
            model = getattr(transformers, class_name)(config)
    model = model.float().eval()
    if model_type.startswith("musicgen") and model.generation_config.decoder_start_token_id is None:
        model.generation_config.decoder_start_token_id = BOS  # MusicGen pads with it
    if model_type == "xmod":
        model.set_default_language("en_XX")  # X-MOD needs a language adapter chosen
    return model


def _forward(model, ids):
    import torch

    with torch.no_grad():
        return _logits(model(input_ids=ids)).detach()


def _generate(model, ids, static: bool, compile_path: bool):
    import torch

    kwargs = {
        "attention_mask": torch.ones_like(ids),
        "max_new_tokens": NEW_TOKENS,
        "min_new_tokens": NEW_TOKENS,
        "do_sample": False,
        "num_beams": 1,
        "num_return_sequences": 1,
        "pad_token_id": PAD,
    }
    if static:
        kwargs["cache_implementation"] = "static"
    if not compile_path:
        kwargs["disable_compile"] = True
    with torch.no_grad():
        out = model.generate(ids, **kwargs)
    if not isinstance(out, torch.Tensor):
        out = out.sequences
    return out.detach()


def _cpu_reference(model_type: str, name: str, variant: tuple) -> dict:
    """Builds the model for `variant` and runs the three CPU references."""
    import torch

    ref: dict = {"variant": variant[0], "notes": [], "errors": {}}
    _stage(name, f"config {variant[0]}")
    try:
        config, notes = shrink_config(model_type, variant)
        ref["notes"] = notes
        model = _build_model(model_type, config)
    except Exception as exc:  # noqa: BLE001
        ref["errors"]["build"] = _located(exc)
        return ref
    ref["model"] = model
    ref["config"] = config
    ref["params"] = sum(p.numel() for p in model.parameters())
    ids = _inputs(model_type, config, "cpu")
    ref["ids"] = ids
    _stage(name, "cpu fp32 forward")
    try:
        ref["fp32"] = _forward(model, ids)
    except Exception as exc:  # noqa: BLE001
        ref["errors"]["fp32"] = _located(exc)
        return ref
    _stage(name, "cpu generate")
    try:
        ref["generate"] = _generate(model, ids, static=True, compile_path=False)
        ref["static"] = True
    except Exception as exc:  # noqa: BLE001
        ref["static_error"] = _located(exc)
        try:
            ref["generate"] = _generate(model, ids, static=False, compile_path=False)
            ref["static"] = False
        except Exception as exc2:  # noqa: BLE001
            ref["errors"]["generate"] = (
                f"static: {ref['static_error']}; default cache: {_located(exc2)}"
            )
    _stage(name, "cpu bf16 forward")
    try:
        bf16 = copy.deepcopy(model).to(torch.bfloat16)
        ref["bf16"] = _forward(bf16, ids)
        del bf16
    except Exception as exc:  # noqa: BLE001
        ref["errors"]["bf16"] = _located(exc)
    return ref


def _compare(got, expected, tol: dict) -> dict:
    import torch

    got = got.detach().cpu()
    if got.shape != expected.shape:
        return {"ok": False, "reason": f"shape {tuple(got.shape)} != {tuple(expected.shape)}"}
    g, e = got.float(), expected.float()
    finite = bool(torch.isfinite(g).all()) or bool((torch.isfinite(g) == torch.isfinite(e)).all())
    diff = (g - e).abs().nan_to_num(nan=float("inf"))
    max_diff = float(diff.max()) if diff.numel() else 0.0
    ok = finite and bool(torch.allclose(g, e, equal_nan=True, **tol))
    agree = 1.0
    if g.dim() >= 2 and g.shape[-1] > 1:
        agree = float((g.argmax(-1) == e.argmax(-1)).float().mean())
    res = {"ok": ok, "max_abs_diff": max_diff, "argmax_agree": agree}
    if not ok:
        scale = float(e.abs().max()) if e.numel() else 0.0
        res["reason"] = (
            f"max |diff| {max_diff:.3g} (|cpu| max {scale:.3g}), argmax agreement {agree:.1%}"
        )
    return res


def _same_tokens(got, expected) -> dict:
    import torch

    if got.device.type != "neuron":
        return {"ok": False, "reason": f"output on {got.device}"}
    got = got.cpu()
    if got.shape == expected.shape and torch.equal(got, expected):
        return {"ok": True}
    return {
        "ok": False,
        "reason": f"tokens differ: neuron {got[:, SEQ:].tolist()} cpu {expected[:, SEQ:].tolist()}",
    }


def _compiled_generate_check(dev, dev_ids, expected) -> dict:
    """Generation the default way (Transformers compiles a static cache's forward on neuron)."""
    import torch

    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    got = _generate(dev, dev_ids, static=True, compile_path=True)
    check = _same_tokens(got, expected)
    check["graphs"] = torch.neuron.get_dynamo_metrics()["host_graphs"]
    if check["ok"] and not check["graphs"]:
        check["reason"] = "Transformers did not compile"
    return check


def run_architecture(model_type: str, compiled: bool, cpu_only: bool) -> dict:
    """Everything for one architecture; returns a JSON-able result."""
    import torch

    t0 = time.time()
    result: dict = {"arch": model_type, "cpu_ok": False}
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    result["class"] = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    # CPU reference, through the variant ladder: the first variant whose three CPU
    # references run with a static cache; else the first that runs with the default cache;
    # else (not counted) the one with the fewest CPU failures
    ref = None
    fallback = None
    attempts = []
    for variant in VARIANTS:
        candidate = _cpu_reference(model_type, model_type, variant)
        attempts.append((variant[0], dict(candidate["errors"])))
        if not candidate["errors"] and candidate.get("static"):
            ref = candidate
            break
        if not candidate["errors"]:
            fallback = fallback or candidate
        elif fallback is None and (ref is None or len(candidate["errors"]) < len(ref["errors"])):
            ref = candidate
    if ref is None or ref["errors"]:
        ref = fallback or ref
    result["variant"] = ref["variant"]
    result["notes"] = ref["notes"]
    result["params"] = ref.get("params")
    result["cpu_errors"] = ref["errors"]
    if ref["errors"]:
        result["cpu_attempts"] = attempts
    result["cpu_ok"] = not ref["errors"]
    result["static"] = ref.get("static")
    if "static_error" in ref:
        result["static_error"] = ref["static_error"]
    if cpu_only or "model" not in ref:
        result["seconds"] = round(time.time() - t0, 1)
        return result
    model, ids = ref["model"], ref["ids"]
    checks: dict = {}
    # (a) fp32 forward
    _stage(model_type, "neuron copy")
    try:
        dev = copy.deepcopy(model).to("neuron")
    except Exception as exc:  # noqa: BLE001
        reason = "model.to('neuron'): " + _located(exc)
        keys = ["fp32", "generate", "bf16"]
        if compiled and ref.get("static"):
            keys.append("compiled")
        result["checks"] = {k: {"ok": False, "reason": reason} for k in keys}
        result["seconds"] = round(time.time() - t0, 1)
        return result
    dev_ids = ids.to("neuron")
    if "fp32" in ref:
        _stage(model_type, "neuron fp32 forward")
        try:
            checks["fp32"] = _compare(_forward(dev, dev_ids), ref["fp32"], FP32_TOL)
        except Exception as exc:  # noqa: BLE001
            checks["fp32"] = {"ok": False, "reason": _located(exc)}
    # (b) greedy generate, same cache kind as the CPU reference
    if "generate" in ref:
        _stage(model_type, "neuron generate")
        try:
            got = _generate(dev, dev_ids, static=ref["static"], compile_path=False)
            checks["generate"] = _same_tokens(got, ref["generate"])
        except Exception as exc:  # noqa: BLE001
            checks["generate"] = {"ok": False, "reason": _located(exc)}
    # (b') the same, the default way: compiled (before bf16, which casts `dev` in place)
    if "generate" in ref and compiled and ref.get("static"):
        _stage(model_type, "neuron compiled generate")
        try:
            checks["compiled"] = _compiled_generate_check(dev, dev_ids, ref["generate"])
        except Exception as exc:  # noqa: BLE001
            checks["compiled"] = {"ok": False, "reason": _located(exc)}
    # (c) bf16 forward: the neuron model cast on the device
    if "bf16" in ref:
        _stage(model_type, "neuron bf16 forward")
        try:
            dev = dev.to(torch.bfloat16)
            checks["bf16"] = _compare(_forward(dev, dev_ids), ref["bf16"], BF16_TOL)
        except Exception as exc:  # noqa: BLE001
            checks["bf16"] = {"ok": False, "reason": _located(exc)}
    result["checks"] = checks
    result["seconds"] = round(time.time() - t0, 1)
    del dev, model, ref
    return result


def worker_main(args) -> None:
    """Reads architecture names on stdin, prints one tagged JSON result per name."""
    for attempt in range(30):
        try:
            import torch
            import transformers  # noqa: F401

            if not args.cpu_only:
                torch.empty(1, device="neuron")
            break
        except Exception:  # noqa: BLE001
            # another engineer may be rebuilding the extension: wait and retry
            if attempt == 29:
                raise
            time.sleep(10)
    import torch

    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    print(READY_TAG, flush=True)
    for line in sys.stdin:
        name, _, compiled = line.strip().partition(" ")
        if not name:
            continue
        try:
            result = run_architecture(name, compiled == "compiled", args.cpu_only)
        except Exception as exc:  # noqa: BLE001
            result = {"arch": name, "cpu_ok": False, "cpu_errors": {"harness": _short(exc)}}
        try:
            import torch._dynamo

            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass
        gc.collect()
        print(RESULT_TAG + json.dumps(result, default=str), flush=True)


# ------------------------------------------------------------------------------------------
# Parent: workers with time limits, report
# ------------------------------------------------------------------------------------------
