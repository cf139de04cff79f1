"""Pad over H and W (constant, reflect or edge). A zero Pad in front of a conv is folded into the
conv's padding by the importer; a standalone one is a splittable layer of its own. Constant and
edge padding of a band read only the band's rows; reflect padding reads the whole input and
builds the padded tensor as scratch."""
from __future__ import annotations


from tightfit.graph.ir import Layer
from tightfit.ops.attention import pad_axes_spec
from tightfit.ops.registry import register
from tightfit.ops.base import InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape, expect, expect_rank, window_1d


@register
class Pad(Op):
    name = "pad"
    onnx_types = ("Pad",)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        pads = node.attrs.get("pads")
        if pads is None:
            c = node.const_input(1)
            if c is None:
                raise ValueError("pads must be constant")
            pads = c.reshape(-1)
        pads = [int(p) for p in pads]
        rank = len(node.shape(node.inputs[0]))
        axes = node.const_input(3)  # opset 18: pads are given for these dims only
        if axes is not None and axes.size:
            axes = [int(a) % rank for a in axes.reshape(-1)]
            if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes):
                raise ValueError(f"pads {pads} do not match axes {axes}")
            full = [0] * (2 * rank)
            for i, a in enumerate(axes):
                full[a], full[a + rank] = pads[i], pads[i + len(axes)]
            pads = full
        mode = node.attrs.get("mode", "constant")
        value = node.attrs.get("value")
        if value is None:
            if len(node.inputs) > 2 and node.inputs[2] and node.const_input(2) is None:
                raise ValueError("the pad value must be a constant")
            c = node.const_input(2)
            value = 0.0 if c is None or c.size == 0 else float(c.reshape(-1)[0])
        if rank != 4 or len(pads) != 8 or any(pads[i] or pads[i + 4] for i in (0, 1)):
            if len(pads) != 2 * rank:
                raise ValueError(f"pads {pads} for rank {rank}")
            return pad_axes_spec(pads, rank, mode, float(value), node.inputs[0])  # issue 38: other axes, whole
        if mode != "constant" and any(p < 0 for p in pads):
            raise ValueError("negative pads (crop) only in constant mode")
        if mode not in ("constant", "reflect", "edge"):
            raise ValueError(f"pad mode {mode!r}")
        hw = (pads[2], pads[3], pads[6], pads[7])  # top, left, bottom, right
        return OnnxSpec({"pads_hw": hw, "mode": mode, "value": float(value),
                         "foldable": mode == "constant" and float(value) == 0.0}, [node.inputs[0]])

    def check(self, layer: Layer, in_shapes, params) -> None:
        """A crop keeps at least a row and a column; reflect padding is narrower than the input."""
        super().check(layer, in_shapes, params)
        expect_rank(in_shapes[0], (4,))
        t, l, b, r = layer.attrs["pads_hw"]
        _, _, h, w = in_shapes[0]
        expect(h + t + b >= 1 and w + l + r >= 1 and min(t, b) > -h and min(l, r) > -w,
               f"pads {(t, l, b, r)} crop away all of the input's {h} x {w}")
        if layer.attrs["mode"] == "reflect":
            expect(max(t, b) < h and max(l, r) < w, f"reflect pads {(t, l, b, r)} must be smaller than the input's {h} x {w}")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        n, c, h, w = in_shapes[0]
        t, l, b, r = layer.attrs["pads_hw"]
        return (n, c, h + t + b, w + l + r)

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        _, _, h, w = in_shapes[0]
        t, l, b, r = layer.attrs["pads_hw"]
        mode = layer.attrs["mode"]
        if mode == "reflect":
            # Reflect padding reads rows from inside the tensor at the border: take whole rows/cols
            # of the input when the region touches the padding.
            return (InputWindow(Region(out.n0, out.n1, 0, h, 0, w)),)
        if mode == "edge":  # rows (columns) in the padding repeat the first or last one
            return (InputWindow(Region(out.n0, out.n1, _clamp(out.h0 - t, h), _clamp(out.h1 - 1 - t, h) + 1,
                                       _clamp(out.w0 - l, w), _clamp(out.w1 - 1 - l, w) + 1)),)
        h0, h1, pt, pb = window_1d(out.h0, out.h1, 1, t, 1, h)
        w0, w1, pl, pr = window_1d(out.w0, out.w1, 1, l, 1, w)
        return (InputWindow(Region(out.n0, out.n1, h0, h1, w0, w1), (pt, pb, pl, pr)),)


def _clamp(i: int, size: int) -> int:
    return min(max(i, 0), size - 1)
