"""The ops: one module per op family, each registering its ops by name (ops/registry.py).

Adding an op touches one file. Importing this package imports every family, so the registry
is complete once `tightfit.ops` is imported.
"""
from __future__ import annotations

from tightfit.ops.base import InputWindow, Op, Region, WORKSPACE_MODELS
from tightfit.ops.registry import get_op, onnx_op_for, onnx_types, op_names, register

# Import the op families so they register (order does not matter).
from tightfit.ops import conv, pool, elementwise, binary, concat, dense, shape, lrn, pad, resize, normalize  # noqa: F401
from tightfit.ops import conv_transpose, rearrange  # noqa: F401
from tightfit.ops import quant  # noqa: F401
from tightfit.ops import attention  # noqa: F401  (issue 38)


__all__ = ["InputWindow", "Op", "Region", "WORKSPACE_MODELS", "get_op", "op_names", "register",
           "onnx_op_for", "onnx_types"]
