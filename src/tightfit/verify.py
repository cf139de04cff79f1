"""Output checks against an independent runtime (onnxruntime on the same ONNX model)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

from tightfit.graph.ir import Graph

RTOL = 1e-4  # DESIGN.md invariant 1: max abs diff <= 1e-4 x max abs value


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs_diff: float
    max_abs_ref: float
    tolerance: float

    def as_dict(self) -> dict:
        return asdict(self)


def compare(got: torch.Tensor | np.ndarray, ref: torch.Tensor | np.ndarray, rtol: float = RTOL) -> Comparison:
    got_a = np.asarray(got, dtype=np.float64)
    ref_a = np.asarray(ref, dtype=np.float64)
    if got_a.shape != ref_a.shape:
        return Comparison(False, float("inf"), float(np.abs(ref_a).max(initial=0)), 0.0)
    scale = float(np.abs(ref_a).max(initial=0.0))
    diff = float(np.abs(got_a - ref_a).max(initial=0.0))
    tol = rtol * scale
    return Comparison(bool(diff <= tol and np.isfinite(got_a).all()), diff, scale, tol)


def onnx_bytes_for(spec: str, input_shape: Sequence[int] | None) -> bytes:
    """The ONNX model tightfit imported for `spec`, as onnxruntime should see it."""
    from pathlib import Path

    from tightfit.frontend import zoo

    if spec in zoo.names():
        return zoo.onnx_model(spec, tuple(input_shape) if input_shape is not None else None)
    if Path(spec).exists():
        return Path(spec).read_bytes()
    import importlib

    from tightfit.frontend.torch_import import export_onnx

    mod, _, attr = spec.partition(":")
    return export_onnx(getattr(importlib.import_module(mod), attr)(), input_shape).SerializeToString()


def onnxruntime_outputs(model_bytes: bytes, x: np.ndarray, extra: Sequence[str] = ()) -> dict[str, np.ndarray]:
    import onnx
    import onnxruntime as ort

    model = onnx.load_from_string(model_bytes)
    have = {o.name for o in model.graph.output}
    for name in extra:
        if name not in have:
            model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0].name
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, {inp: x})))


def verify_with_onnxruntime(spec: str, input_shape, graph: Graph, x: torch.Tensor, outputs: Mapping[str, torch.Tensor]) -> Comparison:
    ref = onnxruntime_outputs(onnx_bytes_for(spec, input_shape), x.numpy())
    worst = None
    for name in graph.outputs:
        c = compare(outputs[name], ref[name])
        if worst is None or not c.ok or c.max_abs_diff / max(c.tolerance, 1e-30) > worst.max_abs_diff / max(worst.tolerance, 1e-30):
            worst = c if worst is None or worst.ok else worst
    assert worst is not None
    return worst
