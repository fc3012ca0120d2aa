"""``nisa`` instructions that move data between partitions or lay it out anew:
``nc_stream_shuffle`` (Vector Engine, within 32-partition quadrants), ``local_gather``
(GpSimd Engine, within 16-partition core groups), ``dma_transpose`` (DMA), and two GpSimd /
Vector utilities: ``sequence_bounds`` and ``dropout``; in both API generations (AWS,
``nki.isa``, whose API examples in aws-neuron-sdk's nki/test check each against numpy).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import interpreter, ops
from .errors import NkiError
from .instruction import instruction, on_chip_operand
from .language import ndarray
from .random_numbers import drop_into
from .tiles import IndirectAccess, Tile

QUADRANT = 32  # partitions a stream shuffle moves data within
CORE_PARTITIONS = 16  # partitions one GpSimd core reaches
UNCHANGED = 255  # a shuffle mask entry that leaves its output partition alone


@instruction("vector")
def nc_stream_shuffle(dst: Tile, src: Tile, shuffle_mask: Any, mask: Any = None, **_: Any) -> None:
    """Within each quadrant of 32 partitions, output partition i takes input partition
    shuffle_mask[i] of the same quadrant (255: unchanged); in place when dst is src. Pass
    src= and dst= by keyword: the legacy API ordered them (src, dst)."""
    what = "nisa.nc_stream_shuffle"
    src, dst = on_chip_operand(src, what), on_chip_operand(dst, what)
    entries = [int(m) for m in shuffle_mask]
    if len(entries) != QUADRANT:
        raise NkiError(f"{what}: shuffle_mask has {QUADRANT} entries, got {len(entries)}")
    if any(not (0 <= m < QUADRANT or m == UNCHANGED) for m in entries):
        raise NkiError(f"{what}: shuffle_mask entries are partitions 0-31 of a quadrant or 255")
    if ops.free_size(src.shape) != ops.free_size(dst.shape):
        raise NkiError(f"{what}: src {src.shape} and dst {dst.shape} differ per partition")
    rows, source_rows = dst.shape[0], src.shape[0]
    for m in entries:
        if m != UNCHANGED and m >= source_rows and source_rows < QUADRANT:
            raise NkiError(f"{what}: mask entry {m} reads past src's {source_rows} partitions")
    shape = dst.shape

    def body(old: Any, x: Any) -> Any:
        x = np.asarray(x, np.float32).reshape(source_rows, -1)
        out = np.array(old, np.float32).reshape(rows, -1)
        for p in range(rows):
            m = entries[p % QUADRANT]
            if m != UNCHANGED:
                out[p] = x[(p // QUADRANT) * QUADRANT + m if source_rows >= QUADRANT else m]
        return out.reshape(shape)

    interpreter.execute(body, [dst, src], [(dst, mask, "set")], "vector", ops.free_size(shape))


@instruction("gpsimd")
def local_gather(
    dst: Tile,
    src_buffer: Tile,
    index: Tile,
    num_elem_per_idx: int = 1,
    num_valid_indices: int | None = None,
    mask: Any = None,
    **_: Any,
) -> None:
    """Each GpSimd core's 16 partitions gather, each from its own row, num_elem_per_idx
    contiguous elements at each of the core's indices (its 16-partition slice of `index`
    flattened partition first, the first num_valid_indices of them): element offsets into
    the partition's flattened free elements."""
    what = "nisa.local_gather"
    src_buffer, index = on_chip_operand(src_buffer, what), on_chip_operand(index, what)
    rows = src_buffer.shape[0]
    if index.shape[0] != rows or rows % CORE_PARTITIONS:
        raise NkiError(
            f"{what}: src_buffer and index have the same partitions, a multiple of 16; got "
            f"{src_buffer.shape} and {index.shape}"
        )
    if num_elem_per_idx not in (1, 2, 4, 8, 16, 32):
        raise NkiError(f"{what}: num_elem_per_idx is 1, 2, 4, 8, 16 or 32, not {num_elem_per_idx}")
    per_core = CORE_PARTITIONS * ops.free_size(index.shape)
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 0 < valid <= min(per_core, 4096):
        raise NkiError(
            f"{what}: num_valid_indices {valid}: at most the {per_core} indices of a core's "
            "slice, and 4096"
        )
    width = valid * num_elem_per_idx
    if dst.shape[0] != rows or ops.free_size(dst.shape) != width:
        raise NkiError(f"{what}: dst holds {width} elements per partition, got {dst.shape}")
    shape = dst.shape

    def body(data: Any, idx: Any) -> Any:
        flat = np.asarray(data).reshape(rows, -1)
        offsets = np.asarray(idx).astype(np.int64).reshape(rows, -1)
        span = np.arange(num_elem_per_idx)
        out = np.empty((rows, width), flat.dtype)
        for core in range(rows // CORE_PARTITIONS):
            part = slice(core * CORE_PARTITIONS, (core + 1) * CORE_PARTITIONS)
            starts = offsets[part].flatten(order="F")[:valid]
            columns = (starts[:, None] + span[None, :]).reshape(-1)
            if columns.size and (columns.min() < 0 or columns.max() >= flat.shape[1]):
                raise IndexError(f"{what}: an index reaches past a row of {flat.shape[1]}")
            out[part] = flat[part][:, columns]
        return out.reshape(shape)

    cycles = 150 + width
    interpreter.execute(body, [src_buffer, index], [(dst, mask, "set")], "gpsimd", cycles)


@local_gather.legacy
def _local_gather_legacy(
    src_buffer: Tile,
    index: Tile,
    num_elem_per_idx: int = 1,
    num_valid_indices: int | None = None,
    *,
    mask: Any = None,
    **_: Any,
) -> Tile:
    src_buffer = on_chip_operand(src_buffer, "nisa.local_gather")
    valid = num_valid_indices or CORE_PARTITIONS * ops.free_size(index.shape)
    out = ndarray((src_buffer.shape[0], valid, num_elem_per_idx), src_buffer.dtype)
    local_gather.into(out, src_buffer, index, num_elem_per_idx, num_valid_indices, mask=mask)
    return out


_TRANSPOSES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


@instruction("dma")
def dma_transpose(dst: Tile, src: Any, axes: Any = None, mask: Any = None, **_: Any) -> None:
    """dst = src transposed by the DMA engine: (1, 0), (2, 1, 0) or (3, 1, 2, 0), the only
    permutations it performs; src in HBM or SBUF, or an HBM tensor indexed by a tile of
    indices (a gather, then the transpose)."""
    what = "nisa.dma_transpose"
    rank = len(src.shape)
    order = tuple(int(a) for a in axes) if axes is not None else _TRANSPOSES.get(rank)
    if order is None or order != _TRANSPOSES.get(rank):
        raise NkiError(
            f"{what}: the DMA transposes by (1, 0), (2, 1, 0) or (3, 1, 2, 0); got "
            f"{order} for a rank-{rank} source"
        )
    shape = tuple(src.shape[a] for a in order)
    if tuple(dst.shape) != shape:
        raise NkiError(f"{what}: dst {dst.shape} is not the transpose {shape} of {src.shape}")
    if isinstance(src, IndirectAccess):
        gather = src.gather_fn()

        def gathered(data: Any, *index_values: Any) -> Any:
            return np.transpose(gather(data, *index_values), order)

        ins = [src.tensor, *src.index_tiles]
        interpreter.execute(gathered, ins, [(dst, mask, "set")], "dma", ops.free_size(shape))
        return
    if not isinstance(src, Tile) or src.buffer.name == "psum":
        raise NkiError(f"{what}: src is a tensor in HBM or SBUF")

    def transpose(x: Any) -> Any:
        return np.transpose(np.asarray(x), order)

    interpreter.execute(transpose, [src], [(dst, mask, "set")], "dma", ops.free_size(shape))


@dma_transpose.legacy
def _dma_transpose_legacy(
    src: Any, *, axes: Any = None, mask: Any = None, dtype: Any = None, **_: Any
) -> Tile:
    rank = len(src.shape)
    order = tuple(axes) if axes is not None else _TRANSPOSES.get(rank, tuple(range(rank)))
    out = ndarray(tuple(src.shape[a] for a in order), dtype or src.dtype)
    dma_transpose.into(out, src, axes=axes, mask=mask)
    return out


@instruction("gpsimd")
def sequence_bounds(dst: Tile, segment_ids: Tile, **_: Any) -> None:
    """For each element of a (1, n) tile of segment ids, the [start, end) of its segment:
    dst[0, 0, i] and dst[0, 1, i]; padding (id 0) gets start n and end -1."""
    what = "nisa.sequence_bounds"
    segment_ids = on_chip_operand(segment_ids, what)
    if segment_ids.shape[0] != 1:
        raise NkiError(f"{what}: the partition dimension is 1, got {segment_ids.shape}")
    n = ops.free_size(segment_ids.shape)
    if tuple(dst.shape) != (1, 2, n):
        raise NkiError(f"{what}: dst is (1, 2, {n}), got {dst.shape}")

    def body(ids: Any) -> Any:
        seq = np.asarray(ids, np.float64).reshape(-1)
        start, end = np.empty(n), np.empty(n)
        for i in range(n):
            if seq[i] == 0:
                start[i] = n
            elif i and seq[i] == seq[i - 1]:
                start[i] = start[i - 1]
            else:
                start[i] = i
        for i in range(n - 1, -1, -1):
            if seq[i] == 0:
                end[i] = -1
            elif i < n - 1 and seq[i] == seq[i + 1]:
                end[i] = end[i + 1]
            else:
                end[i] = i + 1
        return np.stack([start, end])[None]

    interpreter.execute(body, [segment_ids], [(dst, None, "set")], "gpsimd", 2 * n)


@sequence_bounds.legacy
def _sequence_bounds_legacy(*, segment_ids: Tile, dtype: Any = None, **_: Any) -> Tile:
    segment_ids = on_chip_operand(segment_ids, "nisa.sequence_bounds")
    out = ndarray((1, 2, ops.free_size(segment_ids.shape)), dtype or segment_ids.dtype)
    sequence_bounds.into(out, segment_ids)
    return out


@instruction("vector")
def dropout(dst: Tile, data: Tile, prob: Any, mask: Any = None, **_: Any) -> None:
    """dst = data with each element zeroed with probability `prob` (a scalar, or a (P, 1)
    tile of per-partition probabilities), drawn from the launch's generator
    (random_numbers.py: numpy's, not the hardware's bits)."""
    data = on_chip_operand(data, "nisa.dropout")
    drop_into(dst, data, prob, mask, "nisa.dropout", "vector")


@dropout.legacy
def _dropout_legacy(
    data: Tile, prob: Any, *, mask: Any = None, dtype: Any = None, **_: Any
) -> Tile:
    data = on_chip_operand(data, "nisa.dropout")
    out = ndarray(data.shape, dtype or data.dtype)
    dropout.into(out, data, prob, mask=mask)
    return out
