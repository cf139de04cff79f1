"""The op registry: every op family registers its ops here by name, and by the ONNX types it
imports. A module of its own so that the families import it without importing the package
that imports them (no cycle). A duplicate name is a bug and is rejected at import time."""
from __future__ import annotations

from typing import TypeVar

from tightfit.ops.base import Op

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


def onnx_types() -> list[str]:
    """The ONNX node types some op imports."""
    return sorted(_ONNX)


def step_workspace(layer, out, in_shapes, out_shape, itemsize: int, model: str = "none", dense_out: bool = True,
                   channels_last: bool = False) -> int:
    """The scratch bytes of one step of `layer`: its op's `workspace_bytes`, and none for an int8
    layer (its kernels accumulate in registers and write straight into the output view)."""
    if layer.attrs.get("quant") == "int8":
        return 0
    return get_op(layer.op).workspace_bytes(layer, out, in_shapes, out_shape, itemsize, model, dense_out, channels_last)
