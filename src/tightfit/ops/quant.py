"""Quantization: QuantizeLinear (fp32 -> int8) and DequantizeLinear (int8 -> fp32) of activations,
as layers of their own where a quantized model changes domain (its input, its outputs, a layer
with no int8 kernel, which runs in fp32 between the two). The scale and zero point live in the
int8 tensor's `Quant` (graph/ir.py); the QDQ pairs around layers that have int8 kernels are folded
into those layers by the importer (frontend/qdq.py), which marks them `attrs["quant"] == "int8"`."""
from __future__ import annotations

import numpy as np
import onnx

from tightfit.graph.ir import Layer
from tightfit.ops.base import OnnxNode, OnnxSpec, Op, Shape, expect
from tightfit.ops.registry import register

# The integer types whose tensors the int8 kernels run; anything else is refused by name.
QUANT_TYPES = {onnx.TensorProto.INT8: "int8"}
INT8_RANGE = (-128, 127)


def quantized(layer: Layer) -> bool:
    """Whether the layer runs on int8 kernels (its inputs and output int8 tensors)."""
    return layer.attrs.get("quant") == "int8"


def quant_type_name(elem: int) -> str:
    return onnx.TensorProto.DataType.Name(elem).lower()


def scale_and_zero(node: OnnxNode) -> tuple[np.ndarray, np.ndarray]:
    """A QuantizeLinear / DequantizeLinear node's constant scale and zero point, as int8. A uint8
    tensor (QuantType.QUInt8; ONNX's type where the zero point is absent) is the same reals stored
    less 128: its zero point less 128, exactly (onnxruntime's own x86 kernels make that very
    shift). A quantization the int8 kernels do not run (int4, int16, float8, a data-dependent
    scale) is an InvalidNode naming it."""
    scale, zero = node.const_input(1), node.const_input(2)
    expect(scale is not None, "its scale is not a constant (a dynamic quantization)")
    zero = np.zeros((), np.uint8) if zero is None else zero
    if zero.dtype == np.uint8:
        zero = (zero.astype(np.int16) - 128).astype(np.int8)
    elif zero.dtype != np.int8:
        expect(False, f"{zero.dtype} quantization (zero point {zero.reshape(-1)[:4]}) is not run by the int8 kernels "
                      "(int8 and uint8 tensors are, zero points in [-128, 127] or [0, 255])")
    expect(scale.dtype == np.float32, f"a {scale.dtype} scale (only float32 scales)")
    expect(scale.size == 1 and zero.size == 1, "per-channel quantization of activations (one scale per tensor)")
    expect(bool(np.isfinite(scale).all() and (scale > 0).all()), f"scale {scale.reshape(-1)[:4]} is not positive")
    return scale.reshape(()), zero.reshape(())


def _stored(node: OnnxNode) -> str:
    """How the file stores the int8 tensor: "uint8" (held here as int8, less 128) or "int8"."""
    zero = node.const_input(2)
    return "uint8" if zero is None or zero.dtype == np.uint8 else "int8"


class _Rescale(Op):
    """A change of domain with one scale and zero point (QuantizeLinear, DequantizeLinear): the
    same attributes from the node, the same shape out."""

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        scale, zero = scale_and_zero(node)
        return OnnxSpec({"scale": float(scale), "zero_point": int(zero), "stored": _stored(node)}, [node.inputs[0]])

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return tuple(in_shapes[0])


@register
class Quantize(_Rescale):
    """fp32 -> int8: q = saturate(round_half_even(x / scale) + zero_point)."""

    name = "quantize"
    onnx_types = ("QuantizeLinear",)


@register
class Dequantize(_Rescale):
    """int8 -> fp32: x = (q - zero_point) * scale."""

    name = "dequantize"
    onnx_types = ("DequantizeLinear",)
