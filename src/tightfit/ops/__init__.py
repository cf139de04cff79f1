"""The op registry: one module per op family, each registering its ops by name.

Adding an op touches one file. A duplicate name is a bug and is rejected at import time.
"""
from __future__ import annotations

from typing import TypeVar

from tightfit.ops.base import InputWindow, Op, Region, WORKSPACE_MODELS

_OPS: dict[str, Op] = {}
_ONNX: dict[str, str] = {}

O = TypeVar("O", bound=type)


def register(cls: O) -> O:
    op = cls()
    if op.name in _OPS:
        raise RuntimeError(f"op {op.name!r} registered twice")
    _OPS[op.name] = op
    for t in op.onnx_types:
        if t in _ONNX:
            raise RuntimeError(f"ONNX type {t!r} claimed by {_ONNX[t]!r} and {op.name!r}")
        _ONNX[t] = op.name
    return cls


def get_op(name: str) -> Op:
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"no op {name!r}; registered: {', '.join(sorted(_OPS))}") from None


def op_names() -> list[str]:
    return sorted(_OPS)


def onnx_op_for(onnx_type: str) -> str | None:
    return _ONNX.get(onnx_type)


def supported_onnx_types() -> list[str]:
    from tightfit.graph.onnx_import import STRUCTURAL_TYPES

    return sorted(set(_ONNX) | set(STRUCTURAL_TYPES))


# Import the op families so they register (order does not matter).
from tightfit.ops import conv, pool, elementwise, binary, concat, dense, shape, lrn, pad, resize  # noqa: E402,F401

__all__ = ["InputWindow", "Op", "Region", "WORKSPACE_MODELS", "get_op", "op_names", "register",
           "onnx_op_for", "supported_onnx_types"]
