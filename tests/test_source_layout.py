"""The layout rules of the C++ sources (csrc/ and tests/cpp), checked so they keep holding.

- Every C++ file opens with a comment saying what it is for.
- Op registrations (TORCH_LIBRARY, TORCH_LIBRARY_IMPL, TORCH_LIBRARY_FRAGMENT) are made only in
  the registration index, csrc/aten/op_registrations.cpp: the concept files define
  register_<concept>(torch::Library&) functions that the index calls, so one file says which
  ops are registered under which dispatch key.
- No C++ file is longer than 600 lines: a longer one holds more than one concept; split it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CXX_SUFFIXES = {".cpp", ".cc", ".h", ".hpp"}
REGISTRATION_INDEX = Path("csrc/aten/op_registrations.cpp")
MAX_LINES = 600
# A use of the macros (a mention in a comment has no parenthesis after the name).
_REGISTRATION = re.compile(r"\bTORCH_LIBRARY(?:_IMPL|_FRAGMENT)?\s*\(")


def _cxx_files() -> list[Path]:
    files = [
        path.relative_to(ROOT)
        for base in (ROOT / "csrc", ROOT / "tests" / "cpp")
        for path in base.rglob("*")
        if path.is_file() and path.suffix in CXX_SUFFIXES
    ]
    assert files, "no C++ sources found under csrc/ and tests/cpp"
    return sorted(files)


def _code(text: str) -> str:
    """The text without // and /* */ comments (string literals are left alone)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def test_every_cxx_file_opens_with_a_comment() -> None:
    missing = []
    for path in _cxx_files():
        lines = (ROOT / path).read_text().splitlines()
        first = next((line.strip() for line in lines if line.strip()), "")
        if not first.startswith(("//", "/*")):
            missing.append(f"{path}: starts with {first[:60]!r}")
    assert not missing, (
        "these C++ files do not open with a comment saying what they are for (write one or "
        "two lines above the first #include):\n  " + "\n  ".join(missing)
    )


def test_op_registrations_are_made_only_in_the_index() -> None:
    elsewhere = []
    for path in _cxx_files():
        if path == REGISTRATION_INDEX:
            continue
        code = _code((ROOT / path).read_text())
        for match in _REGISTRATION.finditer(code):
            line = code.count("\n", 0, match.start()) + 1
            elsewhere.append(f"{path}:{line}: {match.group(0).rstrip('( ')}")
    assert not elsewhere, (
        f"TORCH_LIBRARY blocks outside the registration index {REGISTRATION_INDEX}: define a "
        "register_<concept>(torch::Library& m) function in the concept's file, declare it in "
        "csrc/aten/op_registrations.h and call it from the index's block for that library and "
        "dispatch key:\n  " + "\n  ".join(elsewhere)
    )
    index = _code((ROOT / REGISTRATION_INDEX).read_text())
    assert _REGISTRATION.search(index), f"{REGISTRATION_INDEX} registers nothing"


def test_no_cxx_file_is_longer_than_the_limit() -> None:
    long_files = []
    for path in _cxx_files():
        count = len((ROOT / path).read_text().splitlines())
        if count > MAX_LINES:
            long_files.append(f"{path}: {count} lines")
    assert not long_files, (
        f"C++ files longer than {MAX_LINES} lines hold more than one concept; split them "
        "(one concept per file):\n  " + "\n  ".join(long_files)
    )
