"""Constant folding with numpy: the shape arithmetic exporters leave in graphs (Shape -> Gather ->
Unsqueeze -> Concat -> Reshape, Range, ConstantOfShape, Expand, Where, Cast, arithmetic on shape
vectors) computed once at import, with each op's ONNX semantics. Types not here go to onnx's
reference evaluator."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from onnx import helper


def _axes(attrs: dict[str, Any], values: Sequence[np.ndarray | None], opset: int) -> list[int] | None:
    """Axes from the attribute (before opset 13) or the second input (since)."""
    if "axes" in attrs:
        return [int(a) for a in attrs["axes"]]
    if len(values) > 1 and values[1] is not None:
        return [int(a) for a in np.asarray(values[1]).reshape(-1)]
    return None


def _unsqueeze(a, v, opset):
    x = v[0]
    axes = _axes(a, v, opset)
    rank = x.ndim + len(axes)
    out = x
    for ax in sorted(ax % rank for ax in axes):
        out = np.expand_dims(out, ax)
    return out


def _squeeze(a, v, opset):
    x = v[0]
    axes = _axes(a, v, opset)
    if axes is None:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(ax % x.ndim for ax in axes))


def _divide(a, v, opset):
    x, y = np.asarray(v[0]), np.asarray(v[1])
    if x.dtype.kind in "iu" and y.dtype.kind in "iu":
        q = np.abs(x) // np.abs(y)  # integer division truncates toward zero in ONNX
        return (np.sign(x) * np.sign(y) * q).astype(np.result_type(x, y))
    return (x / y).astype(np.result_type(x, y))


def _range(a, v, opset):
    start, limit, delta = (np.asarray(t).reshape(()) for t in v[:3])
    count = max(int(np.ceil((limit - start) / delta)), 0)
    return (start + np.arange(count) * delta).astype(start.dtype)


def _constant_of_shape(a, v, opset):
    value = np.asarray(a.get("value", np.zeros(1, np.float32)))
    return np.full(tuple(int(d) for d in np.asarray(v[0]).reshape(-1)), value.reshape(-1)[0], dtype=value.dtype)


def _expand(a, v, opset):
    x = np.asarray(v[0])
    shape = np.broadcast_shapes(x.shape, tuple(int(d) for d in np.asarray(v[1]).reshape(-1)))
    return np.broadcast_to(x, shape).copy()


def _gather(a, v, opset):
    x, idx = np.asarray(v[0]), np.asarray(v[1]).astype(np.int64)
    axis = int(a.get("axis", 0)) % max(x.ndim, 1)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return np.take(x, idx, axis=axis)


def _same_type(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    def run(a, v, opset):
        x, y = np.asarray(v[0]), np.asarray(v[1])
        return np.asarray(fn(x, y)).astype(np.result_type(x, y))
    return run


FOLDERS: dict[str, Callable[[dict, Sequence[Any], int], np.ndarray]] = {
    "Gather": _gather,
    "Cast": lambda a, v, opset: np.asarray(v[0]).astype(helper.tensor_dtype_to_np_dtype(int(a["to"]))),
    "Range": _range,
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Where": lambda a, v, opset: np.where(np.asarray(v[0], bool), v[1], v[2]),
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": lambda a, v, opset: np.concatenate([np.asarray(x) for x in v if x is not None], axis=int(a["axis"])),
    "Add": _same_type(np.add),
    "Sub": _same_type(np.subtract),
    "Mul": _same_type(np.multiply),
    "Div": _divide,
    "Identity": lambda a, v, opset: np.asarray(v[0]).copy(),
    "Equal": lambda a, v, opset: np.equal(v[0], v[1]),
    "Not": lambda a, v, opset: np.logical_not(v[0]),
    "Size": lambda a, v, opset: np.asarray(np.asarray(v[0]).size, np.int64),
}


def fold(op_type: str, attrs: dict[str, Any], values: Sequence[np.ndarray | None], opset: int) -> np.ndarray | None:
    """The value of a node of `op_type` whose inputs are the constants `values` (None: an empty
    optional input), or None where this module has no folder for the type."""
    folder = FOLDERS.get(op_type)
    if folder is None:
        return None
    return np.asarray(folder(attrs, values, opset))
