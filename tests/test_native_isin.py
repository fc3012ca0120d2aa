"""torch.isin on integer neuron tensors (native_isin.cpp, csrc/kernels/membership.h).

The reference is CPU eager on the same inputs; results are booleans, so they must be equal
exactly. Which path ran is read from the "aten::isin.Tensor_Tensor" native run counter:
int64 and int32 tensors of one dtype take the native kernel (compares for up to 16 test
values, a binary search beyond), everything else the host kernel, which must match the CPU
too. Also run in both launch modes by scripts/test.sh.
"""

from __future__ import annotations

import pytest
import torch

import torchneuron

DEV = "neuron"


def _runs() -> int:
    return torchneuron._C._native_kernel_runs().get("aten::isin.Tensor_Tensor", 0)


def _check(elements: torch.Tensor, tests: torch.Tensor, *, native: bool, **kwargs: bool) -> None:
    before = _runs()
    got = torch.isin(elements.to(DEV), tests.to(DEV), **kwargs)
    expected = torch.isin(elements, tests, **kwargs)
    assert got.device.type == DEV and got.dtype == torch.bool and got.shape == expected.shape
    assert torch.equal(got.cpu(), expected)
    assert (_runs() > before) == native


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("count", [0, 1, 3, 16, 17, 100])  # either side of the 16-value switch
@pytest.mark.parametrize("invert", [False, True])
def test_integer_elements_against_test_values_match_the_cpu(
    dtype: torch.dtype, count: int, invert: bool
) -> None:
    g = torch.Generator().manual_seed(count)
    elements = torch.randint(-50, 300, (7, 41), generator=g, dtype=dtype)
    # Duplicates, values absent from the elements, and negative values among the tests.
    tests = torch.randint(-60, 320, (count,), generator=g, dtype=dtype)
    _check(elements, tests, native=True, invert=invert)
    # assume_unique=True promises both sides are free of duplicates (else CPU eager's result
    # is undefined), so it gets unique values.
    unique_elements = (torch.randperm(350, generator=g)[:287] - 50).to(dtype).view(7, 41)
    unique_tests = (torch.randperm(380, generator=g)[:count] - 60).to(dtype)
    _check(unique_elements, unique_tests, native=True, invert=invert, assume_unique=True)


def test_the_vocabulary_against_end_of_sequence_tokens() -> None:
    """What Transformers' min_new_tokens processor computes every step."""
    vocab = torch.arange(32000)
    _check(vocab, torch.tensor([2]), native=True)
    _check(vocab, torch.tensor([2, 31999, 0]), native=True)
    _check(torch.empty(0, dtype=torch.int64), torch.tensor([1]), native=True)


@pytest.mark.parametrize(
    "elements, tests",
    [
        (torch.arange(40, dtype=torch.float32), torch.tensor([3.0, float("nan")])),
        (torch.arange(40), torch.tensor([3, 7], dtype=torch.int32)),  # mixed dtypes
        (torch.arange(80).view(8, 10).t(), torch.tensor([3, 17])),  # not contiguous
        (torch.arange(40, dtype=torch.int16), torch.tensor([3, 9], dtype=torch.int16)),
    ],
    ids=["float", "mixed", "strided", "int16"],
)
def test_other_calls_take_the_host_kernel_and_match_the_cpu(
    elements: torch.Tensor, tests: torch.Tensor
) -> None:
    _check(elements, tests, native=False)


def test_min_new_tokens_generation_step_matches_the_cpu() -> None:
    from transformers import MinNewTokensLengthLogitsProcessor

    def processor(device: str) -> MinNewTokensLengthLogitsProcessor:
        return MinNewTokensLengthLogitsProcessor(
            prompt_length_to_skip=4, min_new_tokens=3, eos_token_id=[2, 5], device=device
        )

    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    scores = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    before = _runs()
    got = processor(DEV)(ids.to(DEV), scores.to(DEV))
    assert _runs() > before
    expected = processor("cpu")(ids, scores)
    assert torch.isinf(expected[:, [2, 5]]).all()  # end of sequence still suppressed
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
