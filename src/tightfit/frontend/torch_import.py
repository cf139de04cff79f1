"""PyTorch nn.Module -> Graph, through ONNX so that there is one importer."""
from __future__ import annotations

import io
import warnings
from typing import Sequence

import onnx
import torch

from tightfit.errors import InputShapeError
from tightfit.graph.ir import Graph
from tightfit.frontend.onnx_import import import_model

OPSET = 17


def export_onnx(module: torch.nn.Module, input_shape: Sequence[int]) -> onnx.ModelProto:
    """Export in eval mode, batch norms kept as nodes (the importer fuses them itself, and the
    model's own tensors stay visible for naive accounting)."""
    if len(input_shape) != 4 or any(int(d) <= 0 for d in input_shape):
        raise InputShapeError(f"input shape {tuple(input_shape)} is not a positive NCHW shape")
    from tightfit.frontend.validate import check_layer_shape

    check_layer_shape("input", tuple(int(d) for d in input_shape))  # refused before the export allocates it
    module = module.eval()
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(module, (torch.zeros(*input_shape),), buf, dynamo=False, opset_version=OPSET,
                              do_constant_folding=False, input_names=["input"], output_names=["output"])
        except (RuntimeError, ValueError, IndexError) as e:  # the module's forward rejects the shape
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise InputShapeError(f"the model does not run on input shape {'x'.join(map(str, input_shape))}: {reason}") from None
    return _name_outputs(onnx.load_from_string(buf.getvalue()))


def _name_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A module with several outputs (a detector's heads): "output", "output1", "output2", ...
    in the module's order, rather than the exporter's numbers for all but the first."""
    renames = {o.name: f"output{i}" for i, o in enumerate(model.graph.output) if i}
    for o in model.graph.output:
        o.name = renames.get(o.name, o.name)
    for node in model.graph.node:
        for i, t in enumerate(node.output):
            node.output[i] = renames.get(t, t)
        for i, t in enumerate(node.input):
            node.input[i] = renames.get(t, t)
    return model


def from_module(module: torch.nn.Module, input_shape: Sequence[int], name: str = "module") -> Graph:
    return import_model(export_onnx(module, input_shape), input_shape, name)
