"""torch.compile with backend="neuron": Inductor's C++ code over device memory.

References: the same model or function run eagerly on CPU with the same weights and
inputs. Tolerances: float32 forward and gradients within atol 1e-5 / rtol 1e-4 (Inductor
fuses and reorders float reductions, so bitwise equality is not expected).
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch._dynamo
from conftest import describe, run_python, tiny_llama

import torchneuron.compile.backend as neuron_compile

TOL = {"atol": 1e-5, "rtol": 1e-4}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    yield
    torch._dynamo.reset()


def test_backend_is_listed():
    assert "neuron" in torch._dynamo.list_backends()


def test_function_matches_cpu_and_stays_on_device():
    def f(x, w):
        return torch.nn.functional.gelu(x @ w).sum(-1) + x.exp().mean()

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 16, generator=g)
    torch.neuron.clear_op_tracking()
    got = torch.compile(f, backend="neuron", fullgraph=True)(x.to("neuron"), w.to("neuron"))
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), f(x, w), **TOL)
    # outputs are born in device memory: nothing was copied in through a host fallback
    assert torch.neuron.get_fallback_ops() == {}
    assert torch.neuron.get_dynamo_metrics()["host_graphs"] >= 1


def test_graph_on_second_device_and_input_views():
    def f(x):
        y = x.transpose(0, 1)  # an output that is a view of the input
        return y, (x * 2).sum(0)

    x = torch.arange(12.0).reshape(3, 4)
    view, total = torch.compile(f, backend="neuron")(x.to("neuron:1"))
    assert view.device == torch.device("neuron:1") and total.device == torch.device("neuron:1")
    torch.testing.assert_close(view.cpu(), x.t())
    torch.testing.assert_close(total.cpu(), (x * 2).sum(0))


def test_input_mutation_lands_in_device_memory():
    def f(buf, x):
        buf.add_(x)
        return buf * 2

    buf = torch.zeros(5, device="neuron")
    x = torch.arange(5.0)
    out = torch.compile(f, backend="neuron")(buf, x.to("neuron"))
    torch.testing.assert_close(buf.cpu(), x)
    torch.testing.assert_close(out.cpu(), 2 * x)


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    )


def test_training_step_matches_cpu():
    torch.manual_seed(0)
    cpu = _mlp()
    dev = _mlp()
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-2)
    compiled = torch.compile(dev, backend="neuron")
    x = torch.randn(8, 16)
    for _ in range(3):
        for model, opt, inp in ((cpu, opt_cpu, x), (compiled, opt_dev, x.to("neuron"))):
            opt.zero_grad()
            model(inp).square().mean().backward()
            opt.step()
    for p, q in zip(cpu.parameters(), dev.parameters(), strict=True):
        assert q.device.type == "neuron" and q.grad.device.type == "neuron"
        torch.testing.assert_close(q.cpu(), p.detach(), **TOL)


ARCHITECTURES = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "phi3", "gpt2"]


def _tiny_causal_lm(arch: str):  # noqa: ANN202 - transformers type
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = {
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "max_position_embeddings": 64,
        # GPT-2 spells them differently
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 64,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    config = AutoConfig.for_model(arch, **sizes)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()  # eval: no dropout


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_causal_lm_forward_backward_matches_eager(arch):
    cpu = _tiny_causal_lm(arch)
    dev = _tiny_causal_lm(arch)
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    ids = torch.randint(3, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    expected = cpu(ids, labels=ids)
    expected.loss.backward()
    got = torch.compile(dev, backend="neuron")(ids.to("neuron"), labels=ids.to("neuron"))
    got.loss.backward()
    torch.testing.assert_close(got.logits.cpu(), expected.logits, **TOL)
    torch.testing.assert_close(got.loss.cpu(), expected.loss, **TOL)
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters(), strict=True):
        if p.grad is None:
            assert q.grad is None, name
            continue
        torch.testing.assert_close(q.grad.cpu(), p.grad, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_shape_change_recompiles_static_once_and_says_why(caplog):
    def f(x):
        return torch.softmax(x, dim=-1) * 3

    compiled = torch.compile(f, backend="neuron")
    a, b = torch.randn(2, 16), torch.randn(2, 24)
    with caplog.at_level(logging.WARNING, logger="torchneuron.compile"):
        for x in (a, b, a, b):  # two signatures, each compiled once and then reused
            torch.testing.assert_close(compiled(x.to("neuron")).cpu(), f(x), **TOL)
    metrics = torch.neuron.get_dynamo_metrics()
    assert metrics["compiles"] == 2
    assert metrics["host_graphs"] == 2  # inference graphs: one per signature
    assert metrics["cache_hits"] + metrics["cache_misses"] == 2
    assert metrics["recompiles"] == 1
    assert metrics["recompile_reasons"] == ["input L['x'] changed from shape (2, 16) to (2, 24)"]
    lines = [r.getMessage() for r in caplog.records if r.name == "torchneuron.compile"]
    assert len(lines) == 1
    assert "L['x']" in lines[0] and "multiple of 128" in lines[0]
    # automatic dynamic shapes stayed off: the second graph is static too
    assert torch._dynamo.config.automatic_dynamic_shapes is False

    torch.neuron.reset_dynamo_metrics()
    cleared = torch.neuron.get_dynamo_metrics()
    assert cleared["compiles"] == cleared["recompiles"] == cleared["cache_misses"] == 0
    assert cleared["recompile_reasons"] == []


def test_dynamic_true_is_refused_with_the_alternative():
    compiled = torch.compile(lambda x: x * 2, backend="neuron", dynamic=True)
    with pytest.raises(Exception, match="dynamic=False.*pad or bucket"):
        compiled(torch.randn(4, 8, device="neuron"))


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])
def test_other_modes_are_refused_with_the_alternative(mode):
    compiled = torch.compile(lambda x: x + 1, backend="neuron", mode=mode)
    with pytest.raises(Exception, match='mode="default"'):
        compiled(torch.randn(3, device="neuron"))


def test_options_are_refused():
    with pytest.raises(neuron_compile.NeuronCompileError, match="backend='inductor'"):
        neuron_compile._reject_options({"options": {"max_autotune": True}})


# Ops from the conformance harness's OpInfo database; the first three float32 samples of
# each, compiled (forward) and compared with the same op run eagerly on neuron.
COMPILED_OPS = [
    "add",
    "mul",
    "div.no_rounding_mode",
    "exp",
    "tanh",
    "where",
    "sum",
    "mean",
    "amax",
    "softmax",
    "nn.functional.layer_norm",
    "nn.functional.gelu",
    "matmul",
    "cat",
    "transpose",
]


@pytest.fixture(scope="module")
def opinfos():
    from devtools import op_coverage

    return op_coverage.ops_by_key()


@pytest.mark.parametrize("key", COMPILED_OPS)
def test_opinfo_samples_compiled_match_eager(key, opinfos):
    from devtools import op_coverage

    opinfo = opinfos[key]
    samples = op_coverage.generate_samples(opinfo, "float32", op_coverage.FORWARD)[:3]
    assert samples, key
    for sample in samples:
        torch._dynamo.reset()
        inp, args, kwargs = op_coverage.neuron_copy(opinfo, sample)
        expected = opinfo.op(inp, *args, **kwargs)
        got = torch.compile(
            lambda x, *a, **k: opinfo.op(x, *a, **k), backend="neuron", fullgraph=True
        )(inp, *args, **kwargs)
        for e, g in zip(op_coverage.tensors(expected), op_coverage.tensors(got), strict=True):
            assert g.device == e.device, key
            torch.testing.assert_close(g.cpu(), e.cpu(), **TOL)


def test_trainer_torch_compile_picks_neuron_and_trains_like_eager(tmp_path):
    """Transformers' Trainer(torch_compile=True) on the device asks Accelerate for the
    "neuron" backend (its own code); three steps equal three eager steps."""
    import copy

    from transformers import Trainer, TrainingArguments

    base = tiny_llama()
    ids = torch.randint(0, 64, (12, 16), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    states = {}
    for compiled in (False, True):
        model = copy.deepcopy(base)
        args = TrainingArguments(
            output_dir=str(tmp_path / str(compiled)),
            torch_compile=compiled,
            max_steps=3,
            per_device_train_batch_size=2,
            learning_rate=1e-3,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            seed=0,
        )
        if compiled:
            assert args.torch_compile_backend == "neuron"
        assert args.device.type == "neuron"
        torch.neuron.reset_dynamo_metrics()
        trainer = Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
        if compiled:
            assert isinstance(trainer.model_wrapped, torch._dynamo.eval_frame.OptimizedModule)
            assert torch.neuron.get_dynamo_metrics()["compiles"] >= 1
        states[compiled] = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    for name, value in states[False].items():
        torch.testing.assert_close(states[True][name], value, **TOL, msg=name)


def test_default_inductor_compiles_neuron_tensors():
    """Plain torch.compile (Inductor) on neuron tensors: the device is registered with Dynamo
    and Inductor, whose C++ kernels write device memory; forward and backward equal CPU."""
    from torch._dynamo.device_interface import get_interface_for_device

    def f(x, w):
        return torch.nn.functional.gelu(x @ w).sum(-1) + torch.softmax(x, -1).amax()

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 16, generator=g)
    torch.neuron.clear_op_tracking()
    got = torch.compile(f)(x.to("neuron"), w.to("neuron"))
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), f(x, w), **TOL)
    assert get_interface_for_device("neuron").device_count() == torch.neuron.device_count()
    assert torch.neuron.get_fallback_ops() == {}

    torch.manual_seed(0)
    cpu = _mlp()
    dev = _mlp()
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    cpu(x).square().mean().backward()
    torch.compile(dev)(x.to("neuron")).square().mean().backward()
    for p, q in zip(cpu.parameters(), dev.parameters(), strict=True):
        assert q.grad.device.type == "neuron"
        torch.testing.assert_close(q.grad.cpu(), p.grad, **TOL)


@pytest.mark.host_isa_only
@pytest.mark.launch_mode_independent
def test_graph_runs_with_the_device_core_budget(tmp_path):
    """A large compiled graph's Inductor loops name the device's core budget (on a host the
    task board covers: the caller's and the idle worker's cores), the PyTorch kernels it calls
    see that count, and the caller's own count is back after the call; a small graph runs
    on one thread there (its products get the second core through the board), elsewhere on
    the caller's count."""
    result = run_python(
        """
        import glob, os, torch, torchneuron
        torch.set_num_threads(1)
        budget = torchneuron._C._compiled_graph_threads()

        @torch.library.custom_op("budget_test::plus_threads", mutates_args=())
        def plus_threads(x: torch.Tensor) -> torch.Tensor:
            return x + torch.get_num_threads()

        @plus_threads.register_fake
        def _(x):
            return torch.empty_like(x)

        def f(x):
            return plus_threads((x * 2).sum(1))

        x = torch.randn(256, 4096)  # 2^20 elements: a large graph
        got = torch.compile(f, backend="neuron")(x.to("neuron")).cpu()
        torch.testing.assert_close(got, (x * 2).sum(1) + budget, rtol=1e-5, atol=1e-3)
        assert torch.get_num_threads() == 1, torch.get_num_threads()
        # a small graph (a decode step's size) with torch's two threads: one thread where
        # the board covers the CPUs (the worker shares its products), else the caller's
        torch.set_num_threads(2)
        small_budget = torchneuron._C._small_compiled_graph_threads()
        small = torch.randn(16, 64)
        got = torch.compile(lambda x: f(x) * 1, backend="neuron")(small.to("neuron")).cpu()
        torch.testing.assert_close(got, (small * 2).sum(1) + small_budget, rtol=1e-5, atol=1e-5)
        assert torch.get_num_threads() == 2, torch.get_num_threads()
        root = torchneuron.compile.backend.neff_cache().root
        files = [p for p in glob.glob(f"{root}/**/*", recursive=True) if os.path.isfile(p)]
        named = any(f"num_threads({budget})" in open(p, errors="replace").read() for p in files)
        print("budget", budget, "cpus", len(os.sched_getaffinity(0)), named, small_budget)
        """,
        env={"TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, describe(result)
    words = result.stdout.split()
    budget, cpus, named, small_budget = int(words[1]), int(words[3]), words[4], int(words[5])
    assert budget == (max(1, cpus) if cpus <= 2 else 1), result.stdout
    assert small_budget == (1 if cpus <= 2 else 2), result.stdout
    assert named == "True", describe(result)
