"""Elementwise activations, applied in place: fused after a layer or as a layer of their own.

An activation is a tuple (kind, *args) so layers can carry a chain of them in `attrs`. Every
unary elementwise function of one tensor with scalar parameters is an activation (Sqrt, Exp,
Erf, ... too): then it fuses into the layer that produces its input like any other."""
from __future__ import annotations

from tightfit.ops.abi import ACT_NAMES

Activation = tuple  # (kind, *float args)

# The activation kinds, each a case of the C library's act1 (kernels/tf_kernels.c), its code in
# ops/abi.py.
KINDS = ACT_NAMES


# ONNX node type -> activation kind; attributes are read by the importer.
ONNX_ACTIVATIONS = {
    "Relu": "relu", "LeakyRelu": "leakyrelu", "Clip": "clip", "Sigmoid": "sigmoid",
    "Tanh": "tanh", "HardSigmoid": "hardsigmoid", "HardSwish": "hardswish",
    "Mish": "mish", "Gelu": "gelu", "Softplus": "softplus", "Elu": "elu", "Selu": "selu",
    "Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Neg": "neg", "Abs": "abs", "Reciprocal": "reciprocal",
    "Erf": "erf",
}


def onnx_activation(op_type: str, attrs: dict) -> Activation:
    """The activation an ONNX node of `op_type` with attributes `attrs` computes (Clip's bounds
    are given by the importer, which knows its constant inputs)."""
    kind = ONNX_ACTIVATIONS[op_type]
    if kind == "leakyrelu":
        return (kind, float(attrs.get("alpha", 0.01)))
    if kind == "hardsigmoid":
        return (kind, float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5)))
    if kind == "elu":
        return (kind, float(attrs.get("alpha", 1.0)))
    if kind == "selu":
        return (kind, float(attrs.get("alpha", 1.67326319217681884765625)), float(attrs.get("gamma", 1.05070102214813232421875)))
    if kind == "gelu":
        approximate = attrs.get("approximate", "none")
        if approximate not in ("none", "tanh"):
            raise ValueError(f"Gelu approximate={approximate!r}; ONNX defines 'none' and 'tanh'")
        return ("gelu_tanh",) if approximate == "tanh" else ("gelu",)
    return (kind,)
