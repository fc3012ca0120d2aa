"""Lowering of single instructions to the C++ statements of a row program (row_programs.py).

Each instruction body carries a ``lowering`` description (set where the body is defined:
ops.py, language.py, isa_elementwise.py, isa_statistics_gpsimd_dma.py, interpreter.py). A
lowered step is C++ for one row ``r``; operands are row pointers whose addresses stay
placeholders (:func:`pointer`) until the run decides which tiles live in row-local buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import dtypes, row_cxx
from .interpreter import Launch, Ref, Step
from .row_views import Tables, View, pointer

# Matmuls up to this many flops run inside row programs (a row-at-a-time loop: no call
# overhead, no thread hand-offs); larger ones stay torch.mm calls (blocked, packed BLAS,
# intra-op threads): on a quiet host a 128^3 product (4 MFLOP) is faster as torch.mm.
MATMUL_FLOPS = 1 << 20
# Kinds that read a row element by element before writing it: in place is fine.
ELEMENTWISE = {"copy", "unary", "binary", "tensor_scalar"}


class NotLowerable(Exception):
    """The step stays in the numpy program."""


def padded(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return shape + (1,) * (rank - len(shape)) if 0 < len(shape) < rank else shape


@dataclass
class Operand:
    view: View | None  # None: a scalar constant
    row: str  # C++ row index expression ("r", "0", "(r % 128)")
    constant: str = ""

    def row_pointer(self, name: str, const: bool = True) -> str:
        v = self.view
        assert v is not None
        qualifier = "const float*" if const else "float*"
        return f"{qualifier} {name} = {pointer(v, self.row)};"

    def at(self, name: str) -> str:
        if self.view is None:
            return self.constant
        if self.view.free == 1 or self.view.col_stride == 0:
            return f"{name}[0]"
        return f"{name}[c * {self.view.col_stride}]"


class StepLowering:
    """C++ for one step at a time, over the views of a pointer table."""

    def __init__(self, launch: Launch, tables: Tables, n_inputs: int) -> None:
        self.launch = launch
        self.tables = tables
        self.n_inputs = n_inputs
        self.whole_reads: list[tuple[View, str]] = []  # the step's reads at any row ("*")

    # -- operands -------------------------------------------------------------------------
    def _operand(
        self, x: Any, step: Step, out_shape: tuple[int, ...], rows: int, pad: bool
    ) -> Operand | None:
        if not isinstance(x, Ref):
            text = row_cxx.literal(x)
            return None if text is None else Operand(None, "0", text)
        view, array = self.tables.view(x, self.n_inputs)
        if view is None:
            return None
        shape = padded(array.shape, len(out_shape)) if pad else array.shape
        if len(shape) != len(out_shape) or any(
            d not in (1, o) for d, o in zip(shape[1:], out_shape[1:], strict=True)
        ):
            return None
        if view.free not in (1, int(np.prod(out_shape[1:], dtype=np.int64))):
            return None
        if view.free > 1 and any(
            d == 1 and o != 1 for d, o in zip(shape[1:], out_shape[1:], strict=True)
        ):
            return None  # broadcast along some free dims but not all
        if view.rows == rows:
            row = "r"
        elif view.rows == 1:
            row = "0"
        elif step.batch is not None and view.rows == step.batch[1] and not x.stacked:
            row = f"(r % {step.batch[1]})"  # read whole by every iteration
        else:
            return None
        return Operand(view, row)

    def _output(self, ref: Ref) -> tuple[View, tuple[int, ...]] | None:
        if dtypes.needs_rounding(self.launch.nki_dtypes[ref.sid]):
            return None
        view, array = self.tables.view(ref, self.n_inputs)
        if view is None:
            return None
        return view, array.shape

    # -- steps ----------------------------------------------------------------------------
    def lower(self, step: Step) -> tuple[int, list[str], list[tuple[View, str]], list[View]]:
        """(rows, C++ statements, reads, writes) of a step, or raises NotLowerable."""
        lowering = ("transpose",) if step.fn is np.transpose else getattr(step.fn, "lowering", None)
        if lowering is None or any(mask is not None for _, mask, _ in step.outs):
            raise NotLowerable
        outs = [self._output(ref) for ref, _, _ in step.outs]
        if any(o is None for o in outs):
            raise NotLowerable
        views = [o[0] for o in outs]  # type: ignore[index]
        shapes = [o[1] for o in outs]  # type: ignore[index]
        rows = views[0].rows
        if any(v.rows != rows for v in views):
            raise NotLowerable
        kind = lowering[0]
        body = getattr(self, f"_{kind}")
        self.whole_reads = []
        lines, operands = body(step, lowering, views, shapes, rows)
        reads = [(op.view, op.row) for op in operands if op is not None and op.view is not None]
        reads += self.whole_reads
        in_place = {v.slot for v, _ in reads} & {v.slot for v in views}
        elementwise = kind in ELEMENTWISE or (kind == "activation" and lowering[2] is None)
        if in_place and not elementwise:
            raise NotLowerable  # it would read a row after writing part of it
        modes = [mode for _, _, mode in step.outs]
        lines = self._wrap(lines, views, modes)
        return rows, lines, reads, views

    def fill(self, step: Step) -> tuple[int, list[str], list[Any], list[View]]:
        """An allocation's zero fill over the whole tile."""
        view, _ = self.tables.view(Ref(step.allocated, (), None), self.n_inputs)  # type: ignore[arg-type]
        if view is None:
            raise NotLowerable
        lines = self._wrap([f"for (long c = 0; c < {view.free}; ++c) @Y0@ 0.0f;"], [view], ["set"])
        return view.rows, lines, [], [view]

    def _ins(
        self, step: Step, shape: tuple[int, ...], rows: int, pad: bool, count: int | None = None
    ) -> list[Operand]:
        ins = step.ins if count is None else step.ins[:count]
        operands = [self._operand(x, step, shape, rows, pad) for x in ins]
        if any(op is None for op in operands):
            raise NotLowerable
        return operands  # type: ignore[return-value]

    @staticmethod
    def _declare(operands: list[Operand]) -> list[str]:
        return [op.row_pointer(f"x{n}") for n, op in enumerate(operands) if op.view is not None]

    @staticmethod
    def _wrap(lines: list[str], outs: list[View], modes: list[str]) -> list[str]:
        declared = [f"float* y{n} = {pointer(v, 'r')};" for n, v in enumerate(outs)]
        body = "\n".join(["{", *declared, *lines, "}"])
        for n, mode in enumerate(modes):  # accumulate: y = y + value
            marker = f"@Y{n}@"
            body = body.replace(
                marker, f"y{n}[{_col(outs[n])}] +=" if mode == "acc" else f"y{n}[{_col(outs[n])}] ="
            )
        return body.split("\n")

    def _elementwise(self, operands: list[Operand], out: View, expression: str) -> list[str]:
        lines = self._declare(operands)
        lines.append(f"for (long c = 0; c < {out.free}; ++c) {{")
        values = [op.at(f"x{n}") for n, op in enumerate(operands)]
        lines.append(f"  @Y0@ {expression.format(*values)};")
        lines.append("}")
        return lines

    def _whole(self, x: Any) -> tuple[View, str]:
        """A tile read at any row (a matmul or transpose operand): its row-0 address. Its
        read is marked "*", so a run that writes it cannot hold this step."""
        if not isinstance(x, Ref):
            raise NotLowerable
        view, _ = self.tables.view(x, self.n_inputs)
        if view is None:
            raise NotLowerable
        return view, pointer(view, "0")

    def _fill(self, step, lowering, outs, shapes, rows):  # noqa: ANN001, ANN202
        value = row_cxx.literal(lowering[1])
        if value is None or step.ins:
            raise NotLowerable
        return [f"for (long c = 0; c < {outs[0].free}; ++c) @Y0@ {value};"], []

    def _matmul(self, step, lowering, outs, shapes, rows):  # noqa: ANN001, ANN202
        """Out row r = sum over partitions k of stationary[k, r] * moving[k, :] (the Tensor
        Engine's contraction over the partition axis), accumulated in float32. For
        "matmul_nt" the stationary operand is given untransposed: stationary[r, k]."""
        (s, s_ptr), (m, m_ptr) = (self._whole(x) for x in step.ins)
        # the contraction's length and strides of the stationary operand along k and r
        depth, width, k_step, r_step = s.rows, s.free, s.row_stride, s.col_stride
        if lowering[0] == "matmul_nt":
            depth, width, k_step, r_step = s.free, s.rows, s.col_stride, s.row_stride
        out = outs[0]
        if width != rows or m.rows != depth or m.free != out.free or out.free > 4096:
            raise NotLowerable
        if 2 * rows * out.free * depth > MATMUL_FLOPS:
            raise NotLowerable  # a BLAS (torch.mm) is faster than this loop at that size
        lines = [f"const float* x0 = {s_ptr};", f"const float* x1 = {m_ptr};"]
        if m.col_stride != 1 and m.row_stride == 1 and k_step == 1:
            # both operands contiguous along the contraction: one dot product per column
            lines += [
                f"for (long c = 0; c < {out.free}; ++c) {{",
                "  float acc = 0.0f;",
                "  #pragma omp simd reduction(+:acc)",
                f"  for (long k = 0; k < {depth}; ++k)",
                f"    acc += x0[k + r * {r_step}] * x1[k + c * {m.col_stride}];",
                "  @Y0@ acc;",
                "}",
            ]
        else:  # moving rows scaled and added (contiguous along the moving free axis)
            lines += [
                f"float t[{out.free}] = {{}};",
                f"for (long k = 0; k < {depth}; ++k) {{",
                f"  const float a = x0[k * {k_step} + r * {r_step}];",
                f"  const float* mk = x1 + k * {m.row_stride};",
                "  #pragma omp simd",
                f"  for (long c = 0; c < {out.free}; ++c) t[c] += a * mk[c * {m.col_stride}];",
                "}",
                f"for (long c = 0; c < {out.free}; ++c) @Y0@ t[c];",
            ]
        self.whole_reads = [(s, "*"), (m, "*")]
        return lines, []

    _matmul_nt = _matmul

    def _transpose(self, step, lowering, outs, shapes, rows):  # noqa: ANN001, ANN202
        (x, x_ptr), out = self._whole(step.ins[0]), outs[0]
        if len(step.ins) != 1 or x.free != rows or x.rows != out.free:
            raise NotLowerable
        lines = [
            f"const float* x0 = {x_ptr};",
            f"for (long c = 0; c < {out.free}; ++c)",
            f"  @Y0@ x0[c * {x.row_stride} + r * {x.col_stride}];",
        ]
        self.whole_reads = [(x, "*")]
        return lines, []

    def _copy(self, step, lowering, outs, shapes, rows):  # noqa: ANN001, ANN202
        operands = self._ins(step, shapes[0], rows, pad=lowering[1])
        if len(operands) != 1:
            raise NotLowerable
        return self._elementwise(operands, outs[0], "{0}"), operands

    def _unary(self, step, lowering, outs, shapes, rows):  # noqa: ANN001, ANN202
        template = row_cxx.UNARY.get(lowering[1])
        if template is None:
            raise NotLowerable
        operands = self._ins(step, shapes[0], rows, pad=False)
        expr = "op_v" if "{x}" in template else template
        lines = self._declare(operands)
        lines.append(f"for (long c = 0; c < {outs[0].free}; ++c) {{")
        lines.append(f"  const float op_v = {operands[0].at('x0')};")
        lines.append(f"  @Y0@ {template.format(x=expr)};")
        lines.append("}")
        return lines, operands

    def _binary(self, step, lowering, outs, shapes, rows):  # noqa: ANN001, ANN202
        template = row_cxx.BINARY.get(lowering[1])
        if template is None:
            raise NotLowerable
        operands = self._ins(step, shapes[0], rows, pad=lowering[2])
        return self._elementwise(operands, outs[0], template.format(a="{0}", b="{1}")), operands

    def _reduce(self, step, lowering, outs, shapes, rows):  # noqa: ANN001, ANN202
        _, op, axes, _keepdims, negate, count = lowering
        if op not in row_cxx.REDUCE or outs[0].free != 1:
            raise NotLowerable
        x = step.ins[0]
        if not isinstance(x, Ref):
            raise NotLowerable
        view, array = self.tables.view(x, self.n_inputs)
        if view is None or tuple(axes) != tuple(range(1, array.ndim)):
            raise NotLowerable
        operand = self._operand(x, step, array.shape, rows, pad=False)
        if operand is None or operand.row != "r":
            raise NotLowerable
        lines = self._declare([operand])
        lines += row_cxx.reduction(op, operand.at("x0"), view.free, "float total")
        value = "total"
        if negate:
            value = "(-total)"
        if count != 1:
            value = f"({value} / {float(count)!r}f)"
        lines.append(f"@Y0@ {value};")
        return lines, [operand]

    def _scalar(self, x: Any, step: Step, shape: tuple[int, ...], rows: int) -> Operand:
        """A per-partition operand ([P, 1] tile) or a scalar constant."""
        op = self._operand(x, step, shape, rows, pad=True)
        if op is None or (op.view is not None and op.view.free != 1):
            raise NotLowerable
        return op

    def _data_and_scalars(
        self, step: Step, shape: tuple[int, ...], rows: int, names: tuple[str, ...]
    ) -> tuple[Operand, list[Operand], list[str]]:
        """A tile input and its per-partition/scalar operands (None ones skipped), with the
        C++ that declares them: ``const float <name> = ...;`` per scalar operand."""
        data = self._ins(step, shape, rows, pad=False, count=1)[0]
        operands = [data]
        lines: list[str] = []
        for name, x in zip(names, step.ins[1:], strict=False):
            if x is None:
                continue
            operands.append(self._scalar(x, step, shape, rows))
            lines.append(f"const float {name} = {operands[-1].at(f'x{len(operands) - 1}')};")
        return data, operands, self._declare(operands) + lines

    def _activation(self, step, lowering, outs, shapes, rows):  # noqa: ANN001, ANN202
        _, name, reduce = lowering
        template = row_cxx.UNARY.get(name)
        if template is None or (reduce is not None and reduce not in row_cxx.REDUCE):
            raise NotLowerable
        if step.ins[1] is None:
            raise NotLowerable  # no scale operand to declare
        bias = step.ins[2]
        data, operands, lines = self._data_and_scalars(step, shapes[0], rows, ("s", "b"))
        value = f"{data.at('x0')} * s" + (" + b" if bias is not None else "")
        if reduce is None:
            lines.append(f"for (long c = 0; c < {outs[0].free}; ++c) {{")
            lines.append(f"  const float op_v = {value};")
            lines.append(f"  @Y0@ {template.format(x='op_v')};")
            lines.append("}")
            return lines, operands
        if step.outs[0][2] == "acc":
            raise NotLowerable
        element = f"y0[c * {outs[0].col_stride}]"
        lines.append(f"for (long c = 0; c < {outs[0].free}; ++c) {{")
        lines.append(f"  const float op_v = {value};")
        lines.append(f"  {element} = {template.format(x='op_v')};")
        lines.append("}")
        lines += row_cxx.reduction(reduce, element, outs[0].free, "float total")
        lines.append("@Y1@ total;")
        return lines, operands

    def _tensor_scalar(self, step, lowering, outs, shapes, rows):  # noqa: ANN001, ANN202
        _, op0, reverse0, op1, reverse1 = lowering
        first = row_cxx.BINARY.get(op0)
        second = row_cxx.BINARY.get(op1) if op1 is not None else "{a}"
        if first is None or second is None:
            raise NotLowerable
        names = ("s0", "s1") if op1 is not None else ("s0",)
        data, operands, lines = self._data_and_scalars(step, shapes[0], rows, names)
        inner = first.format(a="s0", b="op_v") if reverse0 else first.format(a="op_v", b="s0")
        outer = second.format(a="s1", b="t") if reverse1 else second.format(a="t", b="s1")
        lines.append(f"for (long c = 0; c < {outs[0].free}; ++c) {{")
        lines.append(f"  const float op_v = {data.at('x0')};")
        lines.append(f"  const float t = {inner};")
        lines.append(f"  @Y0@ {outer};")
        lines.append("}")
        return lines, operands

    def _softmax(self, step, lowering, outs, shapes, rows):  # noqa: ANN001, ANN202
        x = step.ins[0]
        data = self._ins(step, shapes[0], rows, pad=False)[0]
        if data.row != "r" or data.view is None or data.view.free != outs[0].free:
            raise NotLowerable
        if tuple(lowering[1]) != tuple(range(1, len(shapes[0]))) or step.outs[0][2] == "acc":
            raise NotLowerable
        free, element = outs[0].free, f"y0[c * {outs[0].col_stride}]"
        lines = self._declare([data])
        lines += ["float m;", "{"]
        lines += row_cxx.reduction("maximum", data.at("x0"), free, "m")
        lines += ["}", "float z;", "{"]
        lines.append(f"for (long c = 0; c < {free}; ++c) {element} = op_exp({data.at('x0')} - m);")
        lines += row_cxx.reduction("add", element, free, "z")
        lines += ["}"]
        lines.append(f"for (long c = 0; c < {free}; ++c) {element} = {element} / z;")
        del x
        return lines, [data]

    def _own(self, step: Step, rows: int) -> Operand:
        """The step's one tile input, read by rows at its own shape."""
        x = step.ins[0]
        if len(step.ins) != 1 or not isinstance(x, Ref):
            raise NotLowerable
        view, array = self.tables.view(x, self.n_inputs)
        operand = self._operand(x, step, array.shape, rows, pad=False) if view else None
        if operand is None or operand.row != "r" or operand.view is None:
            raise NotLowerable
        return operand

    def _bn_stats(self, step, lowering, outs, shapes, rows):  # noqa: ANN001, ANN202
        data = self._own(step, rows)
        free = data.view.free
        out, ocs = outs[0], max(outs[0].col_stride, 1)
        if out.free != 6 or step.outs[0][2] == "acc":
            raise NotLowerable
        lines = self._declare([data])
        lines.append(f"op_bn_stats(x0, {free}, {data.view.col_stride}, y0, {ocs});")
        return lines, [data]

    def _bn_aggr(self, step, lowering, outs, shapes, rows):  # noqa: ANN001, ANN202
        data = self._own(step, rows)
        triples, cs = data.view.free // 3, max(data.view.col_stride, 1)
        out, ocs = outs[0], max(outs[0].col_stride, 1)
        if data.view.free % 3 or out.free != 2 or step.outs[0][2] == "acc":
            raise NotLowerable
        at = "x0[(3 * j + {k}) * " + str(cs) + "]"
        lines = self._declare([data])
        lines.append("float total = 0.0f, weighted = 0.0f, m2 = 0.0f;")
        lines.append(
            f"for (long j = 0; j < {triples}; ++j) {{ total += {at.format(k=0)}; "
            f"weighted += {at.format(k=0)} * {at.format(k=1)}; }}"
        )
        lines.append("const float safe = total > 0.0f ? total : 1.0f;")
        lines.append("const float grand = weighted / safe;")
        lines.append(
            f"for (long j = 0; j < {triples}; ++j) {{ const float d = {at.format(k=1)}"
            f" - grand; m2 += {at.format(k=0)} * ({at.format(k=2)} + d * d); }}"
        )
        lines.append(f"y0[0] = grand; y0[{ocs}] = m2 / safe;")
        return lines, [data]


def _col(v: View) -> str:
    return "0" if v.free == 1 or v.col_stride == 0 else f"c * {v.col_stride}"
