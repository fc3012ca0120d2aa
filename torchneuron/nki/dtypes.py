"""NKI data types and how the simulator stores them.

Most NKI dtypes are numpy dtypes. numpy has no bfloat16, tfloat32 or float8, so those are
named types stored as float32 and rounded (to nearest, ties to even) whenever a value is
written to a tile of that type, which is what the hardware's narrower storage does to the
value. float8 values are rounded through ml_dtypes' formats of the same layout: the legacy
``float8_e4m3`` as ml_dtypes' IEEE-style float8_e4m3 (largest 240, overflow to infinity),
``float8_e4m3fn`` as OCP's (largest 448, no infinity), ``float8_e5m2`` as IEEE-style
(largest 57344); subnormals are kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import NkiError


class NamedDtype:
    """A dtype numpy lacks: kept as float32, rounded to `mantissa_bits` on every write.

    Where ml_dtypes has the type, `dtype` is its numpy dtype, so host code converts arrays
    with it as AWS's samples do (``x.astype(nl.bfloat16)``, ``nl.static_cast``) and numpy
    arrays of it go into kernels."""

    def __init__(
        self, name: str, mantissa_bits: int | None, itemsize: int, numpy_name: str = ""
    ) -> None:
        self.name = name
        self.mantissa_bits = mantissa_bits
        self.itemsize = itemsize
        self._numpy_name = numpy_name

    @property
    def dtype(self) -> np.dtype:
        """The host numpy dtype (ml_dtypes), which np.dtype(nl.bfloat16) resolves to."""
        if not self._numpy_name:
            raise TypeError(f"{self!r} has no numpy dtype")
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, self._numpy_name))

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def __reduce__(self) -> str:
        return self.name


bfloat16 = NamedDtype("bfloat16", 7, 2, "bfloat16")
tfloat32 = NamedDtype("tfloat32", 10, 4)
float8_e4m3 = NamedDtype("float8_e4m3", 3, 1, "float8_e4m3")
float8_e5m2 = NamedDtype("float8_e5m2", 2, 1, "float8_e5m2")
float8_e4m3fn = NamedDtype("float8_e4m3fn", 3, 1, "float8_e4m3fn")

float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
bool_ = np.dtype(np.bool_)

Dtype = Any  # np.dtype or NamedDtype

_FLOATS = (float32, float16)


def canonical(dtype: Any) -> Dtype:
    """The NKI dtype for a user's dtype argument (numpy type, string, nl.* name)."""
    if isinstance(dtype, NamedDtype):
        return dtype
    if isinstance(dtype, np.dtype):
        # every launch asks this of each argument; numpy's dtype.name costs ~5 us
        known = _CANONICAL.get(dtype)
        if known is None:
            known = _CANONICAL[dtype] = _canonical(dtype)
        return known
    return _canonical(dtype)


def _canonical(dtype: Any) -> Dtype:
    if isinstance(dtype, str) and dtype in _NAMED:
        return _NAMED[dtype]
    try:
        result = np.dtype(dtype)
    except TypeError as error:
        raise NkiError(f"{dtype!r} is not an NKI dtype") from error
    if result.name in _NAMED:  # ml_dtypes' types (kind "V", or "f" for some float8 types)
        return _NAMED[result.name]
    if result.kind not in "fiub" or result.itemsize > 4:
        raise NkiError(
            f"dtype {result} is not supported on the NeuronCore; use float32, bfloat16, "
            "float16, tfloat32, (u)int8/16/32 or bool"
        )
    return result


_NAMED = {d.name: d for d in (bfloat16, tfloat32, float8_e4m3, float8_e5m2, float8_e4m3fn)}
_CANONICAL: dict[np.dtype, Dtype] = {}  # numpy dtypes already checked (errors are not kept)


def host(dtype: Dtype) -> np.dtype:
    """The numpy dtype host arrays of `dtype` have (ml_dtypes' for bfloat16)."""
    return dtype.dtype if isinstance(dtype, NamedDtype) else np.dtype(dtype)


def storage(dtype: Dtype) -> np.dtype:
    """The numpy dtype holding values of `dtype` in the simulator."""
    if isinstance(dtype, NamedDtype):
        return float32
    return dtype


def itemsize(dtype: Dtype) -> int:
    return dtype.itemsize


def is_float(dtype: Dtype) -> bool:
    return isinstance(dtype, NamedDtype) or dtype.kind == "f"


def name(dtype: Dtype) -> str:
    return dtype.name if isinstance(dtype, NamedDtype) else str(dtype)


def round_to(values: np.ndarray, dtype: Dtype) -> np.ndarray:
    """`values` converted to what a tile of `dtype` holds (in its storage dtype)."""
    if isinstance(dtype, NamedDtype) and dtype.itemsize == 1:  # float8: its own range too
        return np.asarray(values, dtype=np.float32).astype(dtype.dtype).astype(np.float32)
    if isinstance(dtype, NamedDtype):
        bits = np.asarray(values, dtype=np.float32).view(np.uint32)
        drop = 23 - dtype.mantissa_bits
        half = np.uint32((1 << (drop - 1)) - 1)
        lsb = (bits >> np.uint32(drop)) & np.uint32(1)
        rounded = (bits + half + lsb) & np.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)
        # NaN and infinity keep their bits (rounding could turn a NaN into infinity).
        special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
        return np.where(special, bits, rounded).view(np.float32)
    return np.asarray(values).astype(dtype, copy=False)


def needs_rounding(dtype: Dtype) -> bool:
    return isinstance(dtype, NamedDtype)


def result_type(*dtypes: Dtype) -> Dtype:
    """Dtype of an elementwise result when the kernel names none (NKI promotes like numpy;
    any float input makes the result float32 unless all floats are one type)."""
    floats = [d for d in dtypes if is_float(d)]
    if floats:
        first = floats[0]
        return first if all(d is first or d == first for d in floats) else float32
    return np.result_type(*[storage(d) for d in dtypes])
