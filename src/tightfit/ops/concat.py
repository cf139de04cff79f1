"""Concat along channels (inception and densenet joins) or along H or W; splittable by rows and
tiles. Along H (W) an output region reads of each input only the rows (columns) it covers."""
from __future__ import annotations

from tightfit.graph.ir import Layer
from tightfit.ops.registry import register
from tightfit.ops.base import InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape, expect
from tightfit.ops.moves import Move


@register
class Concat(Op):
    name = "concat"
    onnx_types = ("Concat",)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        rank = len(node.shape(node.inputs[0]))
        axis = int(node.attrs.get("axis", 1)) % rank
        if axis == 0:
            raise ValueError("concatenation along the batch dim is not supported")
        if axis != 1 and rank != 4:
            raise ValueError(f"concatenation along axis {axis} of rank-{rank} tensors is not supported")
        if any(node.const(t) is not None for t in node.inputs):
            raise ValueError("concatenation with a constant is not supported")
        if axis == 1:
            return OnnxSpec({"act": ()}, list(node.inputs))
        # The inputs' sizes along the axis: a kernel given windows must know where each begins.
        sizes = tuple(int(node.shape(t)[axis]) for t in node.inputs)
        return OnnxSpec({"act": (), "axis": axis, "sizes": sizes}, list(node.inputs))

    def check(self, layer: Layer, in_shapes, params) -> None:
        """Inputs alike but along the joined axis."""
        expect(len(in_shapes) >= 1 and not params, "takes one or more data inputs and no constants")
        first = tuple(in_shapes[0])
        axis = layer.attrs.get("axis", 1)
        same = lambda s: tuple(s[:axis]) + tuple(s[axis + 1:])  # noqa: E731
        expect(len(first) in (2, 4) and 1 <= axis < len(first)
               and all(len(s) == len(first) and same(s) == same(first) for s in in_shapes),
               f"inputs of shapes {[tuple(s) for s in in_shapes]} differ in more than axis {axis}")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        first = tuple(in_shapes[0])
        axis = layer.attrs.get("axis", 1)
        return first[:axis] + (sum(s[axis] for s in in_shapes),) + first[axis + 1:]

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        axis = layer.attrs.get("axis", 1)
        if axis == 1:
            return super().input_windows(layer, out, in_shapes)
        return tuple(InputWindow(r) for r, _ in self._parts(layer, out))

    def _parts(self, layer: Layer, out: Region) -> list[tuple[Region, int]]:
        """Per input along H (axis 2) or W (3): its window, and the offset of the window's first
        row (column) in the output region, or -1 where the region holds none of the input. A
        window may not be empty (plans access non-empty regions): an input the region misses is
        read at its row nearest the region, which the kernel then leaves alone."""
        axis = layer.attrs["axis"]
        o0, o1 = (out.h0, out.h1) if axis == 2 else (out.w0, out.w1)
        parts, at = [], 0
        for size in layer.attrs["sizes"]:
            a, b = max(o0 - at, 0), min(o1 - at, size)
            offset = at + a - o0 if a < b else -1
            if a >= b:
                a = min(max(o0 - at, 0), size - 1)
                b = a + 1
            r = Region(out.n0, out.n1, a, b, out.w0, out.w1) if axis == 2 else Region(out.n0, out.n1, out.h0, out.h1, a, b)
            parts.append((r, offset))
            at += size
        return parts

    def moves(self, layer: Layer, out: Region, channels: int) -> list[Move]:
        """The spatial concatenation of a region as block moves (channels whole)."""
        axis, c = layer.attrs["axis"], channels
        moves = []
        for k, (r, offset) in enumerate(self._parts(layer, out)):
            if offset < 0:
                continue
            rows, cols = (r.h, out.w) if axis == 2 else (out.h, r.w)
            x = ((0, c, 1), (0, rows, 1), (0, cols, 1))
            y = ((0, c, 1), (offset if axis == 2 else 0, rows, 1), (offset if axis == 3 else 0, cols, 1))
            moves.append(Move(k, x, y))
        return moves

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return out.numel(out_shape)
