"""Ops of attention blocks and token tensors (issue 38): MatMul of two activations, Softmax /
LogSoftmax over any axis, LayerNormalization over the last axis, ReduceMean / ReduceSum /
ReduceMax / ReduceL2 over any axes, and Gather of one index along a non-batch axis.

Each works on a whole axis (a sequence of tokens, a row of scores). On rank-4 data worked on
along its last axis, the rows (dim 2: the query tokens of attention's scores, the tokens of
(N, windows, T, C)) are independent: MatMul, Softmax / LayerNorm over the last axis split by bands
of rows (`splits_rows`; parts runs them by rows, tiling, which cuts columns too, ends a group
there). Otherwise a step of one needs its whole input, and the planners end a group at it.
Their tensors have rank 2 to 4 (the kernels' views hold 4 dims; the batch is dim 0 and free).
The ONNX types stay with the ops that import their older forms (MatMul with gemm, Softmax with
softmax, LayerNormalization with channel_norm, ReduceMean / ReduceMax with global_pool); those
hand a node to an op here (OnnxSpec.op) when its axes are not the ones they run over.
"""
from __future__ import annotations

from math import prod

import numpy as np

from tightfit.graph.ir import Layer
from tightfit.ops.binary import merged_dims
from tightfit.ops.registry import get_op, register
from tightfit.ops.base import InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape, expect

MAX_RANK = 4  # the kernels' views hold (N, C, H, W)
# Ops over one axis take up to rank 6 (windows x heads x tokens): a tensor above rank 4 is held
# contiguous, so the dims before and after the axis each merge into one dim of the view.
AXIS_RANK = 6


def _axis(node: OnnxNode, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _rank_ok(shape: Shape, what: str = "data", top: int = MAX_RANK) -> None:
    if not 2 <= len(shape) <= top:
        raise ValueError(f"{what} of rank {len(shape)} {tuple(shape)}: ranks 2 to {top} are supported")


class _WholeSamples(Op):
    """Reads whole samples of every input; splits along N only."""

    splittable = False

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        return tuple(InputWindow(Region.whole(s).with_samples(out.n0, out.n1)) for s in in_shapes)

    def kernel_bytes(self, layer, graph, itemsize) -> int:
        return 0


def _rows_of(r: Region, shape: Shape) -> Region:
    """Rows r.h0..r.h1 of every column of a rank-4 tensor of `shape`."""
    return Region(r.n0, r.n1, r.h0, r.h1, 0, shape[3])


def _over_last_of_4(layer: Layer, in_shapes, out_shape: Shape) -> bool:
    """Rank-4 data worked on along its last axis (W): its rows (H: tokens, or query tokens of
    attention's scores) are independent, so a band of rows reads the same band of the input."""
    return len(out_shape) == 4 and all(len(s) == 4 for s in in_shapes)


class _RowsOfLast(_WholeSamples):
    """An op along the last axis: on rank-4 data a band of rows (every column) reads that band."""

    def splits_rows(self, layer: Layer, in_shapes, out_shape: Shape) -> bool:
        return _over_last_of_4(layer, in_shapes, out_shape) and self._along_last(layer, out_shape)

    def _along_last(self, layer: Layer, out_shape: Shape) -> bool:
        return True

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        if len(in_shapes[0]) != 4:
            return super().input_windows(layer, out, in_shapes)
        return (InputWindow(_rows_of(out, in_shapes[0])),)


MATMUL_RANK = 6  # batch dims beyond the view's two are merged (they lie one after the other)


def _matrices(layer: Layer, in_shapes) -> tuple[tuple[int, int], tuple[int, int]]:
    """(rows, inner) of a and (inner, cols) of b, as the layer reads them (trans_*: the last two
    dims swapped, an Einsum's k^T)."""
    a, b = (tuple(s[-2:]) for s in in_shapes)
    return (a[::-1] if layer.attrs.get("trans_a") else a), (b[::-1] if layer.attrs.get("trans_b") else b)  # type: ignore[return-value]


@register
class MatMul(_WholeSamples):
    """y = a @ b of two activations (attention's q k^T and weights v): the last two dims are the
    matrices (read transposed where trans_a / trans_b say: Einsum's "bhid,bhjd->bhij"), the others
    batch dims that broadcast as numpy's (dim 0, the batch N, alike in both)."""

    name = "matmul"
    onnx_types = ("Einsum",)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        return einsum_spec(node) if node.op_type == "Einsum" else matmul_spec(node)

    def check(self, layer: Layer, in_shapes, params) -> None:
        expect(len(in_shapes) == 2 and not params, f"takes two data inputs, got {len(in_shapes)} and {len(params)} constants")
        a, b = (tuple(s) for s in in_shapes)
        expect(3 <= len(a) <= MATMUL_RANK and 3 <= len(b) <= MATMUL_RANK,
               f"inputs {a} and {b} must have ranks 3 to {MATMUL_RANK} (a batch and a matrix per sample)")
        expect(a[0] == b[0], f"inputs {a} and {b} differ in batch")
        (_, ka), (kb, _) = _matrices(layer, in_shapes)
        expect(ka == kb, f"inner dims of {a} and {b} differ ({ka} and {kb})")
        try:
            np.broadcast_shapes(a[1:-2], b[1:-2])
        except ValueError:
            raise ValueError(f"batch dims of {a} and {b} do not broadcast") from None

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        a, b = (tuple(s) for s in in_shapes)
        batch = tuple(np.broadcast_shapes(a[1:-2], b[1:-2]))
        (rows, _), (_, cols) = _matrices(layer, in_shapes)
        return (a[0],) + batch + (rows, cols)

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return out.numel(out_shape) * _matrices(layer, in_shapes)[0][1]

    def splits_rows(self, layer: Layer, in_shapes, out_shape: Shape) -> bool:
        """Rank 4 (N, heads, rows, cols), a not transposed: a band of rows of y is that band of a
        times the whole of b (attention's q k^T and weights v, by bands of query tokens)."""
        return _over_last_of_4(layer, in_shapes, out_shape) and not layer.attrs.get("trans_a")

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        whole = super().input_windows(layer, out, in_shapes)
        if len(in_shapes[0]) != 4 or layer.attrs.get("trans_a"):
            return whole
        return (InputWindow(_rows_of(out, in_shapes[0])), whole[1])


def matmul_spec(node: OnnxNode) -> OnnxSpec:
    """The matmul layer of a MatMul node of two activations (gemm's from_onnx hands it here)."""
    a, b = node.shape(node.inputs[0]), node.shape(node.inputs[1])
    if len(a) != len(b):
        raise ValueError(f"MatMul of activations of ranks {len(a)} and {len(b)}; equal ranks (3 to {MATMUL_RANK}) are supported")
    return OnnxSpec({"act": ()}, list(node.inputs[:2]), op="matmul")


def einsum_spec(node: OnnxNode) -> OnnxSpec:
    """An Einsum of the forms attention is written in: a batched matrix product of two activations
    with the same batch letters, either operand's matrix possibly transposed ("bhid,bhjd->bhij",
    "bhij,bhjd->bhid")."""
    eq = str(node.attrs.get("equation", "")).replace(" ", "")
    terms, _, out = eq.partition("->")
    ins = terms.split(",")
    form = f"Einsum {eq!r}: only batched matrix products of two inputs with the same batch letters are supported"
    if len(ins) != 2 or len(node.inputs) != 2 or not out or "." in eq or not all(s.isalpha() for s in ins + [out]):
        raise ValueError(form)
    a, b = ins
    if not (len(a) == len(b) == len(out) >= 3 and a[:-2] == b[:-2] == out[:-2]):
        raise ValueError(form)
    i, j = out[-2:]
    k = next((c for c in a[-2:] if c != i), None)
    if k is None or {i, k} != set(a[-2:]) or {k, j} != set(b[-2:]) or len({i, j, k}) != 3 or k in a[:-2]:
        raise ValueError(form)
    if any(node.const_input(n) is not None for n in range(2)):
        raise ValueError(f"Einsum {eq!r} of a constant: only products of two activations are supported")
    spec = matmul_spec(node)
    spec.attrs.update({"trans_a": a[-2:] == k + i, "trans_b": b[-2:] == j + k})
    return spec


@register
class SoftmaxAxis(_RowsOfLast):
    """Softmax / LogSoftmax over one axis other than C of an NCHW map (the scores of attention,
    over the last axis): softmax's kernel over a view whose C is that axis."""

    name = "softmax_axis"
    inplace_ok = True  # the kernel reads each element before it writes it (attention's scores)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        return softmax_axis_spec(node, _axis(node, int(node.attrs.get("axis", -1)), len(node.shape(node.inputs[0]))))

    def check(self, layer: Layer, in_shapes, params) -> None:
        super().check(layer, in_shapes, params)
        rank, axis = len(in_shapes[0]), layer.attrs["axis"]
        expect(2 <= rank <= AXIS_RANK and isinstance(axis, int) and 1 <= axis < rank,
               f"axis {axis} of {tuple(in_shapes[0])}: an axis after the batch of a tensor of rank 2 to {AXIS_RANK}")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return tuple(in_shapes[0])

    def _along_last(self, layer: Layer, out_shape: Shape) -> bool:
        return layer.attrs["axis"] == len(out_shape) - 1

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return 3 * out.numel(out_shape)


def softmax_axis_spec(node: OnnxNode, axis: int) -> OnnxSpec:
    _rank_ok(node.shape(node.inputs[0]), top=AXIS_RANK)
    return OnnxSpec({"axis": axis, "log": node.op_type == "LogSoftmax"}, [node.inputs[0]], op="softmax_axis")


@register
class LayerNorm(_RowsOfLast):
    """LayerNormalization over the last axis (of tokens N x T x C, or of any rank 2-4 tensor):
    channel_norm's kernel over a view whose C is that axis; scale and bias one value per element
    of it."""

    name = "layer_norm"
    inplace_ok = True  # statistics first, then each element read before it is written

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        eps = float(node.attrs.get("epsilon", 1e-5))
        return layer_norm_spec(node, _axis(node, int(node.attrs.get("axis", -1)), len(node.shape(node.inputs[0]))), eps)

    def check(self, layer: Layer, in_shapes, params) -> None:
        super().check(layer, in_shapes, params)
        shape = tuple(in_shapes[0])
        expect(2 <= len(shape) <= AXIS_RANK, f"input {shape} must have rank 2 to {AXIS_RANK}")
        expect(len(params) == 2 and all(tuple(p.shape) == (shape[-1],) for p in params),
               f"scale and bias of shapes {[tuple(p.shape) for p in params]} must be ({shape[-1]},)")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return tuple(in_shapes[0])

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return 4 * out.numel(out_shape)


def layer_norm_spec(node: OnnxNode, axis: int, eps: float) -> OnnxSpec:
    """LayerNormalization over dims axis.. of which only the last is above 1 (channel_norm's
    from_onnx hands every node that is not over channels here)."""
    shape = node.shape(node.inputs[0])
    _rank_ok(shape, top=AXIS_RANK)
    if axis == 0 or any(d != 1 for d in shape[axis:-1]):
        raise ValueError(f"LayerNormalization over axes {axis}..{len(shape) - 1} of {shape}: only over the last axis "
                         "(or over channels) is supported")
    d = shape[-1]
    params = []
    for i, default in ((1, 1.0), (2, 0.0)):
        v = node.const_input(i) if i < len(node.inputs) and node.inputs[i] else np.full(d, default, np.float32)
        if v is None:
            raise ValueError(f"input {i} (scale or bias) must be a constant")
        if v.size not in (1, d) or (v.size == d and v.shape[-1:] != (d,)):
            raise ValueError(f"scale or bias of shape {v.shape} is not one value per element of the last axis ({d})")
        params.append(np.broadcast_to(np.asarray(v, np.float32).reshape(-1), (d,)).copy())
    return OnnxSpec({"epsilon": eps, "act": ()}, [node.inputs[0]], params, op="layer_norm")


REDUCE_KINDS = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceL2": "l2"}


@register
class Reduce(_WholeSamples):
    """ReduceMean / ReduceSum / ReduceMax / ReduceL2 over any axes after the batch, with or
    without keepdims (global_pool takes the means and maxima over H and W, channel_reduce those
    over C of NCHW maps)."""

    name = "reduce"
    onnx_types = ("ReduceSum", "ReduceL2")

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        return reduce_spec(node)

    def check(self, layer: Layer, in_shapes, params) -> None:
        super().check(layer, in_shapes, params)
        rank, axes = len(in_shapes[0]), tuple(layer.attrs["axes"])
        expect(2 <= rank <= AXIS_RANK, f"input {tuple(in_shapes[0])} must have rank 2 to {AXIS_RANK}")
        kept = [1 if k in axes else d for k, d in enumerate(in_shapes[0])]
        out_rank = rank if layer.attrs["keepdims"] else rank - len(axes)
        # Above rank 4 both tensors are held contiguous (an output of rank 4 may be NHWC: refused).
        expect(rank <= MAX_RANK or (out_rank > MAX_RANK and len(merged_dims(tuple(in_shapes[0]), [tuple(kept)])) <= MAX_RANK),
               f"axes {axes} of {tuple(in_shapes[0])}: above rank 4, a reduction to rank 5-6 whose reduced and kept "
               "axes merge into 4 dims")
        expect(len(axes) >= 1 and sorted(set(axes)) == list(axes) and all(1 <= a < rank for a in axes),
               f"axes {axes} must be distinct, sorted axes after the batch of rank {rank}")
        expect(layer.attrs["kind"] in ("mean", "sum", "max", "l2"), f"kind {layer.attrs['kind']!r}")
        expect(layer.attrs["keepdims"] or rank - len(axes) >= 2, f"keepdims=0 over {axes} of rank {rank} leaves the batch alone")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        axes, shape = set(layer.attrs["axes"]), in_shapes[0]
        if layer.attrs["keepdims"]:
            return tuple(1 if i in axes else d for i, d in enumerate(shape))
        return tuple(d for i, d in enumerate(shape) if i not in axes)

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return out.n * prod(in_shapes[0][1:])


def reduce_spec(node: OnnxNode) -> OnnxSpec:
    """A Reduce* node over any axes after the batch (axes from the attribute, or the input since
    opsets 13 / 18; none: all axes, unless noop_with_empty_axes)."""
    shape = node.shape(node.inputs[0])
    _rank_ok(shape, top=AXIS_RANK)
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        c = node.const_input(1)
        if c is None:
            raise ValueError("axes must be a constant")
        axes = [int(a) for a in c.reshape(-1)]
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            raise ValueError("a reduction over no axes (noop_with_empty_axes) is not supported")
        axes = list(range(len(shape)))
    axes = sorted({_axis(node, int(a), len(shape)) for a in axes})
    if 0 in axes:
        raise ValueError(f"a reduction over the batch axis of {shape} is not supported (the batch is free)")
    keepdims = bool(node.attrs.get("keepdims", 1))
    if not keepdims and len(shape) - len(axes) < 2:
        raise ValueError(f"keepdims=0 over axes {axes} of {shape} leaves the batch alone (keepdims=1 is supported)")
    if len(shape) > MAX_RANK and (len(shape) - len(axes) if not keepdims else len(shape)) <= MAX_RANK:
        raise ValueError(f"a reduction of rank-{len(shape)} data to rank {len(shape) - len(axes)} (keepdims=0); "
                         "above rank 4, keepdims=1 or a result of rank 5-6 is supported")
    return OnnxSpec({"kind": REDUCE_KINDS[node.op_type], "axes": tuple(axes), "keepdims": keepdims, "act": ()},
                    [node.inputs[0]], op="reduce")


@register
class Gather(_WholeSamples):
    """Gather of one constant index along an axis after the batch (q, k, v out of one projection:
    qkv[0], qkv[1], qkv[2]), the axis dropped; a copy of a block of each sample."""

    name = "gather"
    onnx_types = ("Gather",)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        shape = node.shape(node.inputs[0])
        idx = node.const_input(1)
        if idx is None or idx.ndim != 0:
            raise ValueError("only a Gather of one constant index (a scalar) from activations is supported")
        if not 3 <= len(shape) <= AXIS_RANK:
            raise ValueError(f"Gather from data of rank {len(shape)}; ranks 3 to {AXIS_RANK} are supported")
        axis = _axis(node, int(node.attrs.get("axis", 0)), len(shape))
        if axis == 0:
            raise ValueError("a Gather along the batch axis is not supported")
        i = int(idx)
        if not -shape[axis] <= i < shape[axis]:
            raise ValueError(f"index {i} out of range for axis {axis} of {shape}")
        return OnnxSpec({"axis": axis, "index": i % shape[axis]}, [node.inputs[0]])

    def check(self, layer: Layer, in_shapes, params) -> None:
        super().check(layer, in_shapes, params)
        shape, axis, i = tuple(in_shapes[0]), layer.attrs["axis"], layer.attrs["index"]
        expect(3 <= len(shape) <= AXIS_RANK and 1 <= axis < len(shape) and 0 <= i < shape[axis],
               f"index {i} of axis {axis} of {shape}: an index in range of an axis after the batch")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return tuple(d for k, d in enumerate(in_shapes[0]) if k != layer.attrs["axis"])

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return out.numel(out_shape)


@register
class PadAxes(_WholeSamples):
    """Pad of any two axes after the batch (a channels-last map (N, H, W, C) padded over H and W
    before Swin's window partition; tokens): pad's kernel over a view whose H and W are those axes.
    The pad op keeps the NCHW maps padded over H and W, which split by rows."""

    name = "pad_axes"

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        spec = get_op("pad").from_onnx(node)  # the Pad node's forms are read there
        if spec.op != "pad_axes":
            raise ValueError("a pad of H and W of an NCHW map is the pad op's")
        return spec

    def check(self, layer: Layer, in_shapes, params) -> None:
        super().check(layer, in_shapes, params)
        shape, axes, pads = tuple(in_shapes[0]), tuple(layer.attrs["axes"]), tuple(layer.attrs["pads"])
        expect(2 <= len(shape) <= MAX_RANK and len(axes) == 2 and len(pads) == 4 and all(p >= 0 for p in pads),
               f"pads {pads} of axes {axes} of {shape}: two axes, pads >= 0")
        expect(axes[0] < axes[1] and 1 <= axes[0] and axes[1] <= max(len(shape), 3),
               f"axes {axes} of {shape} must be two axes after the batch")
        if layer.attrs["mode"] == "reflect":
            expect(all(p < shape[a] for a, p in zip(axes + axes, pads) if a < len(shape)), "reflect pads wider than the input")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        shape = list(in_shapes[0])
        for a, before, after in zip(layer.attrs["axes"], layer.attrs["pads"][:2], layer.attrs["pads"][2:]):
            if a < len(shape):
                shape[a] += before + after
        return tuple(shape)


def pad_axes_spec(pads: list[int], rank: int, mode: str, value: float, x: str) -> OnnxSpec:
    """A Pad (pads of every axis, begins then ends) of at most two axes after the batch."""
    padded = [a for a in range(1, rank) if pads[a] or pads[a + rank]]
    if pads[0] or pads[rank] or len(padded) > 2 or any(p < 0 for p in pads) or not 2 <= rank <= MAX_RANK:
        raise ValueError(f"pads {pads} of rank-{rank} data: at most two axes after the batch, no crop, rank 2 to 4")
    spare = [a for a in range(1, max(rank, 3)) if a not in padded]
    axes = tuple(sorted(padded + spare[: 2 - len(padded)]))
    at = [pads[a] if a < rank else 0 for a in axes] + [pads[a + rank] if a < rank else 0 for a in axes]
    return OnnxSpec({"axes": axes, "pads": tuple(at), "mode": mode, "value": float(value)}, [x], op="pad_axes")
