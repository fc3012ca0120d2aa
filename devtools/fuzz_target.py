"""What every fuzz target shares: its report, and the hypothesis profile it runs under.

The driver (fuzz.py) collects the reports; the targets that start processes of their own
(fuzz_env.py, fuzz_collectives.py) build theirs with the same profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TargetReport:
    name: str
    cases: int = 0
    findings: list[str] = field(default_factory=list)
    seconds: float = 0.0


def settings_for(examples: int, shrink: bool = True) -> Any:
    """The fixed profile: derandomized, no example database, no deadline. shrink=False where
    several processes must run the same cases in step (a shrinking process would diverge)."""
    from hypothesis import HealthCheck, Phase, settings

    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, *([Phase.shrink] if shrink else [])],
        print_blob=False,
        report_multiple_bugs=False,
    )
