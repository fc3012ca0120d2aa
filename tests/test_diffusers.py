"""Diffusers pipelines on neuron against the CPU: eager, compiled, loading and offloading.

The pipelines (tests/support/diffusers_fixtures.py) are small, random and built from configs, with
prompt embeddings instead of text encoders (MiniMax-H3's pipeline runs a tiny one); every run
is 2 denoising steps from seed 0.
Tolerances: neuron runs PyTorch's CPU kernels under TORCHNEURON_NATIVE_KERNELS=0, so a
pipeline then computes the CPU's numbers bit for bit, except where Diffusers itself takes
another path for a "neuron" device. One such path matters here: Diffusers computes rotary
frequencies in float32 instead of float64 for neuron (``maybe_adjust_dtype_for_device``:
neuron is in its ``_FP64_UNSUPPORTED_DEVICES``), which moves FLUX.1 and FLUX.2 outputs
(values in [0, 1]) by up to ~2.4e-7. With the native kernels (the default) softmax, SiLU and
the GEMMs round float32 differently from the CPU's, by an amount that depends on the host's
instruction set. Those comparisons are normwise (tests/support/tolerance.py) within
ROUNDING_BUDGET units of rounding. Neuron runs against neuron runs (offloading, loading)
compare exactly.
The tensor-parallel tests are in tests/test_diffusers_parallel.py.
"""

from __future__ import annotations

import pytest
import torch
from diffusers import DiffusionPipeline, FluxTransformer2DModel
from support.diffusers_fixtures import CASES, build_flux, compiled_vs_eager, flux_inputs, run
from support.minimax_h3_fixtures import (
    build_minimax_h3,
    minimax_h3_inputs,
    minimax_h3_transformer,
    run_minimax_h3,
)
from support.tolerance import assert_matches_cpu, assert_normwise_close

EXACT = {"rtol": 0.0, "atol": 0.0}
# The kernels' per-element bound (a few units, tests/support/tolerance.py) times 8 for two
# denoising steps of a network whose outputs feed its next step.
ROUNDING_BUDGET = 32.0


@pytest.fixture(scope="module")
def cpu_outputs() -> dict[str, torch.Tensor]:
    """Each case's CPU output with a CPU generator: the reference for every neuron run."""
    return {name: run(case.build(), case.inputs(), "cpu") for name, case in CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_eager_matches_cpu(name: str, cpu_outputs: dict[str, torch.Tensor]) -> None:
    case = CASES[name]
    pipe = case.build().to("neuron")
    # The user's generator is a neuron one; Diffusers draws the latents on the host with it.
    got = run(pipe, case.inputs(), "neuron", generator_device="neuron")
    if name.startswith("flux"):  # the float32 rotary path, with or without native kernels
        assert_normwise_close(got, cpu_outputs[name], ROUNDING_BUDGET)
    else:
        assert_matches_cpu(got, cpu_outputs[name], ROUNDING_BUDGET)
    # A CPU generator gives the same latents (the neuron generator's engine is the CPU's).
    again = run(pipe, case.inputs(), "neuron", generator_device="cpu")
    torch.testing.assert_close(again, got, **EXACT)


# Compiling costs ~15-25 s per graph on 2 cores (Dynamo's trace and Inductor's C++, not the
# run), so the suite compiles the two models the benchmark measures; the same check for every
# case is `python tests/support/diffusers_fixtures.py` (docs/diffusers.md has its results).
@pytest.mark.parametrize("name", ["flux", "qwenimage"])
def test_compiled_matches_eager_one_compile_per_resolution(name: str) -> None:
    diffs, compiles = compiled_vs_eager(CASES[name])
    # Inductor fuses elementwise work and may reorder float reductions: not bitwise.
    assert max(diffs) <= 1e-5, diffs
    assert compiles == 2, torch.neuron.get_dynamo_metrics()  # two resolutions


def test_from_pretrained_device_map_neuron(tmp_path) -> None:
    pipe = build_flux()
    expected = run(pipe, flux_inputs(), "cpu")
    pipe.save_pretrained(tmp_path)
    no_text = dict.fromkeys(["text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"])
    loaded = DiffusionPipeline.from_pretrained(tmp_path, device_map="neuron", **no_text)
    assert loaded.transformer.device.type == "neuron"
    assert loaded.vae.device.type == "neuron"
    assert_normwise_close(run(loaded, flux_inputs(), "neuron"), expected, ROUNDING_BUDGET)
    # The model class alone, too.
    transformer = FluxTransformer2DModel.from_pretrained(
        tmp_path / "transformer", device_map="neuron"
    )
    assert {p.device.type for p in transformer.parameters()} == {"neuron"}
    loaded_state = transformer.state_dict()
    for name, a in pipe.transformer.state_dict().items():
        torch.testing.assert_close(loaded_state[name].cpu(), a, **EXACT, msg=name)


def _output_devices(module: torch.nn.Module) -> list[str]:
    """Records the device of each output ``module`` computes (the proof it ran on neuron)."""
    seen: list[str] = []
    module.register_forward_hook(lambda m, args, out: seen.append(out.device.type))
    return seen


@pytest.mark.parametrize("name", ["flux", "wan"])
def test_model_cpu_offload_matches_no_offload(name: str) -> None:
    case = CASES[name]
    expected = run(case.build().to("neuron"), case.inputs(), "neuron")
    pipe = case.build()
    pipe.enable_model_cpu_offload(device="neuron")
    seen = _output_devices(getattr(pipe, case.denoiser).proj_out)
    got = run(pipe, case.inputs(), "neuron")
    torch.testing.assert_close(got, expected, **EXACT)
    assert seen and set(seen) == {"neuron"}, seen
    # Offloaded after the run: the denoiser's weights are back on the host.
    assert getattr(pipe, case.denoiser).device.type == "cpu"


@pytest.mark.parametrize("offload_type", ["block_level", "leaf_level"])
def test_group_offload_matches_no_offload(offload_type: str) -> None:
    case = CASES["flux"]
    expected = run(case.build().to("neuron"), case.inputs(), "neuron")
    pipe = case.build()
    pipe.enable_group_offload(
        onload_device=torch.device("neuron"),
        offload_type=offload_type,
        num_blocks_per_group=1 if offload_type == "block_level" else None,
    )
    seen = _output_devices(pipe.transformer.proj_out)
    got = run(pipe, case.inputs(), "neuron")
    assert seen and set(seen) == {"neuron"}, seen
    torch.testing.assert_close(got, expected, **EXACT)
    assert {p.device.type for p in pipe.transformer.parameters()} == {"cpu"}


# MiniMax-H3's transformer (joint video and audio over one packed sequence), alone on a packed
# sequence laid out as the pipeline lays it out: its velocities, before the decoders.
def _minimax_h3(model: torch.nn.Module, device: str) -> tuple[torch.Tensor, ...]:
    inputs = {k: v.to(device) for k, v in minimax_h3_inputs().items()}
    with torch.no_grad():
        return tuple(t.cpu() for t in model(**inputs, return_dict=False))


def test_minimax_h3_transformer_matches_cpu() -> None:
    model = minimax_h3_transformer()
    expected = _minimax_h3(model, "cpu")
    got = _minimax_h3(model.to("neuron"), "neuron")
    for g, e in zip(got, expected, strict=True):  # video and audio velocities
        assert_matches_cpu(g, e, ROUNDING_BUDGET)


def test_minimax_h3_pipeline_compiles_once_per_transformer_signature() -> None:
    """The t2va pipeline with its transformer compiled in place (fullgraph), at two resolutions
    (two packed layouts) and then the first again: video and audio within 1e-5 (largest
    element) of eager on neuron. The pipeline calls its transformer with one timestep at the
    first step and two after it (video and audio rows on their own schedules), so each
    resolution has two transformer signatures: two compiles per resolution, and none for the
    repeated one."""
    pipe = build_minimax_h3()
    sizes = [(32, 32), (32, 64), (32, 32)]
    eager = {size: run_minimax_h3(pipe, "neuron", *size) for size in set(sizes)}
    pipe.transformer.compile(backend="neuron", fullgraph=True)
    torch._dynamo.reset()
    before = torch.neuron.get_dynamo_metrics()["compiles"]
    compiles = []
    for size in sizes:
        for g, e in zip(run_minimax_h3(pipe, "neuron", *size), eager[size], strict=True):
            # Inductor fuses elementwise work and may reorder float reductions: not bitwise
            assert (g - e).abs().max().item() <= 1e-5
        compiles.append(torch.neuron.get_dynamo_metrics()["compiles"] - before)
    assert compiles == [2, 4, 4]


def test_minimax_h3_pipeline_eager_matches_cpu() -> None:
    """The whole t2va modular pipeline (text encoder, denoising loop, video and audio decoders;
    tests/support/minimax_h3_fixtures.py::build_minimax_h3) on neuron with a neuron generator
    against the same pipeline on the CPU: video and audio compared as test_eager_matches_cpu."""
    pipe = build_minimax_h3()
    expected = run_minimax_h3(pipe, "cpu")
    got = run_minimax_h3(pipe, "neuron", generator_device="neuron")
    for g, e in zip(got, expected, strict=True):  # video, audio
        assert_matches_cpu(g, e, ROUNDING_BUDGET)
