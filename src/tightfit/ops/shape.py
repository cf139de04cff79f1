"""Layout ops: Flatten, Reshape, Transpose, Squeeze, Unsqueeze, and the channel shuffle that
ShuffleNet spells as Reshape -> Transpose -> Reshape (fused by the importer into one op that
splits by rows like any elementwise op).

Reshape-like ops keep the batch dim: dim 0 of every tensor is N and is free."""
from __future__ import annotations

from math import prod


from tightfit.graph.ir import Layer
from tightfit.ops.registry import register
from tightfit.ops.base import InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape, expect, expect_rank


class _Whole(Op):
    """Layout ops that read whole samples."""

    splittable = False

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        return (InputWindow(Region.whole(in_shapes[0]).with_samples(out.n0, out.n1)),)

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return out.numel(out_shape)


@register
class Flatten(_Whole):
    name = "flatten"
    onnx_types = ("Flatten",)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        axis = int(node.attrs.get("axis", 1)) % max(1, len(node.shape(node.inputs[0])))
        if axis != 1:
            raise ValueError("only Flatten with axis 1 (keep the batch) is supported")
        return OnnxSpec({"axis": 1}, [node.inputs[0]])

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return (in_shapes[0][0], prod(in_shapes[0][1:]))


@register
class Reshape(_Whole):
    """Reshape, Squeeze and Unsqueeze: a new per-sample shape, same elements in the same order."""

    name = "reshape"
    onnx_types = ("Reshape", "Squeeze", "Unsqueeze")

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        in_shape = node.shape(node.inputs[0])
        target = _target_shape(node, in_shape)
        if target[0] != in_shape[0]:
            raise ValueError(f"reshape to {target} would mix samples of the batch")
        return OnnxSpec({"sample_shape": tuple(target[1:])}, [node.inputs[0]])

    def check(self, layer: Layer, in_shapes, params) -> None:
        super().check(layer, in_shapes, params)
        target, have = tuple(layer.attrs["sample_shape"]), prod(in_shapes[0][1:])
        expect(all(isinstance(d, int) and d >= 1 for d in target) and prod(target) == have,
               f"target shape {target} per sample must be positive dims holding the input's {have} elements "
               f"(input {tuple(in_shapes[0])})")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return (in_shapes[0][0],) + tuple(layer.attrs["sample_shape"])


def _target_shape(node: OnnxNode, in_shape: Shape) -> tuple[int, ...]:
    if node.op_type == "Reshape":
        spec = node.const_input(1)
        if spec is None:
            raise ValueError("reshape target must be a constant")
        dims = [int(d) for d in spec.reshape(-1)]
        if any(d == 0 and i >= len(in_shape) for i, d in enumerate(dims)):
            raise ValueError(f"reshape target {dims} copies a dim the input {in_shape} does not have")
        dims = [in_shape[i] if d == 0 and not node.attrs.get("allowzero", 0) else d for i, d in enumerate(dims)]
        if dims.count(-1) > 1 or any(d < -1 for d in dims):
            raise ValueError(f"reshape target {dims} must be dims >= 0 with at most one -1")
        if -1 in dims:
            known = prod(d for d in dims if d != -1)
            if known <= 0 or prod(in_shape) % known:
                raise ValueError(f"reshape target {dims} cannot hold the input {in_shape}")
            dims[dims.index(-1)] = prod(in_shape) // known
        return tuple(dims)
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1:
        c = node.const_input(1)
        axes = None if c is None else [int(a) for a in c.reshape(-1)]
    if axes is not None and any(not -len(in_shape) - len(axes) <= a < len(in_shape) + len(axes) for a in axes):
        raise ValueError(f"{node.op_type} axes {list(axes)} out of range for rank {len(in_shape)}")
    if node.op_type == "Squeeze":
        axes = [a % len(in_shape) for a in axes] if axes is not None else [i for i, d in enumerate(in_shape) if d == 1 and i > 0]
        if any(in_shape[a] != 1 for a in axes):
            raise ValueError(f"Squeeze axes {axes} of input {in_shape} are not of size 1")
        return tuple(d for i, d in enumerate(in_shape) if i not in axes)
    out = list(in_shape)
    rank = len(in_shape) + len(axes)
    for a in sorted(x % rank for x in axes):
        out.insert(a, 1)
    return tuple(out)


@register
class Transpose(_Whole):
    name = "transpose"
    onnx_types = ("Transpose",)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        rank = len(node.shape(node.inputs[0]))
        perm = tuple(int(p) for p in node.attrs.get("perm", range(rank - 1, -1, -1)))
        if perm[0] != 0:
            raise ValueError("transpose that moves the batch dim is not supported")
        return OnnxSpec({"perm": perm}, [node.inputs[0]])

    def check(self, layer: Layer, in_shapes, params) -> None:
        super().check(layer, in_shapes, params)
        perm = tuple(layer.attrs["perm"])
        expect(sorted(perm) == list(range(len(in_shapes[0]))) and perm[:1] == (0,),
               f"perm {perm} must reorder the {len(in_shapes[0])} dims of the input, keeping the batch first")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return tuple(in_shapes[0][p] for p in layer.attrs["perm"])


@register
class ChannelShuffle(Op):
    """Reshape (N, g, C/g, H, W) -> Transpose(0, 2, 1, 3, 4) -> Reshape (N, C, H, W)."""

    name = "channel_shuffle"

    def check(self, layer: Layer, in_shapes, params) -> None:
        super().check(layer, in_shapes, params)
        expect_rank(in_shapes[0], (4,))
        g = layer.attrs["groups"]
        expect(isinstance(g, int) and g >= 1 and in_shapes[0][1] % g == 0, f"groups {g} must divide {in_shapes[0][1]} channels")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return tuple(in_shapes[0])
