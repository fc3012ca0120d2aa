"""torch.autocast("neuron") applies CUDA's autocast policy, op by op.

The reference is PyTorch's own: the per-op lists that test_cuda.py runs against CUDA
(torch.testing._internal.autocast_test_lists.AutocastTestLists: lower precision, float32,
promote, built-in promotion, banned), here instantiated on neuron, and the dispatch table's
AutocastCUDA entries. Each op must produce the list's dtype and be bitwise equal to the same
op run without autocast on inputs cast by hand (as test_cuda.py checks).
"""

from __future__ import annotations

import collections.abc

import pytest
import torch
import torch.nn.functional as F

from devtools import conformance

conformance.ensure_expecttest()  # PyTorch's test helpers import it; not installed here
from torch.testing._internal.autocast_test_lists import AutocastTestLists  # noqa: E402

LOW = [torch.float16, torch.bfloat16]
# CUDA-only kernels (cuDNN) that have no meaning on another device.
CUDA_ONLY = {"aten::cudnn_convolution", "aten::cudnn_convolution_transpose"}


@pytest.fixture(scope="module")
def lists():
    torch.manual_seed(0)
    return AutocastTestLists(torch.device("neuron"))


def _cast(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, str):
        return value
    if isinstance(value, collections.abc.Iterable):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.device.type == "neuron" and torch.equal(a, b)
    if isinstance(a, collections.abc.Iterable):
        return all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _entries(items):
    """(op, args, extra) of a list, skipping what test_cuda.py skips on CUDA itself: entries
    whose third element is a true skip flag (cuDNN on ROCm; the malformed einsum entry, which
    test_cuda.py skips the same way and test_einsum_runs_in_lower_precision covers)."""
    for item in items:
        op, args = item[0], item[1]
        extra = item[2] if len(item) > 2 else None
        if extra is not None and not isinstance(extra, torch.dtype) and extra:
            continue
        if f"aten::{op}" in CUDA_ONLY:
            continue
        yield op, args, extra


def _run(op, args, run_as, out_type, module, amp_dtype):
    """test_cuda.py's _run_autocast_outofplace: dtype of torch.* and Tensor.* variants under
    autocast, and bitwise equality with the op run without autocast on cast inputs."""
    with torch.autocast("neuron", dtype=amp_dtype):
        assert torch.is_autocast_enabled("neuron")
        output = method_output = None
        if module is not None and hasattr(module, op):
            output = getattr(module, op)(*args)
            if isinstance(output, torch.Tensor):
                assert output.dtype == out_type, f"{module.__name__}.{op}: {output.dtype}"
        if hasattr(torch.Tensor, op):
            method_output = getattr(args[0], op)(*args[1:])
            if isinstance(method_output, torch.Tensor):
                assert method_output.dtype == out_type, f"Tensor.{op}: {method_output.dtype}"
        assert output is not None or method_output is not None, f"{op} not found"
        if output is not None and method_output is not None:
            assert _equal(output, method_output), f"torch.{op} != Tensor.{op}"
        result = output if output is not None else method_output
        with torch.autocast("neuron", enabled=False):
            if module is not None and hasattr(module, op):
                control = getattr(module, op)(*_cast(args, run_as))
            else:
                control = getattr(args[0].to(run_as), op)(*_cast(args[1:], run_as))
        assert _equal(result, control), f"{op} under autocast differs from cast-by-hand control"


@pytest.mark.parametrize("amp_dtype", LOW, ids=str)
@pytest.mark.parametrize(
    "name, module",
    [
        ("torch_fp16", torch),
        ("nn_fp16", torch._C._nn),
        ("linalg_fp16", torch._C._linalg),
        ("methods_fp16", None),
    ],
)
def test_lower_precision_ops(lists, name, module, amp_dtype):
    for op, args, _ in _entries(getattr(lists, name)):
        _run(op, args, amp_dtype, amp_dtype, module, amp_dtype)


@pytest.mark.parametrize("amp_dtype", LOW, ids=str)
@pytest.mark.parametrize(
    "name, module", [("torch_fp32", torch), ("nn_fp32", torch._C._nn), ("methods_fp32", None)]
)
def test_float32_ops(lists, name, module, amp_dtype):
    for op, args, _ in _entries(getattr(lists, name)):
        _run(op, args, torch.float32, torch.float32, module, amp_dtype)


def test_promote_ops(lists):
    # The list mixes float16 with float32 inputs, so (as on CUDA) it runs under float16
    # autocast (under bfloat16 autocast a float16 input to a promote op is refused).
    for op, args, _ in _entries(lists.torch_need_autocast_promote):
        _run(op, args, torch.float32, torch.float32, torch, torch.float16)


@pytest.mark.parametrize("amp_dtype", LOW, ids=str)
def test_einsum_runs_in_lower_precision(amp_dtype):
    a = torch.randn(2, 3, 4, 5, device="neuron")
    b = torch.randn(2, 6, 4, 5, device="neuron")
    with torch.autocast("neuron", dtype=amp_dtype):
        out = torch.einsum("bkhd,bqhd->bqkh", a, b)
    assert out.dtype == amp_dtype
    control = torch.einsum("bkhd,bqhd->bqkh", a.to(amp_dtype), b.to(amp_dtype))
    assert torch.equal(out, control)


@pytest.mark.parametrize("amp_dtype", LOW, ids=str)
@pytest.mark.parametrize(
    "name, module",
    [("torch_expect_builtin_promote", torch), ("methods_expect_builtin_promote", None)],
)
def test_builtin_promotion_ops(lists, name, module, amp_dtype):
    for op, args, out_type in _entries(getattr(lists, name)):
        _run(op, args, torch.float32, out_type, module, amp_dtype)


@pytest.mark.parametrize("amp_dtype", LOW, ids=str)
def test_banned_ops_raise(lists, amp_dtype):
    """binary_cross_entropy is refused under autocast, as on CUDA (regression: it ran)."""
    assert lists.banned, "the reference list of banned ops is empty"
    for op, args, module in lists.banned:
        with torch.autocast("neuron", dtype=amp_dtype):
            with pytest.raises(RuntimeError, match="unsafe to autocast"):
                getattr(module, op)(*args)
    x, y = torch.rand(4, device="neuron"), torch.rand(4, device="neuron")
    with torch.autocast("neuron", dtype=amp_dtype):
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(x, y)
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            torch.nn.BCELoss()(x, y)
        # the safe form runs, in float32 as on CUDA
        assert F.binary_cross_entropy_with_logits(x, y).dtype == torch.float32
    # without autocast it is an ordinary op, equal to the CPU
    torch.testing.assert_close(
        F.binary_cross_entropy(x, y).cpu(), F.binary_cross_entropy(x.cpu(), y.cpu()), rtol=0, atol=0
    )


def _ops_with_kernel(key: str) -> set[str]:
    return {
        op
        for op in torch._C._dispatch_get_all_op_names()
        if torch._C._dispatch_has_kernel_for_dispatch_key(op, key)
    }


def test_policy_table_matches_cuda():
    """Every op CUDA's autocast treats explicitly has a neuron autocast kernel, and no other."""
    cuda = _ops_with_kernel("AutocastCUDA")
    neuron = _ops_with_kernel("AutocastPrivateUse1")
    assert len(cuda) > 100, "the CUDA autocast table is not registered in this torch build"
    assert cuda - neuron == CUDA_ONLY
    # The CPU's LSTM kernel, which neuron's recurrent layers share with the CPU: lower
    # precision, as CPU autocast has it (CUDA lists its own RNN kernel, _cudnn_rnn, instead).
    assert neuron - cuda == {"aten::mkldnn_rnn_layer"}
    assert "aten::mkldnn_rnn_layer" in _ops_with_kernel("AutocastCPU")
