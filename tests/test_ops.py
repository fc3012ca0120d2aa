"""The ATen op surface on neuron, forward and backward, checked against the CPU."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import pytest
import torch
import torch.nn.functional as F

# The neuron device runs PyTorch's CPU kernels over device memory, so float32 results are
# expected to match the CPU closely; these are float32 tolerances all the same.
FP32 = {"rtol": 1e-5, "atol": 1e-5}
BF16 = {"rtol": 1.6e-2, "atol": 1e-2}
FP16 = {"rtol": 1e-3, "atol": 1e-3}
EXACT = {"rtol": 0, "atol": 0}

DEVICE = torch.device("neuron:0")


class Const:
    """Wraps an input that must not require grad (buffers, indices-like floats)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def pos(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) + 0.5


def idx(high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape)


def flat(out: object) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Sequence):  # tuples, lists, named tuples
        return [t for item in out for t in flat(item)]
    return []


def prepare(inputs: list, device: torch.device | str, grad: bool) -> tuple[list, list]:
    args, leaves = [], []
    for item in inputs:
        if isinstance(item, Const):
            args.append(item.tensor.detach().clone().to(device))
        elif isinstance(item, torch.Tensor):
            t = item.detach().clone().to(device)
            if grad and t.is_floating_point():
                t.requires_grad_(True)
                leaves.append(t)
            args.append(t)
        else:
            args.append(item)
    return args, leaves


def check(fn: Callable, inputs: list, tol: dict | None = None, grad: bool = True) -> None:
    """Runs fn on CPU and on neuron; compares outputs, then input gradients."""
    tol = tol or FP32
    cpu_args, cpu_leaves = prepare(inputs, "cpu", grad)
    dev_args, dev_leaves = prepare(inputs, DEVICE, grad)
    cpu_out = flat(fn(*cpu_args))
    dev_out = flat(fn(*dev_args))
    assert len(cpu_out) == len(dev_out) > 0
    for c, d in zip(cpu_out, dev_out, strict=True):
        assert d.device == DEVICE, f"result on {d.device}"
        assert d.dtype == c.dtype
        torch.testing.assert_close(d.detach().cpu(), c.detach(), **tol)
    # Mutated inputs (in-place ops, buffers) must match too.
    for c, d in zip(cpu_args, dev_args, strict=True):
        if isinstance(c, torch.Tensor):
            torch.testing.assert_close(d.detach().cpu(), c.detach(), **tol)
    if not grad or not cpu_leaves:
        return
    pairs = [(c, d) for c, d in zip(cpu_out, dev_out, strict=True) if c.requires_grad]
    if not pairs:
        return
    generator = torch.Generator().manual_seed(1234)
    cpu_loss = 0.0
    dev_loss = 0.0
    for c, d in pairs:
        w = torch.randn(c.shape, generator=generator, dtype=c.dtype)
        cpu_loss = cpu_loss + (c * w).sum()
        dev_loss = dev_loss + (d * w.to(DEVICE)).sum()
    cpu_loss.backward()
    dev_loss.backward()
    for c, d in zip(cpu_leaves, dev_leaves, strict=True):
        assert (c.grad is None) == (d.grad is None)
        if c.grad is not None:
            assert d.grad.device == DEVICE
            torch.testing.assert_close(d.grad.cpu(), c.grad, **tol)


# (function, input factory) per op; factories run after torch.manual_seed(0).
UNARY = {
    "abs": torch.abs,
    "neg": torch.neg,
    "exp": torch.exp,
    "log": lambda x: torch.log(x.abs() + 0.5),
    "sqrt": lambda x: torch.sqrt(x.abs() + 0.1),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.5),
    "reciprocal": lambda x: torch.reciprocal(x.abs() + 0.5),
    "log1p": lambda x: torch.log1p(x.abs()),
    "expm1": torch.expm1,
    "sin": torch.sin,
    "cos": torch.cos,
    "tan": lambda x: torch.tan(x * 0.5),
    "tanh": torch.tanh,
    "atan": torch.atan,
    "asin": lambda x: torch.asin(torch.tanh(x) * 0.9),
    "sigmoid": torch.sigmoid,
    "erf": torch.erf,
    "relu": torch.relu,
    "floor": torch.floor,
    "round": torch.round,
    "frac": torch.frac,
    "sign": torch.sign,
    "clamp": lambda x: torch.clamp(x, -0.5, 0.7),
    "pow2": lambda x: x**2,
    "pow3": lambda x: torch.pow(x, 3),
    "square": torch.square,
    "softplus": F.softplus,
    "hardtanh": F.hardtanh,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "elu": F.elu,
    "selu": F.selu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "mish": F.mish,
    "logsigmoid": F.logsigmoid,
    "hardswish": F.hardswish,
    "nan_to_num": lambda x: torch.nan_to_num(torch.log(x)),
}

BINARY = {
    "add": torch.add,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2.5),
    "sub": torch.sub,
    "rsub": lambda a, b: 1.5 - a + b,
    "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 0.5),
    "div_floor": lambda a, b: torch.div(a, b.abs() + 0.5, rounding_mode="floor"),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "atan2": torch.atan2,
    "pow": lambda a, b: torch.pow(a.abs() + 0.5, b),
    "fmod": lambda a, b: torch.fmod(a, b.abs() + 0.5),
    "remainder": lambda a, b: torch.remainder(a, b.abs() + 0.5),
    "hypot": torch.hypot,
    "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "where": lambda a, b: torch.where(a > b, a, b),
    "mul_scalar": lambda a, b: a * 3.0 + b / 2,
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.5),
    "addcdiv": lambda a, b: torch.addcdiv(a, a, b.abs() + 1, value=0.5),
    "eq": lambda a, b: torch.eq(a, a.round()) | (a > b),
    "lt": torch.lt,
    "ge": torch.ge,
    "logical_xor": lambda a, b: torch.logical_xor(a > 0, b > 0),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name):
    torch.manual_seed(0)
    check(UNARY[name], [r(4, 5)])


@pytest.mark.parametrize("name", list(UNARY)[:12])
def test_unary_non_contiguous_input(name):
    torch.manual_seed(1)
    check(lambda x: UNARY[name](x.t()[1:, ::2]), [r(6, 5)])


@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name):
    torch.manual_seed(0)
    check(BINARY[name], [r(4, 5), r(4, 5)])


@pytest.mark.parametrize("name", ["add", "mul", "div", "maximum", "where", "atan2"])
def test_binary_broadcast(name):
    torch.manual_seed(0)
    check(BINARY[name], [r(4, 1), r(1, 5)])


def test_integer_and_bool_ops():
    torch.manual_seed(0)
    a = torch.randint(-50, 50, (6, 7))
    b = torch.randint(1, 9, (6, 7))
    fns = [
        lambda a, b: a + b,
        lambda a, b: a * b,
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        lambda a, b: a // b,
        lambda a, b: a % b,
        lambda a, b: a & b,
        lambda a, b: a | b,
        lambda a, b: a ^ b,
        lambda a, b: a << 2,
        lambda a, b: a.sum(1),
        lambda a, b: a.cumsum(0),
        lambda a, b: a.max(1),
        lambda a, b: a.abs().argmax(),
        lambda a, b: (a > 0).sum(),
        lambda a, b: (a > 0) & (b > 3),
        lambda a, b: (a > 0).any(1),
        lambda a, b: (a > 0).all(),
        lambda a, b: torch.logical_not(a > 0),
        lambda a, b: a.to(torch.float32) / b,
        lambda a, b: torch.bincount(b.flatten()),
        lambda a, b: torch.unique(b, sorted=True),
    ]
    for fn in fns:
        check(fn, [a, b], tol=EXACT)
        check(fn, [a.to(torch.int32), b.to(torch.int32)], tol=EXACT)


# ---------------------------------------------------------------------------- reductions

REDUCTIONS = {
    "sum": lambda x: x.sum(),
    "sum_dim": lambda x: x.sum(1),
    "sum_dims_keepdim": lambda x: x.sum((0, 2), keepdim=True),
    "mean": lambda x: x.mean(0),
    "var": lambda x: x.var(1),
    "var_biased": lambda x: x.var(2, unbiased=False),
    "std": lambda x: x.std(),
    "var_mean": lambda x: torch.var_mean(x, 1),
    "max": lambda x: x.max(),
    "max_dim": lambda x: x.max(1),
    "min_dim": lambda x: x.min(2, keepdim=True),
    "amax": lambda x: x.amax((1, 2)),
    "argmax": lambda x: x.argmax(1),
    "argmin": lambda x: x.argmin(),
    "topk": lambda x: x.topk(3, dim=2),
    "topk_smallest": lambda x: x.topk(2, dim=1, largest=False),
    "sort": lambda x: x.sort(dim=2),
    "sort_desc": lambda x: x.sort(dim=0, descending=True),
    "argsort": lambda x: x.argsort(1),
    "kthvalue": lambda x: x.kthvalue(2, dim=2),
    "median": lambda x: x.median(1),
    "cumsum": lambda x: x.cumsum(2),
    "cumprod": lambda x: x.cumprod(1),
    "cummax": lambda x: x.cummax(2),
    "prod": lambda x: x.prod(2),
    "logsumexp": lambda x: x.logsumexp(1),
    "norm": lambda x: x.norm(),
    "norm_p1": lambda x: torch.linalg.vector_norm(x, ord=1, dim=2),
    "count_nonzero": lambda x: torch.count_nonzero(x > 0.3, dim=1),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reduction(name):
    torch.manual_seed(0)
    check(REDUCTIONS[name], [r(3, 4, 6)])


# ---------------------------------------------------------------------------- linear algebra


def conv_inputs() -> list:
    return [r(2, 3, 8, 8), r(4, 3, 3, 3), r(4)]


LINALG = {
    "matmul": (torch.matmul, lambda: [r(3, 4), r(4, 5)]),
    "matmul_batched_broadcast": (torch.matmul, lambda: [r(2, 3, 4), r(4, 5)]),
    "matmul_vec": (torch.matmul, lambda: [r(3, 4), r(4)]),
    "mm_transposed": (lambda a, b: a.t() @ b, lambda: [r(4, 3), r(4, 5)]),
    "bmm": (torch.bmm, lambda: [r(2, 3, 4), r(2, 4, 5)]),
    "baddbmm": (
        lambda c, a, b: torch.baddbmm(c, a, b, alpha=0.5),
        lambda: [r(2, 3, 5), r(2, 3, 4), r(2, 4, 5)],
    ),
    "addmm": (torch.addmm, lambda: [r(5), r(3, 4), r(4, 5)]),
    "linear": (F.linear, lambda: [r(2, 3, 4), r(5, 4), r(5)]),
    "einsum": (lambda a, b: torch.einsum("bij,bkj->bik", a, b), lambda: [r(2, 3, 4), r(2, 5, 4)]),
    "outer": (torch.outer, lambda: [r(3), r(4)]),
    "dot": (torch.dot, lambda: [r(6), r(6)]),
    "mv": (torch.mv, lambda: [r(3, 4), r(4)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1), conv_inputs),
    "conv2d_stride": (lambda x, w, b: F.conv2d(x, w, b, stride=2), conv_inputs),
    "conv2d_groups": (
        lambda x, w: F.conv2d(x, w, groups=2, dilation=2),
        lambda: [r(2, 4, 9, 9), r(6, 2, 3, 3)],
    ),
    "conv1d": (
        lambda x, w, b: F.conv1d(x, w, b, padding=2),
        lambda: [r(2, 3, 10), r(4, 3, 5), r(4)],
    ),
    "conv_transpose2d": (
        lambda x, w: F.conv_transpose2d(x, w, stride=2),
        lambda: [r(2, 3, 5, 5), r(3, 4, 3, 3)],
    ),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), lambda: [r(2, 3, 8, 8)]),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), lambda: [r(2, 3, 8, 8)]),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (3, 2)), lambda: [r(2, 3, 7, 8)]),
    "interpolate_bilinear": (
        lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
        lambda: [r(1, 2, 4, 5)],
    ),
    "pad_reflect": (lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"), lambda: [r(1, 2, 4, 5)]),
    "linalg_solve": (
        lambda a, b: torch.linalg.solve(a @ a.mT + 3 * torch.eye(4, device=a.device), b),
        lambda: [r(4, 4), r(4, 2)],
    ),
}


@pytest.mark.parametrize("name", list(LINALG))
def test_linear_algebra(name):
    torch.manual_seed(0)
    fn, factory = LINALG[name]
    check(fn, factory())


# ---------------------------------------------------------------------------- neural-network ops


def batch_norm_train(x, w, b, mean, var):
    return F.batch_norm(x, mean, var, w, b, training=True, momentum=0.1)


NN = {
    "softmax": (lambda x: F.softmax(x, dim=-1), lambda: [r(3, 4, 7)]),
    "softmax_dim0": (lambda x: F.softmax(x, dim=0), lambda: [r(3, 4, 7)]),
    "log_softmax": (lambda x: F.log_softmax(x, dim=1), lambda: [r(3, 4, 7)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (7,), w, b), lambda: [r(3, 4, 7), r(7), r(7)]),
    "layer_norm_2d": (lambda x: F.layer_norm(x, (4, 7)), lambda: [r(3, 4, 7)]),
    "rms_norm": (lambda x, w: F.rms_norm(x, (7,), w, eps=1e-6), lambda: [r(3, 4, 7), r(7)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), lambda: [r(2, 4, 5, 3), r(4), r(4)]),
    "batch_norm_train": (
        batch_norm_train,
        lambda: [r(6, 3, 4), r(3), r(3), Const(torch.zeros(3)), Const(torch.ones(3))],
    ),
    "batch_norm_eval": (
        lambda x, m, v: F.batch_norm(x, m, v, training=False),
        lambda: [r(6, 3), Const(r(3)), Const(pos(3))],
    ),
    "embedding": (lambda i, w: F.embedding(i, w), lambda: [idx(10, 3, 5), r(10, 4)]),
    "embedding_padding": (
        lambda i, w: F.embedding(i, w, padding_idx=0),
        lambda: [idx(10, 3, 5), r(10, 4)],
    ),
    "embedding_bag": (
        lambda i, w: F.embedding_bag(i, w, mode="mean"),
        lambda: [idx(10, 3, 5), r(10, 4)],
    ),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), lambda: [r(5, 7), idx(7, 5)]),
    "cross_entropy_3d_smooth": (
        lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1, ignore_index=2),
        lambda: [r(2, 7, 4), idx(7, 2, 4)],
    ),
    "cross_entropy_probs": (
        lambda x, p: F.cross_entropy(x, p.softmax(-1)),
        lambda: [r(5, 7), Const(r(5, 7))],
    ),
    "nll_loss": (
        lambda x, t: F.nll_loss(x.log_softmax(1), t, reduction="sum"),
        lambda: [r(5, 7), idx(7, 5)],
    ),
    "mse_loss": (F.mse_loss, lambda: [r(4, 5), r(4, 5)]),
    "l1_loss": (F.l1_loss, lambda: [r(4, 5), r(4, 5)]),
    "smooth_l1_loss": (F.smooth_l1_loss, lambda: [r(4, 5), r(4, 5)]),
    "bce_with_logits": (
        F.binary_cross_entropy_with_logits,
        lambda: [r(4, 5), Const(torch.rand(4, 5))],
    ),
    "kl_div": (
        lambda x, y: F.kl_div(
            x.log_softmax(-1), y.log_softmax(-1), log_target=True, reduction="batchmean"
        ),
        lambda: [r(4, 5), r(4, 5)],
    ),
    "normalize": (lambda x: F.normalize(x, dim=1), lambda: [r(4, 5)]),
    "cosine_similarity": (F.cosine_similarity, lambda: [r(4, 5), r(4, 5)]),
    "glu": (lambda x: F.glu(x, dim=-1), lambda: [r(3, 8)]),
    "dropout_eval": (lambda x: F.dropout(x, 0.5, training=False), lambda: [r(4, 5)]),
    "dropout_p0": (lambda x: F.dropout(x, 0.0, training=True), lambda: [r(4, 5)]),
    "one_hot": (lambda i: F.one_hot(i, 6), lambda: [idx(6, 4, 3)]),
    "triu_tril": (lambda x: x.triu(1) + x.tril(-1) * 2, lambda: [r(5, 5)]),
    "sdpa": (F.scaled_dot_product_attention, lambda: [r(2, 3, 6, 8), r(2, 3, 6, 8), r(2, 3, 6, 8)]),
    "sdpa_causal": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda: [r(2, 3, 6, 8), r(2, 3, 6, 8), r(2, 3, 6, 8)],
    ),
    "sdpa_float_mask": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        lambda: [r(2, 3, 6, 8), r(2, 3, 5, 8), r(2, 3, 5, 8), Const(r(6, 5))],
    ),
    "sdpa_bool_mask_gqa": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
        lambda: [r(1, 4, 6, 8), r(1, 2, 6, 8), r(1, 2, 6, 8), torch.rand(6, 6) > 0.3],
    ),
    "multi_head_attention": (
        lambda x, w_in, w_out: F.multi_head_attention_forward(
            x, x, x, 8, 2, w_in, None, None, None, False, 0.0, w_out, None, need_weights=False
        )[0],
        lambda: [r(5, 2, 8), r(24, 8), r(8, 8)],
    ),
}


# Native kernels (GEMM, decode attention) sum in their own order: float32 results differ from
# the CPU's by a few ulps of the largest terms. multi_head_attention's input gradients reach
# ~170 with elements near 1 left after cancellation, so its absolute tolerance covers
# ~1e-4 (relative ~6e-7 of the largest terms); everything else keeps the default.
NN_TOLERANCE = {"multi_head_attention": {"rtol": 1e-5, "atol": 1e-4}}


@pytest.mark.parametrize("name", list(NN))
def test_nn_op(name):
    torch.manual_seed(0)
    fn, factory = NN[name]
    check(fn, factory(), NN_TOLERANCE.get(name))


# ---------------------------------------------------------------------------- indexing


def index_put(x, v, i):
    return x.clone().index_put_((i,), v, accumulate=False)


def index_put_accumulate(x, v, i):
    return x.clone().index_put_((i,), v, accumulate=True)


INDEXING = {
    "advanced_rows": (lambda x, i: x[i], lambda: [r(6, 4), idx(6, 5)]),
    "advanced_cols": (lambda x, i: x[:, i], lambda: [r(6, 4), idx(4, 3)]),
    "advanced_2d": (lambda x, i, j: x[i, j], lambda: [r(6, 4), idx(6, 5), idx(4, 5)]),
    "advanced_broadcast": (
        lambda x, i, j: x[i[:, None], j],
        lambda: [r(6, 4), idx(6, 3), idx(4, 2)],
    ),
    "bool_mask": (lambda x: x[x > 0.2], lambda: [r(6, 4)]),
    "setitem_mask": (lambda x: x.clone().masked_fill(x < 0, 0.0) * 2, lambda: [r(6, 4)]),
    "index_put": (index_put, lambda: [r(6, 4), r(4), torch.tensor([1, 3, 5])]),
    "index_put_accumulate": (
        index_put_accumulate,
        lambda: [r(6, 4), r(5, 4), torch.tensor([1, 3, 1, 0, 3])],
    ),
    "masked_fill": (lambda x, m: x.masked_fill(m, -1.5), lambda: [r(6, 4), torch.rand(6, 4) > 0.5]),
    "masked_fill_broadcast": (
        lambda x, m: x.masked_fill(m, 0.0),
        lambda: [r(6, 4), torch.rand(1, 4) > 0.5],
    ),
    "masked_select": (lambda x, m: x.masked_select(m), lambda: [r(6, 4), torch.rand(6, 4) > 0.5]),
    "masked_scatter": (
        lambda x, m, s: x.masked_scatter(m, s),
        lambda: [r(6, 4), torch.rand(6, 4) > 0.5, r(24)],
    ),
    "scatter_add": (
        lambda x, i, s: x.scatter_add(1, i, s),
        lambda: [r(3, 5), idx(5, 3, 4), r(3, 4)],
    ),
    "scatter": (
        lambda x, s: x.scatter(0, torch.tensor([[2, 0, 1, 2]], device=x.device), s),
        lambda: [r(3, 4), r(1, 4)],
    ),
    "scatter_reduce_amax": (
        lambda x, i, s: x.scatter_reduce(0, i, s, reduce="amax", include_self=False),
        lambda: [r(4, 3), idx(4, 6, 3), r(6, 3)],
    ),
    "gather": (lambda x, i: x.gather(1, i), lambda: [r(4, 6), idx(6, 4, 3)]),
    "index_select": (lambda x, i: x.index_select(1, i), lambda: [r(4, 6), idx(6, 8)]),
    "index_add": (
        lambda x, s, i: x.index_add(0, i, s, alpha=2.0),
        lambda: [r(5, 3), r(4, 3), torch.tensor([0, 4, 0, 2])],
    ),
    "index_copy": (
        lambda x, s, i: x.index_copy(0, i, s),
        lambda: [r(5, 3), r(2, 3), torch.tensor([3, 1])],
    ),
    "index_fill": (lambda x, i: x.index_fill(1, i, 7.0), lambda: [r(4, 5), torch.tensor([0, 3])]),
    "take": (lambda x, i: torch.take(x, i), lambda: [r(4, 5), idx(20, 7)]),
    "take_along_dim": (
        lambda x, i: torch.take_along_dim(x, i, dim=1),
        lambda: [r(4, 5), idx(5, 4, 2)],
    ),
    "nonzero": (lambda x: torch.nonzero(x > 0), lambda: [r(5, 4)]),
    "nonzero_tuple": (lambda x: torch.nonzero(x > 0, as_tuple=True), lambda: [r(5, 4)]),
    "argwhere": (lambda x: torch.argwhere(x > 0.5), lambda: [r(5, 4)]),
    "where_cond_only": (lambda x: torch.where(x > 0), lambda: [r(5, 4)]),
    "put": (
        lambda x, s: x.clone().put_(torch.tensor([0, 7, 3], device=x.device), s),
        lambda: [r(3, 4), r(3)],
    ),
    "searchsorted": (
        lambda s, v: torch.searchsorted(s, v),
        lambda: [Const(torch.sort(r(10)).values), Const(r(6))],
    ),
    "tensor_split_index": (lambda x: x[1:4:2, [0, 2]], lambda: [r(6, 4)]),
    "ellipsis_none": (lambda x: x[..., None, 1] * x[None, 0, :, 2:3], lambda: [r(2, 3, 4)]),
}


@pytest.mark.parametrize("name", list(INDEXING))
def test_indexing(name):
    torch.manual_seed(0)
    fn, factory = INDEXING[name]
    check(fn, factory())


def test_setitem_forms_match_cpu():
    torch.manual_seed(0)
    cpu = torch.randn(6, 5)
    dev = cpu.to(DEVICE)
    index = torch.tensor([4, 1])
    for target in (cpu, dev):
        target[0] = 1.0
        target[:, 1] = torch.arange(6.0, device=target.device)
        target[target > 1.5] = -1.0
        target[index.to(target.device), 2] = torch.tensor([9.0, 8.0], device=target.device)
        target[2:4, 3:] += 10.0
        target[[0, 5], [4, 4]] = 3.0
    torch.testing.assert_close(dev.cpu(), cpu, **EXACT)


# ---------------------------------------------------------------------------- views

VIEWS = {
    "view": lambda x: x.view(-1) * 2,
    "view_as_dims": lambda x: x.view(3, 2, 4),
    "reshape_noncontig": lambda x: x.t().reshape(-1),
    "transpose": lambda x: x.transpose(0, 1),
    "permute": lambda x: x.view(2, 3, 4).permute(2, 0, 1),
    "expand": lambda x: x[:, :1].expand(6, 5),
    "expand_then_op": lambda x: x[:1].expand(4, 4) * x[:4],
    "narrow": lambda x: x.narrow(1, 1, 2),
    "unfold": lambda x: x.unfold(0, 2, 2),
    "as_strided": lambda x: x.as_strided((3, 3), (1, 3), 2),
    "diagonal": lambda x: x.diagonal(),
    "diagonal_offset": lambda x: x.diagonal(offset=1),
    "diag_embed": lambda x: torch.diag_embed(x[0]),
    "squeeze_unsqueeze": lambda x: x.unsqueeze(0).unsqueeze(-1).squeeze(0),
    "t": lambda x: x.t(),
    "flip": lambda x: x.flip(0, 1),
    "roll": lambda x: x.roll(2, dims=1),
    "repeat": lambda x: x.repeat(2, 1),
    "repeat_interleave": lambda x: x.repeat_interleave(2, dim=0),
    "tile": lambda x: x.tile((1, 2)),
    "movedim": lambda x: x.view(2, 3, 4).movedim(0, -1),
    "select": lambda x: x.select(1, 2),
    "slice_step": lambda x: x[::2, 1::2],
    "negative_step_flip": lambda x: x.flip(-1)[1:],
    "contiguous": lambda x: x.t().contiguous(),
    "unflatten_flatten": lambda x: x.unflatten(1, (2, 2)).flatten(0, 1),
    "view_as_real_like": lambda x: x.view(6, 2, 2).sum(-1),
    "split_views": lambda x: x.split(2, dim=1),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_view(name):
    torch.manual_seed(0)
    check(VIEWS[name], [r(6, 4)])


def test_views_share_storage():
    x = torch.arange(12.0, device=DEVICE).view(3, 4)
    for view in (x.t(), x[1], x.view(-1), x.narrow(1, 1, 2), x.diagonal(), x.unfold(1, 2, 1)):
        assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert view.device == DEVICE
    assert x.t().stride() == (1, 4)
    assert x[:, 1:].storage_offset() == 1
    assert not x.t().is_contiguous()


def test_inplace_on_views_updates_base():
    base_cpu = torch.zeros(4, 5)
    base_dev = base_cpu.to(DEVICE)
    for base in (base_cpu, base_dev):
        base[1:3, ::2].add_(1.0)
        base.t()[0].fill_(5.0)
        base.diagonal().mul_(2.0)
        base.view(-1)[7] = 7.0
        base.narrow(0, 3, 1).sub_(0.5)
        base.unfold(1, 2, 2)[2].zero_()
        base[:, -1].copy_(torch.arange(4.0, device=base.device))
        base.as_strided((2,), (6,), 1).add_(100.0)
    torch.testing.assert_close(base_dev.cpu(), base_cpu, **EXACT)


def test_inplace_on_views_autograd():
    torch.manual_seed(0)

    def fn(x):
        y = x.clone()
        y[:, 0].mul_(2.0)
        y.t()[1].add_(y[:, 2])
        y.diagonal().exp_()
        return y.sin()

    check(fn, [r(4, 4)])


def test_inplace_ops_on_noncontiguous():
    torch.manual_seed(0)
    cpu = torch.randn(5, 6)
    dev = cpu.to(DEVICE)
    for x in (cpu, dev):
        view = x.t()
        view.mul_(2).add_(1).clamp_(-1, 2)
        x[::2].sigmoid_()
        x[:, 1::3].masked_fill_(x[:, 1::3] > 0.5, 0.0)
        x.relu_()
    torch.testing.assert_close(dev.cpu(), cpu, **FP32)


# ---------------------------------------------------------------------------- out= variants


def test_out_wrong_size_is_resized():
    torch.manual_seed(0)
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    na, nb = a.to(DEVICE), b.to(DEVICE)
    cases = [
        (lambda x, y, out: torch.add(x, x, out=out), (3, 4)),
        (lambda x, y, out: torch.mm(x, y, out=out), (3, 5)),
        (lambda x, y, out: torch.sum(x, 1, out=out), (3,)),
        (lambda x, y, out: torch.cat([x, x], 0, out=out), (6, 4)),
        (lambda x, y, out: torch.exp(x, out=out), (3, 4)),
        (
            lambda x, y, out: torch.index_select(
                y, 1, torch.tensor([0, 2], device=y.device), out=out
            ),
            (4, 2),
        ),
        (lambda x, y, out: torch.matmul(x, y, out=out), (3, 5)),
    ]
    for fn, shape in cases:
        for initial in (0, 1, 40):  # empty, too small, too large
            out_cpu = torch.full((initial,), -1.0)
            out_dev = out_cpu.to(DEVICE)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # resizing a non-empty out=
                returned = fn(na, nb, out_dev)
                fn(a, b, out_cpu)
            assert returned is out_dev
            assert out_dev.shape == shape
            assert out_dev.device == DEVICE
            torch.testing.assert_close(out_dev.cpu(), out_cpu, **FP32)


def test_out_tuple_and_noncontiguous_out():
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    nx = x.to(DEVICE)
    values = torch.empty(0, device=DEVICE)
    indices = torch.empty(0, dtype=torch.long, device=DEVICE)
    torch.sort(nx, dim=1, out=(values, indices))
    ref = torch.sort(x, dim=1)
    torch.testing.assert_close(values.cpu(), ref.values, **EXACT)
    torch.testing.assert_close(indices.cpu(), ref.indices, **EXACT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # resizing a non-empty out=
        torch.max(nx, 0, out=(values, indices))
    torch.testing.assert_close(values.cpu(), x.max(0).values, **EXACT)
    # out= into a strided view writes through to the base.
    base = torch.zeros(6, 4, device=DEVICE)
    torch.mul(nx, 2.0, out=base.t())
    torch.testing.assert_close(base.cpu(), (x * 2).t(), **EXACT)


def test_out_resize_keeps_views_consistent():
    out = torch.empty(2, device=DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # resizing a non-empty out=
        torch.arange(0, 1000, dtype=torch.float32, device=DEVICE, out=out)
    assert out.shape == (1000,)
    torch.testing.assert_close(out.cpu(), torch.arange(0.0, 1000.0), **EXACT)
    assert out.untyped_storage().nbytes() >= 4000


# ---------------------------------------------------------------------------- joining, splitting

JOIN = {
    "cat": lambda a, b: torch.cat([a, b], dim=1),
    "cat_dim0_3": lambda a, b: torch.cat([a, b, a], dim=0),
    "stack": lambda a, b: torch.stack([a, b], dim=2),
    "hstack": lambda a, b: torch.hstack([a, b]),
    "split": lambda a, b: torch.split(a, [1, 3], dim=0),
    "split_size": lambda a, b: b.split(2, dim=1),
    "chunk": lambda a, b: a.chunk(3, dim=1),
    "unbind": lambda a, b: b.unbind(0),
    "tensor_split": lambda a, b: torch.tensor_split(a, [1, 3], dim=1),
    "meshgrid": lambda a, b: torch.meshgrid(a[0], b[1], indexing="ij"),
    "broadcast_tensors": lambda a, b: torch.broadcast_tensors(a[:, :1], b[:1]),
}


@pytest.mark.parametrize("name", list(JOIN))
def test_join_split(name):
    torch.manual_seed(0)
    check(JOIN[name], [r(4, 5), r(4, 5)])


def test_cat_with_empty_and_mixed_dtype():
    a = torch.randn(2, 3)
    cases = [[a, torch.empty(0)], [a, a.to(torch.float64)], [a.to(torch.bfloat16), a]]
    for tensors in cases:
        expected = torch.cat(tensors)
        got = torch.cat([t.to(DEVICE) for t in tensors])
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected, **EXACT)


# ---------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize(
    "dtype",
    [
        torch.bfloat16,
        torch.float16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int8,
        torch.uint8,
        torch.bool,
    ],
)
def test_to_dtype_matches_cpu(dtype):
    torch.manual_seed(0)
    x = torch.randn(5, 7) * 50
    dev = x.to(DEVICE)
    converted = dev.to(dtype)
    assert converted.dtype == dtype
    assert converted.device == DEVICE
    torch.testing.assert_close(converted.cpu(), x.to(dtype), **EXACT)
    back = converted.to(torch.float32)
    torch.testing.assert_close(back.cpu(), x.to(dtype).to(torch.float32), **EXACT)
    # device and dtype changed in one call, both directions
    torch.testing.assert_close(x.to(DEVICE, dtype).cpu(), x.to(dtype), **EXACT)
    torch.testing.assert_close(dev.to("cpu", dtype), x.to(dtype), **EXACT)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.bfloat16, BF16), (torch.float16, FP16)])
def test_low_precision_ops(dtype, tol):
    torch.manual_seed(0)
    fns = [
        lambda a, b, w: a + b,
        lambda a, b, w: a * b - a,
        lambda a, b, w: a @ b.t(),
        lambda a, b, w: F.linear(a, w),
        lambda a, b, w: F.softmax(a, dim=-1),
        lambda a, b, w: F.layer_norm(a, (8,)),
        lambda a, b, w: F.gelu(a),
        lambda a, b, w: F.silu(b),
        lambda a, b, w: a.sum(1),
        lambda a, b, w: a.mean(),
        lambda a, b, w: a.max(1),
        lambda a, b, w: torch.cat([a, b]),
        lambda a, b, w: F.scaled_dot_product_attention(a[None, None], b[None, None], b[None, None]),
    ]
    inputs = [
        torch.randn(6, 8, dtype=dtype),
        torch.randn(6, 8, dtype=dtype),
        torch.randn(4, 8, dtype=dtype),
    ]
    for fn in fns:
        check(fn, inputs, tol=tol)


def test_float64_ops():
    torch.manual_seed(0)
    inputs = [torch.randn(5, 5, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64)]
    for fn in (
        torch.matmul,
        lambda a, b: (a.exp() * b).sum(0),
        lambda a, b: torch.linalg.inv(a @ a.T + torch.eye(5, dtype=a.dtype, device=a.device)),
    ):
        check(fn, inputs, tol={"rtol": 1e-12, "atol": 1e-12})


def test_type_promotion_matches_cpu():
    a = torch.arange(6, dtype=torch.int64)
    b = torch.linspace(0, 1, 6)
    c = torch.tensor([True, False, True, True, False, True])
    pairs = [
        (a, b),
        (a, c),
        (b, c),
        (a.to(torch.int8), a.to(torch.uint8)),
        (b.to(torch.bfloat16), b.to(torch.float16)),
    ]
    for x, y in pairs:
        expected = x + y
        got = x.to(DEVICE) + y.to(DEVICE)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected, **EXACT)
    got = torch.arange(3, device=DEVICE) * 1.5
    assert got.dtype == torch.float32


def test_autocast_bf16_policy():
    torch.manual_seed(0)
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        mm = a.to(DEVICE) @ b.to(DEVICE)
        soft = F.softmax(mm, dim=-1)  # run in float32 under autocast
        mixed = mm + torch.ones(8, 4, device=DEVICE)  # promoted to the wider type
    assert mm.dtype == torch.bfloat16
    assert soft.dtype == torch.float32
    assert mixed.dtype == torch.float32
    expected = a.to(torch.bfloat16) @ b.to(torch.bfloat16)
    torch.testing.assert_close(mm.cpu(), expected, **EXACT)
    torch.testing.assert_close(soft.cpu(), F.softmax(expected.float(), -1), **FP32)


# ---------------------------------------------------------------------------- factories


def test_factories_match_cpu():
    pairs = [
        (lambda d: torch.zeros(3, 4, device=d), EXACT),
        (lambda d: torch.ones(2, 3, dtype=torch.int64, device=d), EXACT),
        (lambda d: torch.full((2, 2), 3.5, device=d), EXACT),
        (lambda d: torch.arange(0, 10, 0.5, device=d), EXACT),
        (lambda d: torch.linspace(-1, 1, 11, device=d), FP32),
        (lambda d: torch.logspace(0, 2, 5, device=d), FP32),
        (lambda d: torch.eye(4, 3, device=d), EXACT),
        (lambda d: torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=d), EXACT),
        (lambda d: torch.zeros_like(torch.empty(2, 3, device=d)), EXACT),
        (lambda d: torch.full_like(torch.empty(2, 3, device=d), 7), EXACT),
        (lambda d: torch.tril_indices(4, 4, device=d), EXACT),
        (lambda d: torch.empty(0, 3, device=d), EXACT),
        (lambda d: torch.tensor(5.0, device=d), EXACT),
    ]
    for make, tol in pairs:
        got = make(DEVICE)
        expected = make("cpu")
        assert got.device == DEVICE
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected, **tol)


def test_scalar_reads():
    x = torch.tensor([1.5, -2.0, 3.25], device=DEVICE)
    assert x[2].item() == 3.25
    assert x.tolist() == [1.5, -2.0, 3.25]
    assert float(x.sum()) == 2.75
    assert int(torch.tensor(7, device=DEVICE)) == 7
    assert bool((x > 0).any())
    assert x.numpy(force=True).tolist() == [1.5, -2.0, 3.25]


# ---------------------------------------------------------------------------- autograd, training


def test_mlp_training_step_matches_cpu():
    torch.manual_seed(0)
    model_cpu = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4)
    )
    model_dev = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4)
    )
    model_dev.load_state_dict(model_cpu.state_dict())
    model_dev.to(DEVICE)
    opt_cpu = torch.optim.AdamW(model_cpu.parameters(), lr=1e-2)
    opt_dev = torch.optim.AdamW(model_dev.parameters(), lr=1e-2)
    x = torch.randn(10, 8)
    y = torch.randint(0, 4, (10,))
    for _ in range(3):
        for model, opt, device in ((model_cpu, opt_cpu, "cpu"), (model_dev, opt_dev, DEVICE)):
            opt.zero_grad()
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    for (name, p_cpu), p_dev in zip(
        model_cpu.named_parameters(), model_dev.parameters(), strict=True
    ):
        assert p_dev.device == DEVICE
        torch.testing.assert_close(p_dev.detach().cpu(), p_cpu.detach(), **FP32, msg=name)


def test_conv_net_with_batchnorm_training():
    torch.manual_seed(0)

    def make():
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3, padding=1),
            torch.nn.BatchNorm2d(4),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(4 * 4 * 4, 3),
        )

    cpu = make()
    dev = make()
    dev.load_state_dict(cpu.state_dict())
    dev.to(DEVICE)
    x = torch.randn(5, 3, 8, 8)
    for model, device in ((cpu, "cpu"), (dev, DEVICE)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            opt.zero_grad()
            model(x.to(device)).square().mean().backward()
            opt.step()
    for (name, t_cpu), t_dev in zip(
        cpu.state_dict().items(), dev.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(t_dev.cpu(), t_cpu, **FP32, msg=name)


def test_higher_order_grad():
    torch.manual_seed(0)
    x_cpu = torch.randn(5, requires_grad=True)
    x_dev = x_cpu.detach().to(DEVICE).requires_grad_(True)
    grads = []
    for x in (x_cpu, x_dev):
        (g,) = torch.autograd.grad((x.sin() * x).sum(), x, create_graph=True)
        (gg,) = torch.autograd.grad(g.sum(), x)
        grads.append(gg)
    torch.testing.assert_close(grads[1].cpu(), grads[0], **FP32)


# ---------------------------------------------------------------------------- across devices


def test_copy_between_neuron_devices():
    torch.manual_seed(0)
    cpu = torch.randn(16, 9)
    on0 = cpu.to("neuron:0")
    on1 = on0.to("neuron:1")
    assert on1.device == torch.device("neuron:1")
    assert on1.untyped_storage().data_ptr() != on0.untyped_storage().data_ptr()
    torch.testing.assert_close(on1.cpu(), cpu, **EXACT)
    # Non-contiguous source, dtype change, and copy_ into an existing tensor.
    on2 = torch.empty(9, 16, device="neuron:2")
    on2.copy_(on1.t())
    torch.testing.assert_close(on2.cpu(), cpu.t(), **EXACT)
    half = on0.t().to("neuron:3", torch.bfloat16)
    assert half.device == torch.device("neuron:3")
    torch.testing.assert_close(half.cpu(), cpu.t().to(torch.bfloat16), **EXACT)
    # Results of ops stay on the inputs' device and are independent of the source.
    result = on1 * 2 + 1
    assert result.device == torch.device("neuron:1")
    on0.zero_()
    torch.testing.assert_close(result.cpu(), cpu * 2 + 1, **EXACT)


def test_ops_allocate_on_their_device():
    before = torch.neuron.memory_allocated(2)
    x = torch.ones(1024, 256, device="neuron:2")
    y = x @ x.t()
    assert y.device == torch.device("neuron:2")
    assert torch.neuron.memory_allocated(2) >= before + x.numel() * 4 + y.numel() * 4
    assert torch.neuron.current_device() == 0
    assert y[0, 0].item() == 256.0


def test_autograd_across_devices():
    torch.manual_seed(0)
    w = torch.randn(4, 4)
    a = w.to("neuron:0").requires_grad_(True)
    b = (a * 2).to("neuron:1")
    loss = (b.sin()).sum()
    loss.backward()
    assert a.grad.device == torch.device("neuron:0")
    torch.testing.assert_close(a.grad.cpu(), 2 * torch.cos(2 * w), **FP32)


@pytest.mark.parametrize("contiguous", [True, False])
def test_non_blocking_copies(contiguous):
    torch.manual_seed(0)
    cpu = torch.randn(64, 33)
    src = cpu if contiguous else cpu.t()
    dev = src.to(DEVICE, non_blocking=True)
    back = torch.empty(src.shape)
    back.copy_(dev, non_blocking=True)
    other = dev.to("neuron:1", non_blocking=True)
    torch.neuron.synchronize()
    torch.neuron.synchronize(1)
    torch.testing.assert_close(dev.cpu(), src, **EXACT)
    torch.testing.assert_close(back, src, **EXACT)
    torch.testing.assert_close(other.cpu(), src, **EXACT)
    again = dev.to("cpu", non_blocking=True)
    torch.neuron.synchronize()
    torch.testing.assert_close(again, src, **EXACT)


def test_copy_into_noncontiguous_destination():
    src = torch.arange(12.0).view(3, 4)
    dst = torch.zeros(4, 3, device=DEVICE)
    dst.t().copy_(src)
    torch.testing.assert_close(dst.cpu(), src.t(), **EXACT)
    host = torch.zeros(4, 3)
    host.t().copy_(src.to(DEVICE))
    torch.testing.assert_close(host, src.t(), **EXACT)
    broadcast = torch.zeros(3, 4, device=DEVICE)
    broadcast.copy_(torch.arange(4.0))
    torch.testing.assert_close(broadcast.cpu(), torch.arange(4.0).expand(3, 4), **EXACT)


# ---------------------------------------------------------------------------- op tracking


def test_executed_ops_counts_and_clear():
    a = torch.randn(4, 4, device=DEVICE)
    b = torch.randn(4, 4, device=DEVICE)
    torch.neuron.clear_op_tracking()
    assert {k: v for k, v in torch.neuron.get_executed_ops().items() if v} == {}
    assert {k: v for k, v in torch.neuron.get_fallback_ops().items() if v} == {}
    for _ in range(3):
        torch.add(a, b)
    torch.mm(a, b)
    torch.sigmoid(a)
    ops = torch.neuron.get_executed_ops()
    assert ops.get("aten::add.Tensor") == 3
    assert ops.get("aten::mm") == 1
    assert ops.get("aten::sigmoid") == 1
    assert "aten::sub.Tensor" not in ops or ops["aten::sub.Tensor"] == 0
    torch.neuron.clear_op_tracking()
    assert {k: v for k, v in torch.neuron.get_executed_ops().items() if v} == {}
    torch.sub(a, b)
    assert torch.neuron.get_executed_ops().get("aten::sub.Tensor") == 1
    assert torch.neuron.get_executed_ops().get("aten::add.Tensor", 0) == 0


def test_cpu_ops_are_not_counted():
    torch.neuron.clear_op_tracking()
    x = torch.randn(8, 8)
    (x @ x).relu().sum()
    assert {k: v for k, v in torch.neuron.get_executed_ops().items() if v} == {}


def test_no_fallbacks_in_ordinary_workload():
    torch.manual_seed(0)
    torch.neuron.clear_op_tracking()
    emb = torch.nn.Embedding(50, 16).to(DEVICE)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True).to(DEVICE)
    head = torch.nn.Linear(16, 50).to(DEVICE)
    params = list(emb.parameters()) + list(layer.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    tokens = torch.randint(0, 50, (2, 7), device=DEVICE)
    for _ in range(2):
        opt.zero_grad()
        h = layer(
            emb(tokens),
            is_causal=True,
            src_mask=torch.nn.Transformer.generate_square_subsequent_mask(7, device=DEVICE),
        )
        logits = head(h)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        loss.backward()
        opt.step()
    x = torch.randn(3, 5, device=DEVICE)
    x.sort(1)
    x.topk(2)
    x.cumsum(0)
    x[x > 0]
    torch.nonzero(x)
    x.argmax()
    F.softmax(x, 1)
    x.to(torch.bfloat16).float()
    F.max_pool2d(torch.randn(1, 2, 6, 6, device=DEVICE), 2)
    F.scaled_dot_product_attention(*(torch.randn(1, 2, 4, 8, device=DEVICE) for _ in range(3)))
    torch.cat([x, x]).split(2)
    loss.item()
    executed = torch.neuron.get_executed_ops()
    assert executed.get("aten::mm", 0) + executed.get("aten::addmm", 0) > 0
    assert sum(executed.values()) > 50
    assert {k: v for k, v in torch.neuron.get_fallback_ops().items() if v} == {}


def test_histc_integer_input_counts_like_cuda():
    # CUDA accepts integer histc (Transformers' MoE routing relies on it); the counts come
    # back in the input's dtype and equal the float histogram's, exactly.
    values = torch.tensor([0, 1, 1, 3, 2, 2, 2, 7], dtype=torch.int32)
    result = torch.histc(values.to("neuron"), bins=4, min=0, max=3)
    assert result.device.type == "neuron" and result.dtype == torch.int32
    expected = torch.histc(values.to(torch.float64), bins=4, min=0, max=3).to(torch.int32)
    assert torch.equal(result.cpu(), expected)
    assert result.cpu().tolist() == [1, 2, 3, 1]


def test_conjugate_and_negative_views_compute_like_cpu():
    # Ops on conj/neg views used to recurse (conj fallback -> clone -> copy_ -> _copy_from).
    x = torch.randn(5, dtype=torch.complex64)
    xn = x.to("neuron")
    assert torch.equal(xn.conj().clone().cpu(), x.conj().clone())
    assert torch.equal((xn.conj() * 2).cpu(), x.conj() * 2)
    assert torch.equal(xn.conj().resolve_conj().cpu(), x.conj().resolve_conj())
    r = torch.randn(4)
    assert torch.equal(r.to("neuron")._neg_view().cpu(), r._neg_view().resolve_neg())


def test_efficient_zero_tensor_on_device():
    zeros = torch._efficientzerotensor(3, device="neuron")
    assert zeros.device.type == "neuron"
    assert torch.equal((zeros + 1).cpu(), torch.ones(3))


def test_ops_with_a_cpu_and_an_implicit_composite_kernel_compute_like_cpu():
    # mish_backward has a CPU kernel and a CompositeImplicitAutograd decomposition; neuron
    # used the decomposition, whose bfloat16 rounding differs (nn.Mish's bfloat16 gradient
    # in the ModuleInfo sweep). It now runs the CPU kernel: bitwise equal. (Under
    # create_graph both devices use infinitely_differentiable_mish_backward instead.)
    torch.manual_seed(0)
    x = torch.randn(1000, dtype=torch.bfloat16, requires_grad=True)
    cotangent = torch.randn(1000, dtype=torch.bfloat16)
    (expected,) = torch.autograd.grad(F.mish(x), x, cotangent)
    x_dev = x.detach().to(DEVICE).requires_grad_(True)
    (grad,) = torch.autograd.grad(F.mish(x_dev), x_dev, cotangent.to(DEVICE))
    torch.testing.assert_close(grad.cpu(), expected, **EXACT)


def test_native_channel_shuffle_stays_differentiable():
    # Also CPU + CompositeImplicitAutograd, but kept on its decomposition: the CPU's
    # Autograd kernel for it raises "derivative not implemented".
    y = torch.randn(2, 6, 3, 3)
    y_dev = y.to(DEVICE).requires_grad_(True)
    shuffled = torch.native_channel_shuffle(y_dev, 3)
    torch.testing.assert_close(shuffled.cpu(), torch.native_channel_shuffle(y, 3), **EXACT)
    weights = torch.randn(shuffled.shape)
    (grad,) = torch.autograd.grad(shuffled, y_dev, weights.to(DEVICE))
    # The gradient of a permutation is its inverse: shuffling 6 channels in 2 groups undoes
    # shuffling them in 3.
    torch.testing.assert_close(grad.cpu(), torch.native_channel_shuffle(weights, 2), **EXACT)
