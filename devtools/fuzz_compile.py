"""Fuzz target for ``torch.compile(..., backend="neuron")``: modes, options, odd inputs.

A case is a small function, compile settings (mode, options, dynamic, fullgraph) and inputs
of any dtype, layout (contiguous, transposed, strided, expanded, zero-size) and placement
(neuron:0, neuron:1, CPU, a CPU scalar). The oracle: settings the backend does not support
(a mode other than "default", options, dynamic=True) are refused with an error that names
them; otherwise the compiled function on neuron returns what the function returns eagerly on
the CPU (same dtypes and shapes; values within torch.testing's default tolerances for the
dtype, since Inductor reorders float reductions), or raises where the CPU raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st

from .fuzz_oracle import Finding, Outcome, expect_error, no_internal_assert, run


def _nonzero_count(x: torch.Tensor) -> torch.Tensor:
    return x.nonzero().shape[0] + x.sum()  # data-dependent shape: a graph break


def _branch_on_value(x: torch.Tensor) -> torch.Tensor:
    return x * 2 if bool(x.sum() > 0) else x - 1  # a graph break


# name -> (function, number of inputs, has a graph break)
FUNCTIONS: dict[str, tuple[Callable[..., Any], int, bool]] = {
    "affine": (lambda x: x * 2 + 1, 1, False),
    "sum": (lambda x: x.sum(0), 1, False),
    "matmul": (lambda x: x @ x.transpose(-1, -2), 1, False),
    "add": (lambda x, y: x + y, 2, False),
    "where": (lambda x, y: torch.where(x > 0, x, y), 2, False),
    "inplace": (lambda x: x.add_(1), 1, False),
    "view": (lambda x: (x.transpose(0, -1), x.reshape(-1)[:1]), 1, False),
    "cast": (lambda x: x.to(torch.float32).softmax(-1), 1, False),
    "nonzero": (_nonzero_count, 1, True),
    "branch": (_branch_on_value, 1, True),
}

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn)  # fmt: skip
LAYOUTS = ("contiguous", "transposed", "strided", "expanded", "zero-size", "scalar")
PLACES = ("neuron:0", "neuron:1", "cpu", "cpu-scalar")
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "",
         "bogus")  # fmt: skip
OPTIONS = (None, {}, {"trace.enabled": False}, {"bogus": 1})


def compile_cases() -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(
        st.sampled_from(sorted(FUNCTIONS)),
        st.sampled_from(MODES),
        st.sampled_from(OPTIONS),
        st.sampled_from([None, False, True]),
        st.booleans(),
        st.sampled_from(DTYPES),
        st.sampled_from(LAYOUTS),
        st.sampled_from(PLACES),
    )


def _input(dtype: torch.dtype, layout: str, seed: int) -> torch.Tensor:
    base = (torch.arange(24, dtype=torch.int64).reshape(4, 6) * (seed + 3)) % 11 - 4
    try:
        grid = base.to(dtype)
    except RuntimeError:
        grid = base.to(torch.float32).to(dtype)
    return {
        "contiguous": grid,
        "transposed": grid.t(),
        "strided": grid[::2, 1::2],
        "expanded": grid[:, :1].expand(4, 3),
        "zero-size": grid[:0],
        "scalar": grid[1, 2],
    }[layout]


def _inputs(arity: int, dtype: torch.dtype, layout: str, place: str) -> list[torch.Tensor]:
    """CPU inputs; the first goes to neuron:0, the second to `place` (see _place)."""
    return [_input(dtype, layout, i) for i in range(arity)]


def _place(inputs: list[torch.Tensor], place: str) -> list[torch.Tensor]:
    moved = [inputs[0].to("neuron:0")]
    for x in inputs[1:]:
        if place == "cpu-scalar":
            moved.append(x.reshape(-1)[:1].reshape(()).clone())
        elif place == "cpu":
            moved.append(x)
        else:
            moved.append(x.to(place))
    return moved


def _cpu_reference(inputs: list[torch.Tensor], place: str) -> list[torch.Tensor]:
    return [
        x.reshape(-1)[:1].reshape(()).clone() if i and place == "cpu-scalar" else x.clone()
        for i, x in enumerate(inputs)
    ]


def _close(got: Any, want: Any) -> None:
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.dtype != want.dtype:
            raise Finding(f"compiled result {got!r} does not match eager CPU {want!r}")
        if got.shape != want.shape:
            raise Finding(f"compiled shape {tuple(got.shape)} != eager {tuple(want.shape)}")
        if want.dtype.itemsize == 1 and want.dtype.is_floating_point:  # float8: compare as f32
            got, want = got.float(), want.float()
        try:
            torch.testing.assert_close(got.cpu(), want, equal_nan=True)
        except AssertionError as error:
            raise Finding(f"compiled result differs from eager CPU: {error}") from None
    elif isinstance(want, (tuple, list)):
        for g, w in zip(got, want, strict=True):
            _close(g, w)
    elif got != want:
        raise Finding(f"compiled result {got!r} != eager CPU {want!r}")


def check_compile(case: tuple[Any, ...]) -> None:
    name, mode, options, dynamic, fullgraph, dtype, layout, place = case
    fn, arity, breaks = FUNCTIONS[name]
    torch._dynamo.reset()
    cpu_inputs = _inputs(arity, dtype, layout, place)
    eager = run(lambda: fn(*_cpu_reference(cpu_inputs, place)))

    def compiled() -> Any:
        kwargs: dict[str, Any] = {"backend": "neuron", "dynamic": dynamic, "fullgraph": fullgraph}
        if mode is not None:
            kwargs["mode"] = mode
        if options is not None:
            kwargs["options"] = options
        return torch.compile(fn, **kwargs)(*_place(cpu_inputs, place))

    got = run(compiled)
    torch._dynamo.reset()
    no_internal_assert(got, eager)
    refused = []
    if mode not in (None, "", "default"):  # torch.compile treats "" as "default"
        refused.append(f"mode={mode!r}")
    if options:
        refused.append(f"options={options!r}")
    if mode is not None and options is not None:
        refused.append("both mode and options (torch.compile's rule)")
    if refused:
        expect_error(got, f"the neuron backend does not support {', '.join(refused)}")
        return
    if not got.ok:
        if _acceptable_refusal(got, eager, dynamic, fullgraph and breaks, place):
            return
        raise Finding(f"compiled call failed where eager CPU gives a result: {got.describe()}")
    if not eager.ok:
        raise Finding(f"compiled call succeeded where eager CPU raises {eager.describe()}")
    if arity > 1 and place in ("neuron:1", "cpu"):
        # inputs on two devices: compiled must refuse what eager neuron refuses
        eager_neuron = run(lambda: fn(*_place(cpu_inputs, place)))
        if not eager_neuron.ok:
            raise Finding(
                f"compiled call accepted inputs on neuron:0 and {place}, which eager refuses: "
                f"{eager_neuron.describe()}"
            )
    _close(got.value, eager.value)


def _acceptable_refusal(
    got: Outcome, eager: Outcome, dynamic: bool | None, graph_break: bool, place: str
) -> bool:
    if not eager.ok:
        return True  # the CPU refuses too
    message = str(got.error)
    if dynamic and "dynamic shape" in message:
        return True  # documented: dynamic=True is refused with advice
    if graph_break and ("Unsupported" in type(got.error).__name__ or "graph break" in message):
        return True  # fullgraph=True with a graph break: Dynamo's own error
    # a tensor on another device (or the CPU) mixed in: the eager rule on neuron refuses it
    return place in ("neuron:1", "cpu") and "device" in message


def compile_targets() -> dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], None]]]:
    return {"torch.compile backend=neuron": (compile_cases(), check_compile)}
