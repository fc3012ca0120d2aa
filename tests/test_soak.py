"""The soak loops, short: after warm-up, device memory, descriptors and shared-memory maps
stay exactly flat and the resident set within 16 MiB. The long run (10,000 steps per loop)
is ``python -m devtools.soak``; its figures are in docs/reliability.md."""

from __future__ import annotations

import pytest

from devtools import soak

STEPS = {"train-eager": 300, "train-compiled": 200, "generate-compiled": 256}


@pytest.mark.parametrize("name", sorted(STEPS))
def test_loop_is_flat_after_warmup(name):
    result = soak.soak(name, STEPS[name], every=25, warmup=0.25)
    assert len(result.steady()) >= 6
    assert result.problems(rss_slack=16 * soak.MiB) == []


def test_detects_a_leak():
    """The check is not vacuous: a loop that keeps one more device tensor per step fails it."""
    import torch

    kept = []

    def leaking(device):
        while True:
            kept.append(torch.empty(1024, device=device))
            yield

    soak.LOOPS["leak"] = leaking
    try:
        result = soak.soak("leak", 100, every=10, warmup=0.2)
    finally:
        del soak.LOOPS["leak"]
    problems = result.problems(rss_slack=16 * soak.MiB)
    assert any("allocated varies" in p for p in problems), problems
