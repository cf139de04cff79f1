"""Output checks against an independent runtime (onnxruntime on the same ONNX model)."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from tightfit.graph.ir import Graph
from tightfit.tolerance import RTOL, Comparison, compare  # noqa: F401 (the checks' one definition, re-exported)

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


def model_input(graph: Graph, x: torch.Tensor) -> np.ndarray:
    """The graph's NCHW input as the model file takes it (channels-last where it starts with a
    Transpose from NHWC; in the file's shape where it starts with reshapes to NCHW)."""
    forms = {name: (form, shape) for name, form, shape in graph.input_forms}
    form, shape = forms.get(graph.inputs[0], ("nchw", ()))
    if form == "nhwc":
        return x.permute(0, 2, 3, 1).contiguous().numpy()
    if form == "reshape":
        return x.reshape(shape).numpy()
    return x.numpy()


def onnxruntime_outputs(model_bytes: bytes | str, x: np.ndarray, extra: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """`model_bytes` may be a file path (a model with external data is opened where it lies);
    `extra`: inner tensors to return as well."""
    import onnx
    import onnxruntime as ort

    source: bytes | str = model_bytes
    if extra:
        model = onnx.load(model_bytes) if isinstance(model_bytes, str) else onnx.load_from_string(model_bytes)
        have = {o.name for o in model.graph.output}
        model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in extra if n not in have)
        source = model.SerializeToString()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, {sess.get_inputs()[0].name: x})))
    except Exception as e:  # onnxruntime's own exception types: the model is one it rejects
        from tightfit.errors import ModelLoadError

        reason = " ".join(str(e).split())[:300]
        raise ModelLoadError(f"onnxruntime, the reference of --verify, rejects this model: {reason}") from None


def verify_with_onnxruntime(spec: str, input_shape, graph: Graph, x: torch.Tensor, outputs: Mapping[str, torch.Tensor]) -> Comparison:
    from pathlib import Path

    from tightfit.frontend import zoo

    model = spec if spec not in zoo.names() and spec.lower().endswith(".onnx") and Path(spec).is_file() else onnx_bytes_for(spec, input_shape)
    ref = onnxruntime_outputs(model, model_input(graph, x))
    worst = None
    for name in graph.outputs:
        c = compare(outputs[name], ref[name])
        if worst is None or not c.ok or c.max_abs_diff / max(c.tolerance, 1e-30) > worst.max_abs_diff / max(worst.tolerance, 1e-30):
            worst = c if worst is None or worst.ok else worst
    assert worst is not None
    return worst
