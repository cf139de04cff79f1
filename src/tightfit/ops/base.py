"""The op interface: everything tightfit knows about one layer type lives in one Op.

An op describes a layer type: shapes, the input windows an output region needs, accounting, and
(kernels/step_args.py) how a step binds to its kernel in the C library, which computes any
(N, H, W) region of its output into a view it is given. An op never computes; it never knows who
split the work.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import numpy as np

from tightfit.graph.ir import Layer, spatial

if TYPE_CHECKING:
    from tightfit.graph.ir import Graph

Shape = tuple[int, ...]

WORKSPACE_MODELS = ("none", "darknet")  # none: what our C kernels need; darknet: MAFAT eq. 2.1, to compare with the paper


@dataclass(frozen=True)
class Region:
    """A box over (N, H, W) of a tensor; half-open. Tensors without H, W use [0, 1)."""

    n0: int
    n1: int
    h0: int
    h1: int
    w0: int
    w1: int

    @staticmethod
    def whole(shape: Shape, batch: int | None = None) -> "Region":
        h, w = spatial(shape)
        return Region(0, shape[0] if batch is None else batch, 0, h, 0, w)

    @property
    def n(self) -> int:
        return self.n1 - self.n0

    @property
    def h(self) -> int:
        return self.h1 - self.h0

    @property
    def w(self) -> int:
        return self.w1 - self.w0

    def numel(self, shape: Shape) -> int:
        """Elements of a tensor of logical `shape` inside this region."""
        per_pixel = shape[1] if len(shape) == 4 else _prod(shape[1:])
        return self.n * self.h * self.w * per_pixel

    def slice(self, t: np.ndarray) -> np.ndarray:
        if t.ndim == 4:
            return t[self.n0 : self.n1, :, self.h0 : self.h1, self.w0 : self.w1]
        return t[self.n0 : self.n1]

    def with_samples(self, n0: int, n1: int) -> "Region":
        return Region(n0, n1, self.h0, self.h1, self.w0, self.w1)

    def is_empty(self) -> bool:
        return self.n <= 0 or self.h <= 0 or self.w <= 0


@dataclass(frozen=True)
class InputWindow:
    """The part of an input an output region needs: an in-bounds region plus the zero padding
    (top, bottom, left, right) that lies outside the true border of the tensor."""

    region: Region
    pad: tuple[int, int, int, int] = (0, 0, 0, 0)


def _prod(xs: Sequence[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def window_1d(o0: int, o1: int, stride: int, pad_before: int, extent: int, size: int) -> tuple[int, int, int, int]:
    """Input span [a, b) for outputs [o0, o1) of a sliding window, clipped to [0, size).

    `extent` is the dilated kernel size. Returns (a, b, pad_before, pad_after) where the pads are
    the rows of zero padding outside the true border. A negative `pad_before` is a crop.
    """
    a = o0 * stride - pad_before
    b = (o1 - 1) * stride - pad_before + extent
    # A window may lie wholly in the padding (pads wider than the kernel): then it reads no
    # input rows, the empty span [0, 0) or [size, size), and is all padding.
    lo = min(max(a, 0), size)
    hi = max(min(b, size), lo)
    return lo, hi, max(0, min(b, lo) - a), max(0, b - max(a, hi))


def sliding_windows(
    out: Region, in_shape: Shape, kernel: tuple[int, int], stride: tuple[int, int],
    pads: tuple[int, int, int, int], dilation: tuple[int, int] = (1, 1),
) -> InputWindow:
    """Input window of a 2-D sliding-window op (conv, pooling); pads are (top, left, bottom, right)."""
    h, w = spatial(in_shape)
    eh = (kernel[0] - 1) * dilation[0] + 1
    ew = (kernel[1] - 1) * dilation[1] + 1
    h0, h1, pt, pb = window_1d(out.h0, out.h1, stride[0], pads[0], eh, h)
    w0, w1, pl, pr = window_1d(out.w0, out.w1, stride[1], pads[1], ew, w)
    return InputWindow(Region(out.n0, out.n1, h0, h1, w0, w1), (pt, pb, pl, pr))


@dataclass
class OnnxSpec:
    """What an op makes of one ONNX node: its attributes, the activation tensors it reads and
    the parameter arrays it holds (in the order its kernel takes them)."""

    attrs: dict[str, Any]
    inputs: list[str]
    params: list[np.ndarray] = field(default_factory=list)
    # The op to build the layer as, where it is not the op the node's type maps to (a
    # ReduceMean over C is a per-pixel channel reduction, not a global pooling).
    op: str | None = None


@dataclass(frozen=True)
class OnnxNode:
    """An ONNX node as ops see it: type, name, attributes decoded to Python values, input and
    output names, and lookups of constant inputs and of shapes (batch dim included)."""

    op_type: str
    name: str
    attrs: dict[str, Any]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    const: Callable[[str], "np.ndarray | None"]
    shape: Callable[[str], Shape]
    # The model's default-domain opset, where the importer knows it (some defaults depend on
    # it, e.g. Softmax's axis); None = unknown.
    opset: int | None = None

    def const_input(self, i: int) -> "np.ndarray | None":
        if i >= len(self.inputs) or not self.inputs[i]:
            return None
        return self.const(self.inputs[i])


def array_bytes(a: np.ndarray, itemsize: int) -> int:
    """A parameter's bytes: a float array at the plan's `itemsize`, an integer one (an int8
    weight, an int32 bias of a quantized layer) as it is stored."""
    return int(a.size) * (itemsize if a.dtype.kind == "f" else a.dtype.itemsize)


def requant_bytes(layer: Layer, graph: "Graph") -> int:
    """What an int8 convolution or dense layer keeps per output channel to requantize: TFLite's
    fixed-point multiplier and shift (two int32, a .tflite's layer), or onnxruntime's float
    multiplier (kernels/step_args.py's _multipliers)."""
    if layer.attrs.get("quant") != "int8" or "w_scale" not in layer.attrs:
        return 0
    return graph.shape(layer.output)[1] * (8 if layer.attrs.get("rounding") == "tflite" else 4)


class Op:
    """Base class; subclasses register themselves with `@register`.

    `onnx_types` are the ONNX node types the importer maps onto this op. `splittable` says
    whether an output region may be a part of the output along H and W (rows, tiles);
    ops that need their whole input (dense, global pooling, softmax) set it False.
    """

    name: ClassVar[str]
    onnx_types: ClassVar[tuple[str, ...]] = ()
    splittable: ClassVar[bool] = True
    # True when the output may be written over the first input (elementwise ops).
    inplace_ok: ClassVar[bool] = False

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        """Default: every input is an activation, no attributes."""
        return OnnxSpec({}, list(node.inputs))

    def from_onnx_outputs(self, node: OnnxNode) -> list[OnnxSpec]:
        """One spec per output of the node, each a layer of its own (Split); default: the one
        output `from_onnx` describes."""
        return [self.from_onnx(node)]

    def output_shape(self, layer: Layer, in_shapes: Sequence[Shape], graph: "Graph | None" = None) -> Shape:
        raise NotImplementedError

    def check(self, layer: Layer, in_shapes: Sequence[Shape], params: Sequence[np.ndarray]) -> None:
        """Raise ValueError (one clause, the caller names the node) where the layer's inputs,
        parameters or attributes are inconsistent: checked at import, before any shape is
        inferred from them, so that no kernel is ever given a view it would read out of bounds.
        Default: one input."""
        expect(len(in_shapes) == 1, f"takes one data input, got {len(in_shapes)}")

    def splits_rows(self, layer: Layer, in_shapes: Sequence[Shape], out_shape: Shape) -> bool:
        """Whether a step may compute a band of the output's rows (every column): `splittable`
        ops, and ops over the last axis of a rank-4 tensor whose rows are independent (attention's
        scores: a band of query tokens reads its band of q and all of k and v). Such an op that is
        not `splittable` is split by parts only (tiling cuts columns: it ends a group there)."""
        return self.splittable

    def input_windows(self, layer: Layer, out: Region, in_shapes: Sequence[Shape]) -> tuple[InputWindow, ...]:
        """Default: elementwise, each input needs the same region (broadcast dims whole)."""
        return tuple(InputWindow(_broadcast_region(out, s)) for s in in_shapes)

    def workspace_bytes(
        self, layer: Layer, out: Region, in_shapes: Sequence[Shape], out_shape: Shape,
        itemsize: int, model: str = "none", dense_out: bool = True, channels_last: bool = False,
    ) -> int:
        """Scratch bytes one step of this region needs besides its inputs and output.
        `dense_out`: the output view is one dense channels-last block (an NHWC buffer's whole
        tensor or full-width band), which kernels can write into without a temporary;
        `channels_last`: every view has unit-stride channels (NHWC buffers), which our own
        kernels take as they are."""
        return 0

    def prepare_params(self, layer: Layer, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The arrays `run_layer` takes as a layer's `params` (its parameters, float32)."""
        return [np.asarray(a, dtype=np.float32) for a in arrays]

    def kernel_bytes(self, layer: Layer, graph: "Graph", itemsize: int) -> int:
        """Bytes of the layer's main weight tensor (MAFAT's 'Weights' column)."""
        return array_bytes(graph.params[layer.params[0]], itemsize) if layer.params else 0

    def param_bytes(self, layer: Layer, graph: "Graph", itemsize: int) -> int:
        return sum(array_bytes(graph.params[p], itemsize) for p in layer.params) + requant_bytes(layer, graph)

    def macs(self, layer: Layer, out: Region, in_shapes: Sequence[Shape], out_shape: Shape) -> int:
        """Multiply-accumulates to compute `out` (elementwise ops count one per element)."""
        return out.numel(out_shape)


class InvalidNode(ValueError):
    """A node or layer whose inputs, weights or attributes contradict each other (a malformed
    model, where a plain ValueError from `from_onnx` means a form tightfit does not support)."""


def expect(condition: bool, message: str) -> None:
    """An op's check: InvalidNode(message) unless `condition`."""
    if not condition:
        raise InvalidNode(message)


def expect_rank(shape: Shape, ranks: tuple[int, ...], what: str = "input") -> None:
    expect(len(shape) in ranks, f"{what} of shape {tuple(shape)} must have rank {' or '.join(map(str, ranks))}")


# Kernels, strides and dilations reach the C kernels as 32-bit ints.
WINDOW_INT_MAX = 2**31 - 1


def expect_positive(values: Sequence[int], n: int, what: str) -> None:
    expect(len(values) == n and all(isinstance(v, (int, np.integer)) and 1 <= v <= WINDOW_INT_MAX for v in values),
           f"{what} {tuple(values)} must be {n} integers >= 1 (below 2^31)")


def _broadcast_region(out: Region, shape: Shape) -> Region:
    """The region of an input broadcast against the output: spatial dims of size 1 stay whole
    (squeeze-excitation scales); the batch always follows the output (N is free)."""
    h, w = spatial(shape)
    h0, h1 = (0, 1) if h == 1 else (out.h0, out.h1)
    w0, w1 = (0, 1) if w == 1 else (out.w0, out.w1)
    return Region(out.n0, out.n1, h0, h1, w0, w1)
