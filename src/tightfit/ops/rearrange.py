"""Slice and Split over C, H and W (steps of any sign: YOLOv5's Focus stem reads x[..., ::2, ::2]),
and DepthToSpace / SpaceToDepth. All of them only move elements, as strided block moves
(ops/moves.py); each output row comes from one input row (or `block` consecutive ones), so they
split by rows and tiles with exact windows."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tightfit.graph.ir import Layer
from tightfit.ops.base import InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape
from tightfit.ops.moves import Move, apply_moves, phase_span
from tightfit.ops.registry import register


def _normalize(start: int, end: int, step: int, dim: int) -> tuple[int, int]:
    """ONNX Slice's (start, count) along an axis of size `dim`."""
    if step == 0:
        raise ValueError("slice step 0")
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return start, max(0, -(-(end - start) // step))


def strided_span(o0: int, o1: int, begin: int, step: int) -> tuple[int, int]:
    """Input span [a, b) that outputs [o0, o1) of input[begin::step] read."""
    first, last = begin + o0 * step, begin + (o1 - 1) * step
    return min(first, last), max(first, last) + 1


def _slice_attrs(begin: Sequence[int], step: Sequence[int], size: Sequence[int]) -> dict:
    return {"begin": tuple(int(v) for v in begin), "step": tuple(int(v) for v in step),
            "size": tuple(int(v) for v in size)}


@register
class Slice(Op):
    """out[:, c, h, w] = x[:, begin_c + c * step_c, begin_h + h * step_h, begin_w + w * step_w];
    a Split is one such layer per output."""

    name = "slice"
    onnx_types = ("Slice", "Split")

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        if node.op_type == "Split":
            raise ValueError("Split has one layer per output (from_onnx_outputs)")
        shape = _rank4(node)
        starts, ends, axes, steps = _slice_inputs(node)
        begin, step, size = [0, 0, 0, 0], [1, 1, 1, 1], list(shape)
        if len(set(a % 4 for a in axes)) != len(axes):
            raise ValueError(f"slice axes {axes} repeat a dim")
        for s, e, a, k in zip(starts, ends, axes, steps):
            a %= 4
            begin[a], size[a] = _normalize(s, e, k, shape[a])
            step[a] = k
        if (begin[0], step[0], size[0]) != (0, 1, shape[0]):
            raise ValueError("slicing the batch dim is not supported")
        if 0 in size:
            raise ValueError(f"slice gives an empty tensor (shape {tuple(size)})")
        return OnnxSpec(_slice_attrs(begin[1:], step[1:], size[1:]), [node.inputs[0]])

    def from_onnx_outputs(self, node: OnnxNode) -> list[OnnxSpec]:
        if node.op_type != "Split":
            return [self.from_onnx(node)]
        shape = _rank4(node)
        axis = int(node.attrs.get("axis", 0)) % 4
        if axis == 0:
            raise ValueError("splitting the batch dim is not supported")
        parts = _split_sizes(node, shape[axis])
        specs, at = [], 0
        for part in parts:
            begin, size = [0, 0, 0], list(shape[1:])
            begin[axis - 1], size[axis - 1] = at, part
            specs.append(OnnxSpec(_slice_attrs(begin, (1, 1, 1), size), [node.inputs[0]]))
            at += part
        return specs

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return (in_shapes[0][0],) + tuple(layer.attrs["size"])

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        _, bh, bw = layer.attrs["begin"]
        _, sh, sw = layer.attrs["step"]
        h0, h1 = strided_span(out.h0, out.h1, bh, sh)
        w0, w1 = strided_span(out.w0, out.w1, bw, sw)
        return (InputWindow(Region(out.n0, out.n1, h0, h1, w0, w1)),)

    def moves(self, layer: Layer, out: Region, windows: Sequence[InputWindow]) -> list[Move]:
        a, r = layer.attrs, windows[0].region
        bc, bh, bw = a["begin"]
        sc, sh, sw = a["step"]
        # The first row (column) of the region lies at the window's start, or at its end when
        # the step is negative.
        x = ((bc, a["size"][0], sc), (bh + out.h0 * sh - r.h0, out.h, sh), (bw + out.w0 * sw - r.w0, out.w, sw))
        return [Move(0, x, ((0, a["size"][0], 1), (0, out.h, 1), (0, out.w, 1)))]


def _rank4(node: OnnxNode) -> Shape:
    shape = tuple(node.shape(node.inputs[0]))
    if len(shape) != 4:
        raise ValueError(f"{node.op_type} of a rank-{len(shape)} tensor (tightfit slices NCHW tensors)")
    return shape


def _ints(node: OnnxNode, i: int, attr: str) -> list[int] | None:
    """An int list given as attribute `attr` (older opsets) or as constant input i."""
    if attr in node.attrs:
        return [int(v) for v in node.attrs[attr]]
    if i < len(node.inputs) and node.inputs[i]:
        c = node.const_input(i)
        if c is None:
            raise ValueError(f"{node.op_type} input {i} ({attr}) must be a constant")
        return [int(v) for v in np.asarray(c).reshape(-1)]
    return None


def _slice_inputs(node: OnnxNode) -> tuple[list[int], list[int], list[int], list[int]]:
    starts, ends = _ints(node, 1, "starts"), _ints(node, 2, "ends")
    if starts is None or ends is None or len(starts) != len(ends):
        raise ValueError("slice needs starts and ends of one length")
    axes = _ints(node, 3, "axes") or list(range(len(starts)))
    steps = _ints(node, 4, "steps") or [1] * len(starts)
    if not len(axes) == len(steps) == len(starts):
        raise ValueError(f"slice starts {starts}, ends {ends}, axes {axes}, steps {steps} differ in length")
    return starts, ends, axes, steps


def _split_sizes(node: OnnxNode, dim: int) -> list[int]:
    outputs = len(node.outputs)
    split = _ints(node, 1, "split")
    if split is not None:
        if len(split) != outputs or sum(split) != dim or min(split) <= 0:
            raise ValueError(f"split {split} does not cut a dim of {dim} into {outputs} non-empty parts")
        return split
    count = int(node.attrs.get("num_outputs", outputs))
    if count != outputs:
        raise ValueError(f"num_outputs {count} but {outputs} outputs")
    if "num_outputs" in node.attrs:  # opset 18: equal parts, the last one smaller
        chunk = -(-dim // count)
        sizes = [min(chunk, dim - i * chunk) for i in range(count)]
    elif dim % count == 0:
        sizes = [dim // count] * count
    else:
        raise ValueError(f"a dim of {dim} does not split into {count} equal parts")
    if min(sizes) <= 0:
        raise ValueError(f"split of a dim of {dim} into {count} parts leaves an empty one")
    return sizes


class _BlockOp(Op):
    """DepthToSpace / SpaceToDepth with block size b: rows h*b + i of the spatial side hold
    phase i of the channels side."""

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        shape = _rank4(node)
        b = int(node.attrs.get("blocksize", 0))
        if b < 1:
            raise ValueError(f"blocksize {b}")
        mode = str(node.attrs.get("mode", "DCR"))
        if mode not in ("DCR", "CRD"):
            raise ValueError(f"mode {mode!r} (DCR or CRD)")
        if node.op_type == "DepthToSpace" and shape[1] % (b * b):
            raise ValueError(f"{shape[1]} channels do not divide by blocksize^2 = {b * b}")
        if node.op_type == "SpaceToDepth" and (shape[2] % b or shape[3] % b):
            raise ValueError(f"H x W {shape[2]}x{shape[3]} do not divide by blocksize {b}")
        return OnnxSpec({"block": b, "mode": mode}, [node.inputs[0]])

    def _phase_channels(self, layer: Layer, i: int, j: int, depth: int) -> tuple[int, int]:
        """(first, stride) of the depth-side channels that phase (i, j) of `depth` channels holds."""
        b = layer.attrs["block"]
        if layer.attrs["mode"] == "CRD":
            return i * b + j, b * b
        return (i * b + j) * (depth // (b * b)), 1


@register
class DepthToSpace(_BlockOp):
    name = "depth_to_space"
    onnx_types = ("DepthToSpace",)

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        n, c, h, w = in_shapes[0]
        b = layer.attrs["block"]
        return (n, c // (b * b), h * b, w * b)

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        b = layer.attrs["block"]
        return (InputWindow(Region(out.n0, out.n1, out.h0 // b, (out.h1 - 1) // b + 1, out.w0 // b, (out.w1 - 1) // b + 1)),)

    def moves(self, layer: Layer, out: Region, windows: Sequence[InputWindow], depth: int) -> list[Move]:
        b, r = layer.attrs["block"], windows[0].region
        c = depth // (b * b)
        moves = []
        for i in range(b):
            dy, rows = phase_span(out.h0, out.h1, i, b)
            for j in range(b):
                dx, cols = phase_span(out.w0, out.w1, j, b)
                first, stride = self._phase_channels(layer, i, j, depth)
                x = ((first, c, stride), ((out.h0 + dy) // b - r.h0, rows, 1), ((out.w0 + dx) // b - r.w0, cols, 1))
                moves.append(Move(0, x, ((0, c, 1), (dy, rows, b), (dx, cols, b))))
        return moves


@register
class SpaceToDepth(_BlockOp):
    name = "space_to_depth"
    onnx_types = ("SpaceToDepth",)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        spec = super().from_onnx(node)
        spec.attrs["mode"] = "DCR"  # SpaceToDepth has no mode: channel (i * b + j) * C + c
        return spec

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        n, c, h, w = in_shapes[0]
        b = layer.attrs["block"]
        return (n, c * b * b, h // b, w // b)

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        b = layer.attrs["block"]
        return (InputWindow(Region(out.n0, out.n1, out.h0 * b, out.h1 * b, out.w0 * b, out.w1 * b)),)

    def moves(self, layer: Layer, out: Region, windows: Sequence[InputWindow], depth: int) -> list[Move]:
        b = layer.attrs["block"]
        moves = []
        for i in range(b):
            for j in range(b):
                first, stride = self._phase_channels(layer, i, j, depth * b * b)
                y = ((first, depth, stride), (0, out.h, 1), (0, out.w, 1))
                moves.append(Move(0, ((0, depth, 1), (i, out.h, b), (j, out.w, b)), y))
        return moves


def depth_space_equivalent(in_shape: Shape, split_shape: Sequence[int], perm: Sequence[int],
                           out_shape: Sequence[int]) -> tuple[str, dict] | None:
    """The depth_to_space or space_to_depth layer (op name, attrs) that a Reshape of an (N, C, H, W)
    tensor to (N, *split_shape) (5 dims per sample), a Transpose by `perm` and a Reshape to
    (N, *out_shape) compute, or None. PyTorch spells pixel_unshuffle (and older exporters
    pixel_shuffle) so. Checked on the element indices, not by matching shapes: the pattern is
    the op exactly when it moves every element where the op does."""
    _, c, h, w = in_shape
    if len(split_shape) != 5 or len(out_shape) != 3 or tuple(sorted(perm)) != tuple(range(6)) or perm[0] != 0:
        return None
    if int(np.prod(split_shape)) != c * h * w or int(np.prod(out_shape)) != c * h * w:
        return None
    ratio = out_shape[1] / h
    block = round(ratio if ratio >= 1 else 1 / ratio)
    op = "depth_to_space" if ratio > 1 else "space_to_depth"
    if block < 2 or tuple(out_shape) != ((c // block**2, h * block, w * block) if op == "depth_to_space"
                                         else (c * block**2, h // block, w // block)):
        return None
    index = np.arange(c * h * w, dtype=np.float64).reshape(1, c, h, w)
    moved = index.reshape(1, *split_shape).transpose(*perm).reshape(1, *out_shape)
    kernel = DepthToSpace() if op == "depth_to_space" else SpaceToDepth()
    for mode in ("DCR", "CRD"):
        attrs = {"block": block, "mode": mode}
        layer = Layer(0, "probe", op, ("x",), "y", attrs)
        region = Region.whole(tuple(moved.shape))
        out = np.full(moved.shape, np.nan)
        windows = kernel.input_windows(layer, region, [tuple(index.shape)])
        apply_moves([index], out, kernel.moves(layer, region, windows, c))
        if np.array_equal(out, moved):
            return op, attrs
    return None
