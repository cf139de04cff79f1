"""Nearest-neighbour Resize / Upsample over H and W (YOLO heads, FPNs). Each output row reads one
input row, so a row band of output needs only the band of input rows it maps to."""
from __future__ import annotations

import math

import numpy as np
import torch

from tightfit.graph.ir import Layer
from tightfit.ops.registry import register
from tightfit.ops.base import InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape, expect, expect_rank


COORD_MODES = ("asymmetric", "align_corners", "half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn")
NEAREST_MODES = ("floor", "ceil", "round_prefer_floor", "round_prefer_ceil")


def source_index(o: int, scale: float, in_size: int, out_size: int, coord: str, nearest: str) -> int:
    """ONNX Resize's nearest source index for output coordinate o along one axis."""
    if scale == 1 and in_size == out_size:
        # An unscaled axis is the identity, as onnxruntime has it (the formula differs only for
        # the deprecated tf_half_pixel_for_nn with ceil rounding).
        return o
    if coord == "asymmetric":
        x = o / scale
    elif coord == "align_corners":
        x = 0.0 if out_size == 1 else o * (in_size - 1) / (out_size - 1)
    elif coord == "pytorch_half_pixel":
        x = (o + 0.5) / scale - 0.5 if out_size > 1 else 0.0
    elif coord == "tf_half_pixel_for_nn":
        x = (o + 0.5) / scale
    elif coord == "half_pixel":
        x = (o + 0.5) / scale - 0.5
    else:
        raise ValueError(f"coordinate_transformation_mode {coord!r}")
    if nearest == "floor":
        i = math.floor(x)
    elif nearest == "ceil":
        i = math.ceil(x)
    elif nearest == "round_prefer_ceil":
        i = math.floor(x + 0.5)
    else:  # round_prefer_floor
        i = math.ceil(x - 0.5)
    return min(max(i, 0), in_size - 1)


@register
class Resize(Op):
    name = "resize"
    onnx_types = ("Resize", "Upsample")

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        mode = node.attrs.get("mode", "nearest")
        if mode != "nearest":
            raise ValueError(f"only nearest resize is supported, not {mode!r}")
        in_shape = node.shape(node.inputs[0])
        scales = node.attrs.get("scales")
        sizes = None
        if node.op_type == "Upsample":
            scales = scales if scales is not None else node.const_input(1)
            coord, nearest = "asymmetric", "floor"
        else:
            old = len(node.inputs) == 2  # opset 10: (X, scales)
            scales = node.const_input(1 if old else 2)
            sizes = None if old else node.const_input(3)
            coord = node.attrs.get("coordinate_transformation_mode", "asymmetric" if old else "half_pixel")
            nearest = node.attrs.get("nearest_mode", "floor" if old else "round_prefer_floor")
        # Opset 18: `axes` says which dims scales/sizes give; the others keep scale 1.
        rank = len(in_shape)
        axes = node.attrs.get("axes")
        axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
        if len(set(axes)) != len(axes):
            raise ValueError(f"resize axes {axes} repeat a dim")
        if sizes is not None and sizes.size:
            if node.attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
                raise ValueError("resize with keep_aspect_ratio_policy other than 'stretch' is not supported")
            full = list(in_shape)
            given = [int(v) for v in sizes.reshape(-1)]
            if len(given) != len(axes):
                raise ValueError(f"resize sizes {given} do not match axes {axes}")
            for a, v in zip(axes, given):
                full[a] = v
            if rank != 4 or full[0] != in_shape[0] or full[1] != in_shape[1]:
                raise ValueError("resize may only scale H and W")
            out_hw = (full[2], full[3])
            scale = (out_hw[0] / in_shape[2], out_hw[1] / in_shape[3])
        elif scales is not None and np.size(scales):
            given = [float(v) for v in np.asarray(scales).reshape(-1)]
            if len(given) != len(axes):
                raise ValueError(f"resize scales {given} do not match axes {axes}")
            s = [1.0] * rank
            for a, v in zip(axes, given):
                s[a] = v
            if rank != 4 or s[0] != 1 or s[1] != 1:
                raise ValueError("resize may only scale H and W")
            scale = (s[2], s[3])
            if not all(math.isfinite(v) and v > 0 for v in scale):
                raise ValueError(f"resize scales {given} must be finite and positive")
            out_hw = (int(math.floor(in_shape[2] * s[2])), int(math.floor(in_shape[3] * s[3])))
        else:
            raise ValueError("resize needs constant scales or sizes")
        if coord not in COORD_MODES:
            raise ValueError(f"nearest resize with coordinate_transformation_mode {coord!r} is not supported")
        if nearest not in NEAREST_MODES:
            raise ValueError(f"nearest_mode {nearest!r} is not supported")
        return OnnxSpec({"scale": scale, "out_hw": out_hw, "coord": coord, "nearest": nearest,
                         "in_hw": tuple(in_shape[2:])}, [node.inputs[0]])

    def check(self, layer: Layer, in_shapes, params) -> None:
        super().check(layer, in_shapes, params)
        a = layer.attrs
        expect_rank(in_shapes[0], (4,))
        expect(all(isinstance(d, int) and d >= 1 for d in a["out_hw"]), f"output size {tuple(a['out_hw'])} must be >= 1")
        expect(all(math.isfinite(s) and s > 0 for s in a["scale"]), f"scales {tuple(a['scale'])} must be finite and positive")
        expect(tuple(a["in_hw"]) == tuple(in_shapes[0][2:]), f"imported for input size {tuple(a['in_hw'])}, given {tuple(in_shapes[0][2:])}")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        n, c = in_shapes[0][:2]
        return (n, c) + tuple(layer.attrs["out_hw"])

    def _indices(self, layer: Layer, axis: int, o0: int, o1: int) -> list[int]:
        a = layer.attrs
        return [source_index(o, a["scale"][axis], a["in_hw"][axis], a["out_hw"][axis], a["coord"], a["nearest"])
                for o in range(o0, o1)]

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        rows = self._indices(layer, 0, out.h0, out.h1)
        cols = self._indices(layer, 1, out.w0, out.w1)
        return (InputWindow(Region(out.n0, out.n1, min(rows), max(rows) + 1, min(cols), max(cols) + 1)),)

    def compute(self, layer, inputs, windows, out, out_region, params) -> None:
        r = windows[0].region
        rows = torch.tensor([i - r.h0 for i in self._indices(layer, 0, out_region.h0, out_region.h1)])
        cols = torch.tensor([i - r.w0 for i in self._indices(layer, 1, out_region.w0, out_region.w1)])
        out.copy_(inputs[0].index_select(2, rows).index_select(3, cols))

    def workspace_bytes(self, layer, out, in_shapes, out_shape, itemsize, model="torch", dense_out: bool = True, channels_last: bool = False) -> int:
        return 2 * out.numel(out_shape) * itemsize if model == "torch" else 0
