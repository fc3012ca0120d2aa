"""NKI kernels as ``torch.library`` custom ops: ``torch.neuron.nki_op`` / ``wrap_nki``.

The op runs the kernel on the tensors' memory (``neuron`` or CPU) and returns new tensors.
Its fake (meta) implementation derives the output shapes and dtypes by tracing the kernel
once per input signature on zero-filled arrays (the compile cache keeps that trace), so the
op is opaque to ``torch.compile`` and compiles with ``fullgraph=True``. Autograd comes from
the user: ``op.register_autograd(backward, setup_context=...)`` on the returned op.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from . import dtypes
from .errors import NkiError
from .launch import Kernel, jit


def _output_meta(kernel: Kernel, args: tuple[Any, ...]) -> Any:
    """Shapes and NKI dtypes of the kernel's results for these (fake) arguments."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from .hbm_io import torch_dtype

    def stand_in(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return torch.zeros(tuple(value.shape), dtype=value.dtype)
        return value

    with unset_fake_temporarily():
        results = kernel.interpret(*[stand_in(a) for a in args])

    def meta(item: Any) -> Any:
        # (shape, torch dtype): a tensor result keeps its own dtype (the result of a
        # kernel given torch stand-ins is a torch tensor of any dtype, not only bfloat16).
        if isinstance(item, np.ndarray):
            return (item.shape, torch_dtype(dtypes.canonical(item.dtype)))
        if isinstance(item, torch.Tensor):
            return (tuple(item.shape), item.dtype)
        if isinstance(item, (tuple, list)):
            return type(item)(meta(x) for x in item)
        raise NkiError(f"an NKI custom op returns tensors, got {type(item).__name__}")

    return meta(results)


def nki_op(
    name: str,
    kernel: Any = None,
    *,
    mutates_args: Any = (),
    device_types: Any = None,
    schema: str | None = None,
) -> Any:
    """Registers an NKI kernel as the custom op `name` ("namespace::op").

    Use as ``@torch.neuron.nki_op("mylib::rmsnorm", mutates_args=())`` over an
    ``@nki.jit`` kernel (or a launch ``kernel[grid]``), or call with the kernel. Tensor
    parameters and the results must be annotated (``x: torch.Tensor -> torch.Tensor``),
    or `schema` given. Returns the op (a ``torch.library.CustomOpDef``)."""
    if kernel is None:
        return lambda k: nki_op(
            name, k, mutates_args=mutates_args, device_types=device_types, schema=schema
        )
    import torch

    launch = kernel if isinstance(kernel, Kernel) else jit(kernel)
    signature = inspect.signature(launch.fn, eval_str=True)
    missing = [
        p.name for p in signature.parameters.values() if p.annotation is inspect.Parameter.empty
    ]
    if schema is None and (missing or signature.return_annotation is inspect.Signature.empty):
        raise TypeError(
            f"nki_op({name!r}): annotate every parameter and the return type of the kernel "
            f"(e.g. x: torch.Tensor, eps: float -> torch.Tensor), or pass schema=; "
            f"unannotated: {missing or ['return']}"
        )

    def run(*args: Any) -> Any:
        result = launch(
            *[a.contiguous() if isinstance(a, torch.Tensor) and _needs_copy(a) else a for a in args]
        )
        return _fresh(result, args, clone_all=True)

    run.__signature__ = signature  # type: ignore[attr-defined]
    run.__name__ = launch.fn.__name__
    op = torch.library.custom_op(
        name, run, mutates_args=mutates_args, device_types=device_types, schema=schema
    )

    def fake(*args: Any) -> Any:
        like = next(a for a in args if isinstance(a, torch.Tensor))
        return _build_fake(_output_meta(launch, args), like)

    op.register_fake(fake)
    return op


def _needs_copy(tensor: Any) -> bool:
    return tensor.is_conj() or tensor.is_neg()


def _fresh(result: Any, args: tuple[Any, ...], clone_all: bool = False) -> Any:
    """Custom ops may not return their inputs: such results are copied."""
    import torch

    if isinstance(result, torch.Tensor):
        if clone_all:
            return result.clone()
        if any(
            isinstance(a, torch.Tensor)
            and a.untyped_storage().data_ptr() == result.untyped_storage().data_ptr()
            for a in args
        ):
            return result.clone()
        return result
    if isinstance(result, (tuple, list)):
        return type(result)(_fresh(r, args, clone_all) for r in result)
    return result


def _build_fake(meta: Any, like: Any) -> Any:
    if isinstance(meta, tuple) and len(meta) == 2 and isinstance(meta[0], tuple):
        shape, dtype = meta
        return like.new_empty(shape, dtype=dtype)
    return type(meta)(_build_fake(m, like) for m in meta)


def wrap_nki(
    kernel: Any, name: str | None = None, *, mutates_args: Any = (), schema: str | None = None
) -> Any:
    """``nki_op`` with a default name ``nki::<kernel name>``."""
    launch = kernel if isinstance(kernel, Kernel) else jit(kernel)
    return nki_op(
        name or f"nki::{launch.fn.__name__}", launch, mutates_args=mutates_args, schema=schema
    )
