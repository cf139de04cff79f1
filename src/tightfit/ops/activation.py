"""Elementwise activations, applied in place: fused after a layer or as a layer of their own.

An activation is a tuple (kind, *args) so layers can carry a chain of them in `attrs`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

Activation = tuple  # (kind, *float args)


def _clip(t: torch.Tensor, lo: float, hi: float) -> None:
    t.clamp_(lo, hi)


def _hardsigmoid(t: torch.Tensor, alpha: float, beta: float) -> None:
    t.mul_(alpha).add_(beta).clamp_(0.0, 1.0)


def _hardswish(t: torch.Tensor) -> None:
    F.hardswish(t, inplace=True)


def _silu(t: torch.Tensor) -> None:
    F.silu(t, inplace=True)


INPLACE: dict[str, Callable[..., None]] = {
    "relu": lambda t: t.relu_(),
    "leakyrelu": lambda t, alpha: F.leaky_relu_(t, alpha),
    "clip": _clip,
    "sigmoid": lambda t: t.sigmoid_(),
    "tanh": lambda t: t.tanh_(),
    "hardsigmoid": _hardsigmoid,
    "hardswish": _hardswish,
    "silu": _silu,
}

# ONNX node type -> activation kind; attributes are read by the importer.
ONNX_ACTIVATIONS = {
    "Relu": "relu", "LeakyRelu": "leakyrelu", "Clip": "clip", "Sigmoid": "sigmoid",
    "Tanh": "tanh", "HardSigmoid": "hardsigmoid", "HardSwish": "hardswish",
}


def apply_activations(t: torch.Tensor, chain: Sequence[Activation]) -> None:
    for kind, *args in chain:
        INPLACE[kind](t, *args)
