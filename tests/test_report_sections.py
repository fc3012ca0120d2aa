"""The conformance reports quote each other's summary: op_coverage.md states the ModuleInfo
figures read from module_coverage.md."""

from pathlib import Path

from devtools import report_sections as sections

REPORT = """# A report

Text.

## Summary

| | samples | pass |
|---|---:|---:|
| all | 10 | 9 |

Of the passing samples, 9 are bitwise equal.

## Method
| not | this |
"""


def test_quoted_summary_is_the_summary_table_only(tmp_path: Path) -> None:
    report = tmp_path / "module_coverage.md"
    report.write_text(REPORT)
    assert sections.quoted_summary(report) == [
        "| | samples | pass |",
        "|---|---:|---:|",
        "| all | 10 | 9 |",
    ]


def test_quoted_summary_of_a_missing_or_summaryless_report_is_empty(tmp_path: Path) -> None:
    assert sections.quoted_summary(tmp_path / "absent.md") == []
    other = tmp_path / "other.md"
    other.write_text("# Title\n\nno summary here\n")
    assert sections.quoted_summary(other) == []


def test_the_shipped_module_report_has_a_summary() -> None:
    shipped = Path(__file__).parents[1] / "docs" / "module_coverage.md"
    table = sections.quoted_summary(shipped)
    assert table[0].startswith("| | samples run on CPU")
    assert any(row.startswith("| all |") for row in table)
