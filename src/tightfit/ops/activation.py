"""Elementwise activations, applied in place: fused after a layer or as a layer of their own.

An activation is a tuple (kind, *args) so layers can carry a chain of them in `attrs`. Every
unary elementwise function of one tensor with scalar parameters is an activation (Sqrt, Exp,
Erf, ... too): then it fuses into the layer that produces its input like any other."""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

Activation = tuple  # (kind, *float args)

# Functions torch has no in-place form of run on slices of this many elements at a time, so
# their temporaries stay small whatever the region (a few rows of a band).
CHUNK_ELEMS = 1 << 14


def _clip(t: torch.Tensor, lo: float, hi: float) -> None:
    t.clamp_(lo, hi)


def _hardsigmoid(t: torch.Tensor, alpha: float, beta: float) -> None:
    t.mul_(alpha).add_(beta).clamp_(0.0, 1.0)


def _hardswish(t: torch.Tensor) -> None:
    F.hardswish(t, inplace=True)


def _silu(t: torch.Tensor) -> None:
    F.silu(t, inplace=True)


def _chunked(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], None]:
    """t = fn(t) in place, slice by slice along t's outermost dim that is larger than 1."""
    def run(t: torch.Tensor) -> None:
        if t.numel() <= CHUNK_ELEMS or t.dim() == 0:
            t.copy_(fn(t))
            return
        dim = next(d for d in range(t.dim()) if t.shape[d] > 1)
        step = max(1, CHUNK_ELEMS * t.shape[dim] // t.numel())
        for s in range(0, t.shape[dim], step):
            run(t.narrow(dim, s, min(step, t.shape[dim] - s)))
    return run


def _elu(t: torch.Tensor, alpha: float) -> None:
    F.elu_(t, alpha)


def _selu(t: torch.Tensor, alpha: float, gamma: float) -> None:
    # ONNX Selu: gamma * (x if x > 0 else alpha * (exp(x) - 1)), alpha and gamma attributes.
    F.elu_(t, alpha)
    t.mul_(gamma)


INPLACE: dict[str, Callable[..., None]] = {
    "relu": lambda t: t.relu_(),
    "leakyrelu": lambda t, alpha: F.leaky_relu_(t, alpha),
    "clip": _clip,
    "sigmoid": lambda t: t.sigmoid_(),
    "tanh": lambda t: t.tanh_(),
    "hardsigmoid": _hardsigmoid,
    "hardswish": _hardswish,
    "silu": _silu,
    "mish": lambda t: F.mish(t, inplace=True),
    "gelu": _chunked(F.gelu),
    "gelu_tanh": _chunked(lambda t: F.gelu(t, approximate="tanh")),
    # log(exp(x) + 1); above torch's threshold (20) that is x to within float32 rounding.
    "softplus": _chunked(F.softplus),
    "elu": _elu,
    "selu": _selu,
    "sqrt": lambda t: t.sqrt_(),
    "exp": lambda t: t.exp_(),
    "log": lambda t: t.log_(),
    "neg": lambda t: t.neg_(),
    "abs": lambda t: t.abs_(),
    "reciprocal": lambda t: t.reciprocal_(),
    "erf": lambda t: t.erf_(),
}

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


def apply_activations(t: torch.Tensor, chain: Sequence[Activation]) -> None:
    for kind, *args in chain:
        INPLACE[kind](t, *args)
