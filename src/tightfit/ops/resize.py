"""Resize / Upsample over H and W (YOLO necks, FPNs, segmentation heads) in every mode of opsets
7-21: nearest (each nearest_mode), linear and cubic (cubic_coeff_a, exclude_outside), under each
coordinate_transformation_mode but tf_crop_and_resize, from scales or sizes.

Interpolation is separable: output row o reads input rows taps(o) (1 for nearest, 2 for linear, 4
for cubic) with weights, and likewise columns; a band of output rows reads exactly the input rows
its taps name, so it splits by rows and tiles. Refused with a message: tf_crop_and_resize
(reads a region of interest, and its extrapolation value outside the input) and antialias (a
downscaling filter as wide as the scale)."""
from __future__ import annotations

import math

import numpy as np

from tightfit.graph.ir import Layer
from tightfit.ops.registry import register
from tightfit.ops.base import InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape, expect, expect_rank


COORD_MODES = ("asymmetric", "align_corners", "half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn",
               "half_pixel_symmetric")
# "simple": Upsample and Resize-10, which have no nearest_mode: floor, or ceil when downscaling.
NEAREST_MODES = ("floor", "ceil", "round_prefer_floor", "round_prefer_ceil", "simple")
MODES = ("nearest", "linear", "cubic")


def original_coordinate(o: int, scale: float, in_size: int, out_size: int, coord: str) -> float:
    """Input coordinate of output place `o` along one axis (ONNX Resize's formulas)."""
    if coord == "asymmetric":
        return o / scale
    if coord == "align_corners":
        return 0.0 if out_size == 1 else o * (in_size - 1) / (out_size - 1)
    if coord == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if out_size > 1 else 0.0
    if coord == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    if coord == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if coord == "half_pixel_symmetric":
        adjustment = out_size / (scale * in_size)
        return in_size / 2 * (1 - adjustment) + (o + 0.5) / scale - 0.5
    raise ValueError(f"coordinate_transformation_mode {coord!r}")


def source_index(o: int, scale: float, in_size: int, out_size: int, coord: str, nearest: str) -> int:
    """ONNX Resize's nearest source index for output coordinate o along one axis."""
    if scale == 1 and in_size == out_size:
        # An unscaled axis is the identity, as onnxruntime has it (the formula differs only for
        # the deprecated tf_half_pixel_for_nn with ceil rounding).
        return o
    x = original_coordinate(o, scale, in_size, out_size, coord)
    if nearest == "simple":
        nearest = "ceil" if scale < 1 else "floor"
    if nearest == "floor":
        i = math.floor(x)
    elif nearest == "ceil":
        i = math.ceil(x)
    elif nearest == "round_prefer_ceil":
        i = math.floor(x + 0.5)
    else:  # round_prefer_floor
        i = math.ceil(x - 0.5)
    return min(max(i, 0), in_size - 1)


def cubic_coefficients(s: float, a: float) -> list[float]:
    """Keys' cubic weights of input places floor(x) - 1 .. floor(x) + 2, s = x - floor(x)."""
    def near(t: float) -> float:  # |t| <= 1
        return ((a + 2) * t - (a + 3)) * t * t + 1

    def far(t: float) -> float:  # 1 < |t| < 2
        return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a

    return [far(s + 1), near(s), near(1 - s), far(2 - s)]


def interpolation_taps(o: int, scale: float, in_size: int, out_size: int, a: dict) -> tuple[list[int], list[float]]:
    """Input places and weights of output place `o` (linear: 2 taps, cubic: 4), as onnxruntime
    computes them. A tap of weight 0 is moved onto a tap that counts, so windows hold only the
    places an output needs."""
    x = original_coordinate(o, scale, in_size, out_size, a["coord"])
    if a["mode"] == "linear":
        x = min(max(x, 0.0), in_size - 1.0)
        i0 = int(x)
        i1 = min(i0 + 1, in_size - 1)
        places, weights = [i0, i1], [1.0 - (x - i0), x - i0]
    else:
        f = math.floor(x)
        places = [f - 1, f, f + 1, f + 2]
        weights = cubic_coefficients(x - f, a["cubic_a"])
        if a["exclude_outside"]:
            weights = [wt if 0 <= p < in_size else 0.0 for p, wt in zip(places, weights)]
            total = sum(weights)
            weights = [wt / total for wt in weights]
        places = [min(max(p, 0), in_size - 1) for p in places]
    kept = next(p for p, wt in zip(places, weights) if wt != 0.0)
    return [p if wt != 0.0 else kept for p, wt in zip(places, weights)], weights


@register
class Resize(Op):
    name = "resize"
    onnx_types = ("Resize", "Upsample")

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        mode = {"bilinear": "linear"}.get(str(node.attrs.get("mode", "nearest")), str(node.attrs.get("mode", "nearest")))
        if mode not in MODES:
            raise ValueError(f"resize mode {mode!r} (nearest, linear or cubic)")
        in_shape = node.shape(node.inputs[0])
        scales = node.attrs.get("scales")
        sizes = None
        if node.op_type == "Upsample":
            scales = scales if scales is not None else node.const_input(1)
            coord, nearest = "asymmetric", "simple"
            if mode == "cubic":
                raise ValueError("Upsample has no cubic mode")
        else:
            old = len(node.inputs) == 2  # opset 10: (X, scales)
            scales = node.const_input(1 if old else 2)
            sizes = None if old else node.const_input(3)
            coord = node.attrs.get("coordinate_transformation_mode", "asymmetric" if old else "half_pixel")
            nearest = node.attrs.get("nearest_mode", "simple" if old else "round_prefer_floor")
            if old and mode == "cubic":
                raise ValueError("Resize-10 has no cubic mode")
        if coord == "tf_crop_and_resize":
            raise ValueError("coordinate_transformation_mode 'tf_crop_and_resize' is not supported (it reads a region "
                             "of interest and extrapolates outside the input); use half_pixel or align_corners")
        if int(node.attrs.get("antialias", 0)):
            raise ValueError("antialias is not supported (a downscaling filter as wide as the scale); export with "
                             "antialias=False")
        scale, out_hw = _scale_and_size(node, in_shape, scales, sizes)
        if coord not in COORD_MODES:
            raise ValueError(f"coordinate_transformation_mode {coord!r} is not supported")
        if nearest not in NEAREST_MODES:
            raise ValueError(f"nearest_mode {nearest!r} is not supported")
        attrs = {"scale": scale, "out_hw": out_hw, "coord": coord, "nearest": nearest, "in_hw": tuple(in_shape[2:])}
        if mode != "nearest":  # nearest layers keep the attributes they always had
            attrs.update(mode=mode, cubic_a=float(node.attrs.get("cubic_coeff_a", -0.75)),
                         exclude_outside=bool(int(node.attrs.get("exclude_outside", 0))))
        return OnnxSpec(attrs, [node.inputs[0]])

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

    def taps(self, layer: Layer, axis: int, o0: int, o1: int) -> tuple[list[list[int]], list[list[float]]]:
        """Per output place of [o0, o1): its input places and their weights (nearest: one, weight 1)."""
        a = layer.attrs
        if a.get("mode", "nearest") == "nearest":
            return [[i] for i in self._indices(layer, axis, o0, o1)], [[1.0]] * (o1 - o0)
        if a["scale"][axis] == 1 and a["out_hw"][axis] == a["in_hw"][axis]:
            # An unscaled axis is the identity, as onnxruntime has it in linear and cubic modes,
            # though tf_half_pixel_for_nn's formula would shift it by half a place.
            n = 2 if a["mode"] == "linear" else 4
            return [[o] * n for o in range(o0, o1)], [[1.0] + [0.0] * (n - 1) for _ in range(o0, o1)]
        both = [interpolation_taps(o, a["scale"][axis], a["in_hw"][axis], a["out_hw"][axis], a) for o in range(o0, o1)]
        return [p for p, _ in both], [w for _, w in both]

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        rows = [i for t in self.taps(layer, 0, out.h0, out.h1)[0] for i in t]
        cols = [i for t in self.taps(layer, 1, out.w0, out.w1)[0] for i in t]
        return (InputWindow(Region(out.n0, out.n1, min(rows), max(rows) + 1, min(cols), max(cols) + 1)),)

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        taps = {"nearest": 1, "linear": 2, "cubic": 4}[layer.attrs.get("mode", "nearest")]
        return out.numel(out_shape) * taps


def _scale_and_size(node: OnnxNode, in_shape: Shape, scales, sizes) -> tuple[tuple[float, float], tuple[int, int]]:
    # Opset 18: `axes` says which dims scales/sizes give; the others keep scale 1.
    rank = len(in_shape)
    axes = node.attrs.get("axes")
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    if len(set(axes)) != len(axes):
        raise ValueError(f"resize axes {axes} repeat a dim")
    if sizes is not None and sizes.size:
        policy = node.attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy not in ("stretch", "not_larger", "not_smaller"):
            raise ValueError(f"keep_aspect_ratio_policy {policy!r}")
        full = list(in_shape)
        given = [int(v) for v in sizes.reshape(-1)]
        if len(given) != len(axes):
            raise ValueError(f"resize sizes {given} do not match axes {axes}")
        for a, v in zip(axes, given):
            full[a] = v
        scale = [full[a] / in_shape[a] for a in range(rank)]
        if policy != "stretch":  # one scale for the given axes, the sizes rounded (opset 18)
            kept = float(np.float32((min if policy == "not_larger" else max)(scale[a] for a in axes)))
            for a in axes:
                scale[a], full[a] = kept, int(math.floor(np.float32(kept) * np.float32(in_shape[a]) + np.float32(0.5)))
        if rank != 4 or full[0] != in_shape[0] or full[1] != in_shape[1]:
            raise ValueError("resize may only scale H and W")
        if min(full[2:]) < 1:
            raise ValueError(f"resize to an empty size {full}")
        return (scale[2], scale[3]), (full[2], full[3])
    if scales is not None and np.size(scales):
        given = [float(v) for v in np.asarray(scales).reshape(-1)]
        if len(given) != len(axes):
            raise ValueError(f"resize scales {given} do not match axes {axes}")
        s = [1.0] * rank
        for a, v in zip(axes, given):
            s[a] = v
        if rank != 4 or s[0] != 1 or s[1] != 1:
            raise ValueError("resize may only scale H and W")
        if not all(math.isfinite(v) and v > 0 for v in s[2:]):
            raise ValueError(f"resize scales {s} must be finite and positive")
        # In float32, as onnxruntime multiplies: 10 x 0.7f is 7 there, 6.99... in float64.
        out_hw = tuple(int(math.floor(np.float32(in_shape[a]) * np.float32(s[a]))) for a in (2, 3))
        if min(out_hw) < 1:
            raise ValueError(f"resize scales {s} give an empty output")
        return (s[2], s[3]), out_hw  # type: ignore[return-value]
    raise ValueError("resize needs constant scales or sizes")
