"""What the OpInfo sweep (op_coverage.py) covers: PyTorch's op database, the dtypes and
(op, dtype, mode) units, the fast subset, and what it knows about particular ops (random or
uninitialised outputs, arguments that stay on the host, the known causes of failures)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from devtools.conformance import (
    BACKWARD,
    FORWARD,
    Unit,
    declared_tolerance,
    load_database,
)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "bool": torch.bool,
}


# Ops whose outputs are random (drawn from a generator) or undefined (uninitialised memory):
# their values are not compared, only shape, dtype, layout and device.
RANDOM_OPS: dict[str, str] = {
    **dict.fromkeys(
        (
            "bernoulli",
            "cauchy",
            "exponential",
            "geometric",
            "log_normal",
            "multinomial",
            "normal",
            "normal.in_place",
            "normal.number_mean",
            "uniform",
            "rand_like",
            "randint",
            "randint_like",
            "randn",
            "randn_like",
            "nn.functional.alpha_dropout",
            "nn.functional.dropout",
            "nn.functional.dropout2d",
            "nn.functional.dropout3d",
            "nn.functional.feature_alpha_dropout.with_train",
            "nn.functional.fractional_max_pool2d",
            "nn.functional.fractional_max_pool3d",
            "nn.functional.rrelu",
        ),
        "random values",
    ),
    **dict.fromkeys(
        (
            "empty",
            "empty_like",
            "empty_permuted",
            "empty_strided",
            "new_empty",
            "new_empty_strided",
            "resize_",
            "resize_as_",
        ),
        "uninitialised memory",
    ),
}

# Tensor arguments (positions in SampleInput.args) that PyTorch requires on the CPU whatever
# the device: the OpInfo creates them with torch.tensor() (no device), so a device's own test
# suite passes them on the CPU too. tensor_split: "tensor_indices_or_sections must be on cpu".
HOST_ARGUMENTS: dict[str, tuple[int, ...]] = {"tensor_split": (0,)}

# Causes of the non-passes the full sweep finds, each reproduced by hand: (op regex, reason
# regex, cause). The report groups failures by them; anything else shows as 'unexplained'.
# Entries for fixed bugs stay, so that a regression is named when it comes back.
KNOWN_CAUSES: list[tuple[str, str, str]] = [
    (
        r"native_layer_norm|nn\.functional\.layer_norm|native_group_norm|nn\.functional\.group_norm"
        r"|addr",
        r"",
        "backend bug (composite instead of CPU kernel; fixed): the op has both a "
        "CPU kernel and a CompositeExplicitAutograd kernel, and on neuron the composite "
        "(math_native_layer_norm, math_group_norm, math_addr) won over the host-kernel "
        "fallback, so bf16/f16 rounding (and, for empty inputs, the dtype of mean/rstd) "
        "differed from the CPU",
    ),
    (
        r"sgn",
        r"SIGSEGV",
        "backend bug (zero tensor crash; fixed): "
        "torch._efficientzerotensor(..., device='neuron') crashed the process (a memcpy in "
        "ResultAdopter::move_into from the zero tensor's data-less storage); sgn's backward "
        "for real inputs returns a zero tensor",
    ),
    (
        r"fft\..*|polar|linalg\.eig|linalg\.eigvals",
        r"SIGSEGV",
        "backend bug (conjugate/negative views crash; fixed): any op or copy on a "
        "conjugate or negative view of a neuron tensor recursed without end (conjugateFallback "
        "-> clone -> copy_ -> neuron _copy_from -> conjugateFallback) and crashed the process; "
        "fft.ifft/hfft/ihfft return conjugate views, polar and eig backward call conj()",
    ),
    (
        r".*",
        r"[Ss]parse",
        "not supported: sparse layouts on neuron (no sparse kernels are registered)",
    ),
    (
        r"nn\.functional\.scaled_dot_product_attention",
        r"not differentiable with respect to argument 'attn_mask'",
        "backend bug (SDPA kernel choice; fixed): neuron's _fused_sdp_choice asked "
        "the CPU chooser with host aliases, which drop requires_grad, so it picked the CPU "
        "flash kernel although attn_mask requires grad; that kernel cannot differentiate it",
    ),
    (
        r"nn\.functional\.linear_cross_entropy.*",
        r"",
        "PyTorch policy, not a backend bug: linear_cross_entropy resolves acc_policy='auto' "
        "per (device type, dtype); CPU bf16/f16 use 'accurate', devices without an entry "
        "(neuron) get the 'compact' fallback (torch/nn/modules/linear_cross_entropy_options.py); "
        "with acc_policy='accurate' passed explicitly neuron equals the CPU bitwise",
    ),
]

# The fast subset (tests/test_opinfo.py and the default of the CLI): ops Transformers-style
# models use, each with the dtypes it is checked in. float32 means forward and backward.
FAST_OPS: dict[str, tuple[str, ...]] = {
    # elementwise
    "add": ("float32", "bfloat16", "float16", "int64", "bool"),
    "mul": ("float32", "bfloat16", "int64", "bool"),
    "div.no_rounding_mode": ("float32", "bfloat16"),
    "pow": ("float32",),
    "exp": ("float32", "bfloat16"),
    "rsqrt": ("float32", "bfloat16"),
    "tanh": ("float32",),
    "sigmoid": ("float32",),
    "abs": ("float32", "int64"),
    "clamp": ("float32", "int64"),
    "where": ("float32", "bool"),
    "maximum": ("float32",),
    "cos": ("float32",),
    "erf": ("float32",),
    "eq": ("float32", "int64", "bool"),
    "logical_and": ("bool",),
    "bitwise_and": ("int64", "bool"),
    "masked_fill": ("float32", "bfloat16"),
    # reductions and scans
    "sum": ("float32", "bfloat16", "int64", "bool"),
    "mean": ("float32", "bfloat16"),
    "argmax": ("float32", "int64"),
    "var": ("float32",),
    "cumsum": ("float32", "int64"),
    "logsumexp": ("float32",),
    "all": ("bool",),
    "topk": ("float32",),
    # linear algebra
    "matmul": ("float32", "bfloat16", "float16"),
    "mm": ("float32",),
    "bmm": ("float32", "bfloat16"),
    "addmm": ("float32",),
    "baddbmm": ("float32",),
    "einsum": ("float32",),
    "linalg.vector_norm": ("float32",),
    "triu": ("float32", "bool"),
    # indexing
    "index_select": ("float32", "int64"),
    "gather": ("float32",),
    "scatter": ("float32",),
    "index_put": ("float32",),
    "__getitem__": ("float32", "int64"),
    "nonzero": ("float32", "bool"),
    "arange": ("float32", "int64"),
    # views and shape changes
    "view": ("float32", "bool"),
    "reshape": ("float32",),
    "transpose": ("float32",),
    "permute": ("float32",),
    "expand": ("float32",),
    "split": ("float32",),
    "cat": ("float32", "bfloat16", "float16", "int64", "bool"),
    "unsqueeze": ("float32",),
    "to": ("float32", "bfloat16"),
    # nn.functional used by transformers
    "nn.functional.linear": ("float32", "bfloat16"),
    "softmax": ("float32", "bfloat16", "float16"),
    "log_softmax": ("float32",),
    "nn.functional.layer_norm": ("float32", "bfloat16", "float16"),
    "nn.functional.rms_norm": ("float32", "bfloat16"),
    "nn.functional.embedding": ("float32", "bfloat16"),
    "nn.functional.gelu": ("float32", "bfloat16"),
    "nn.functional.silu": ("float32",),
    "nn.functional.relu": ("float32",),
    "nn.functional.cross_entropy": ("float32",),
    "nn.functional.scaled_dot_product_attention": ("float32",),
    "nn.functional.dropout": ("float32",),
    "nn.functional.conv2d": ("float32",),
    "nn.functional.pad.constant": ("float32",),
    "nn.functional.group_norm": ("float32",),
    "nn.functional.one_hot": ("int64",),
}


def load_op_db() -> list[Any]:
    """PyTorch's OpInfo database (``op_db``)."""
    return load_database("torch.testing._internal.common_methods_invocations", "op_db")


def op_key(op: Any) -> str:
    """``name`` or ``name.variant_test_name``: unique within op_db."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def ops_by_key() -> dict[str, Any]:
    return {op_key(op): op for op in load_op_db()}


def supported_dtypes(op: Any) -> list[str]:
    """The dtypes of DTYPES the op supports on the CPU."""
    cpu = op.supported_dtypes("cpu")
    return [name for name, dtype in DTYPES.items() if dtype in cpu]


def has_backward(op: Any) -> bool:
    return bool(op.supports_autograd) and torch.float32 in op.supported_backward_dtypes("cpu")


def units_for(op: Any, dtypes: Iterable[str] | None = None) -> list[Unit]:
    """The units of one op: forward per supported dtype, backward in float32."""
    wanted = set(dtypes) if dtypes is not None else set(DTYPES)
    units = []
    for name in supported_dtypes(op):
        if name not in wanted:
            continue
        units.append(Unit(op_key(op), name, FORWARD))
        if name == "float32" and has_backward(op):
            units.append(Unit(op_key(op), name, BACKWARD))
    return units


def tolerance_override(op: Any, dtype: torch.dtype) -> tuple[float, float] | None:
    """The loosest (rtol, atol) the OpInfo declares for `dtype` (CPU or any device)."""

    def applies(info: Any) -> bool:
        on_cpu = info.device_type in (None, "cpu") and bool(info.active_if)
        return on_cpu and (info.dtypes is None or dtype in info.dtypes)

    return declared_tolerance(op.decorators or (), dtype, applies)
