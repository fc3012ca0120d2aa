"""From the shapes that varied across a frame's graphs to the buckets that would cut them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Signature = Sequence[tuple[str, tuple[int, ...], str]]


def next_bucket(size: int, multiple: int = 128) -> int:
    """The bucket a size pads up to: a power of two below ``multiple``, else a multiple of it."""
    if size <= 0:
        return 0
    if size < multiple:
        return 1 << (size - 1).bit_length()
    return -(-size // multiple) * multiple


@dataclass
class BucketAdvice:
    """For one frame: which (input, dim) varied, over which sizes, and what buckets give."""

    code: str
    varying: list[tuple[str, int, list[int]]]  # (input name, dim, sizes seen)
    graphs_now: int
    graphs_with_buckets: int
    buckets: dict[tuple[str, int], list[int]]

    def describe(self) -> str:
        dims = "; ".join(
            f"{name} dim {dim}: sizes {sizes} -> buckets {self.buckets[(name, dim)]}"
            for name, dim, sizes in self.varying
        )
        return (
            f"{self.code}: {self.graphs_now} graphs -> {self.graphs_with_buckets} with buckets "
            f"({dims}); pad with "
            "torchneuron.compile.buckets.pad_to_buckets(model, buckets=..., dim=...)"
        )


def advise_buckets(code: str, signatures: list[Signature], multiple: int = 128) -> BucketAdvice:
    """Pads every varying dimension to ``next_bucket`` and counts the signatures that remain."""
    varying: list[tuple[str, int, list[int]]] = []
    names = [name for name, _, _ in signatures[0]] if signatures else []
    for index, name in enumerate(names):
        shapes = [sig[index][1] for sig in signatures if len(sig) > index]
        ranks = {len(s) for s in shapes}
        if len(ranks) != 1:
            continue
        for dim in range(ranks.pop()):
            sizes = sorted({s[dim] for s in shapes})
            if len(sizes) > 1:
                varying.append((name, dim, sizes))
    buckets = {
        (name, dim): sorted({next_bucket(s, multiple) for s in sizes})
        for name, dim, sizes in varying
    }
    padded = set()
    for sig in signatures:
        key = []
        for index, (name, shape, dtype) in enumerate(sig):
            shape = tuple(
                next_bucket(s, multiple) if (name, d) in buckets else s for d, s in enumerate(shape)
            )
            key.append((index, shape, dtype))
        padded.add(tuple(key))
    return BucketAdvice(code, varying, len(set(map(_freeze, signatures))), len(padded), buckets)


def _freeze(sig: Signature) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    return tuple((n, tuple(s), d) for n, s, d in sig)
