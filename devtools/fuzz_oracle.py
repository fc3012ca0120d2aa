"""The fuzzing oracle: what counts as a correct outcome of a generated case.

A case passes when it succeeds with the reference result (the same operation on the CPU, or
the documented meaning of the argument), or raises an exception of an expected type with a
non-empty message. Anything else is a finding: another exception type (``AttributeError``
from inside a function is a missing argument check), an empty message, an internal assert
where the CPU gives a user error, success where the reference refuses the input, or a result
that differs from the reference. Crashes and hangs are caught one level up, by running the
cases in a subprocess with a timeout (``devtools.fuzz``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# The errors a public entry point may raise for bad input. torch.OutOfMemoryError,
# NotImplementedError and torch's own error classes derive from RuntimeError or these.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    TypeError,
    ValueError,
    IndexError,
    RuntimeError,
    OverflowError,
)


class Finding(AssertionError):
    """A generated case whose outcome breaks the oracle."""


@dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        if self.error is None:
            return f"returned {self.value!r}"[:300]
        return f"{type(self.error).__name__}: {self.error}"[:300]


def run(fn: Callable[[], Any]) -> Outcome:
    """Runs fn; an expected error becomes an Outcome, anything else propagates (a finding)."""
    try:
        return Outcome(value=fn())
    except EXPECTED_ERRORS as error:
        check_message(error)
        return Outcome(error=error)
    except Exception as error:  # noqa: BLE001 - any other type is what the oracle reports
        raise Finding(f"unexpected {type(error).__name__}: {error}") from error


def check_message(error: BaseException) -> None:
    message = str(error).strip()
    if not message:
        raise Finding(f"{type(error).__name__} with an empty message")


def expect_error(outcome: Outcome, why: str) -> None:
    if outcome.ok:
        raise Finding(f"accepted, but {why}: {outcome.describe()}")


def expect_ok(outcome: Outcome, why: str) -> None:
    if not outcome.ok:
        raise Finding(f"refused, but {why}: {outcome.describe()}")


def no_internal_assert(neuron: Outcome, cpu: Outcome) -> None:
    """An internal assert on neuron is a finding unless the CPU asserts too."""
    if neuron.error is not None and "INTERNAL ASSERT" in str(neuron.error):
        if cpu.error is None or "INTERNAL ASSERT" not in str(cpu.error):
            raise Finding(f"internal assert on neuron: {neuron.describe()}")


def same_bytes(neuron: torch.Tensor, cpu: torch.Tensor) -> bool:
    """Bitwise equality of two tensors (any dtype, NaN payloads included)."""
    if neuron.dtype != cpu.dtype or neuron.shape != cpu.shape or neuron.stride() != cpu.stride():
        return False
    if neuron.numel() == 0:
        return True
    try:
        got = neuron.detach().cpu()  # (a transfer makes non-dense views contiguous, as CUDA's)
        # (a fresh contiguous copy: .contiguous() keeps a size-1 dim's stride of 0,
        # which .view(uint8) refuses)
        got = got.clone(memory_format=torch.contiguous_format).reshape(-1)
        ref = cpu.detach().clone(memory_format=torch.contiguous_format).reshape(-1)
        return torch.equal(got.view(torch.uint8), ref.view(torch.uint8))
    except (RuntimeError, NotImplementedError):  # sub-byte dtypes: compare the storage bytes
        if neuron.storage_offset() != cpu.storage_offset():
            return False
        return bool(neuron.untyped_storage().cpu().tolist() == cpu.untyped_storage().tolist())


def compare_with_cpu(
    neuron: Outcome, cpu: Outcome, check_strides: bool = True, unsupported_ok: bool = False
) -> None:
    """Neuron and CPU must both succeed with equal results, or both raise.

    unsupported_ok: the neuron device does not implement this (documented) case, so a
    NotImplementedError on neuron where the CPU succeeds is accepted.
    """
    no_internal_assert(neuron, cpu)
    if neuron.ok and not cpu.ok:
        raise Finding(f"neuron accepted what the CPU refuses ({cpu.describe()})")
    if not neuron.ok and cpu.ok:
        if unsupported_ok and isinstance(neuron.error, NotImplementedError):
            return
        raise Finding(f"neuron refused what the CPU accepts: {neuron.describe()}")
    if neuron.ok:
        assert_same(neuron.value, cpu.value, check_strides)


def assert_same(got: Any, want: Any, check_strides: bool = True) -> None:
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            raise Finding(f"expected a tensor, got {got!r}")
        if got.device.type != "neuron":
            raise Finding(f"result on {got.device}, expected a neuron device")
        if not check_strides:
            got, want = got.contiguous(), want.contiguous()
        if not same_bytes(got, want):
            raise Finding(
                f"result differs from the CPU: {tuple(got.shape)}/{got.stride()} {got.dtype} "
                f"vs {tuple(want.shape)}/{want.stride()} {want.dtype}: "
                f"{_values(got)} vs {_values(want)}"
            )
    elif isinstance(want, (tuple, list)):
        if len(got) != len(want):
            raise Finding(f"{len(got)} results, the CPU gives {len(want)}")
        for g, w in zip(got, want, strict=True):
            assert_same(g, w, check_strides)
    elif got != want:
        raise Finding(f"result {got!r} differs from the CPU's {want!r}")


def _values(t: torch.Tensor) -> str:
    try:
        return repr(t.detach().cpu().reshape(-1)[:8].tolist())
    except (RuntimeError, NotImplementedError):
        return "(values not printable)"
