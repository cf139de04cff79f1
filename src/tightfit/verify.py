"""Output checks against an independent runtime (onnxruntime on the same ONNX model; TFLite Micro's
interpreter on the same .tflite file)."""
from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from tightfit.errors import ModelLoadError, OptionError
from tightfit.frontend import zoo
from tightfit.graph.forms import file_input
from tightfit.graph.ir import Graph
from tightfit.ops import Region, get_op
from tightfit.tolerance import RTOL, Comparison, compare, worst  # noqa: F401 (the checks' one definition, re-exported)

# onnx's reference evaluator runs ~20 M MACs a second: above this a float64 second opinion would
# take minutes, and --verify reports onnxruntime's verdict alone.
FLOAT64_MACS_LIMIT = 2_000_000_000


def onnx_bytes_for(spec: str, input_shape: Sequence[int] | None) -> bytes:
    """The ONNX model tightfit imported for `spec`, as onnxruntime should see it."""
    if spec in zoo.names():
        return zoo.onnx_model(spec, tuple(input_shape) if input_shape is not None else None)
    if Path(spec).exists():
        return Path(spec).read_bytes()
    from tightfit.frontend.torch_import import export_onnx  # an optional extra: torch loads only for module:factory

    mod, _, attr = spec.partition(":")
    return export_onnx(getattr(importlib.import_module(mod), attr)(), input_shape).SerializeToString()


def model_input(graph: Graph, x) -> "np.ndarray | dict[str, np.ndarray]":
    """The graph's NCHW input as the model file takes it (channels-last where it starts with a
    Transpose from NHWC; in the file's shape where it starts with reshapes to NCHW); a model of
    several inputs: {input name: array}, each so."""
    if isinstance(x, Mapping) or len(graph.inputs) > 1:
        return {t: _file_form(graph, t, x[t]) for t in graph.inputs}
    return _file_form(graph, graph.inputs[0], x)


def _file_form(graph: Graph, name: str, x) -> np.ndarray:
    forms = {n: (form, shape) for n, form, shape in graph.input_forms}
    form, shape = forms.get(name, ("nchw", ()))
    x = np.asarray(x, dtype=np.float32)
    if form == "nhwc":
        return file_input(graph, name, x)
    if form == "reshape":
        return x.reshape(shape)
    return x


def _feed(names: Sequence[str], x) -> dict:
    """{input name: array} from one array (the first input's) or from {input name: array}."""
    return dict(x) if isinstance(x, Mapping) else {names[0]: x}


def onnxruntime_outputs(model_bytes: bytes | str, x, extra: Sequence[str] = (),
                        level: str = "disable") -> dict[str, np.ndarray]:
    """`x`: the input (an array), or {input name: array}. `model_bytes` may be a file path (a model with external data is opened where it lies);
    `extra`: inner tensors to return as well; `level` "all": onnxruntime's graph optimizations
    (its int8 fusions), else none."""
    import onnx
    import onnxruntime as ort

    source: bytes | str = model_bytes
    if extra:
        model = onnx.load(model_bytes) if isinstance(model_bytes, str) else onnx.load_from_string(model_bytes)
        have = {o.name for o in model.graph.output}
        model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in extra if n not in have)
        source = model.SerializeToString()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if level == "all" else
                                     ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    if level == "all":
        opts.intra_op_num_threads = 1  # its int8 kernels split work by threads; one keeps the run reproducible
    try:
        sess = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, _feed([i.name for i in sess.get_inputs()], x))))
    except Exception as e:  # onnxruntime's own exception types: the model is one it rejects
        reason = " ".join(str(e).split())[:300]
        raise ModelLoadError(f"onnxruntime, the reference of --verify, rejects this model: {reason}") from None


def verify_with_onnxruntime(spec: str, input_shape, graph: Graph, x, outputs: Mapping[str, np.ndarray]) -> Comparison:
    """Our outputs against onnxruntime's. Where they differ, onnx's reference evaluator (numpy,
    independent of both) runs the model in float64 and decides: onnxruntime sums in float32 as it
    goes, which over millions of values drifts (a GlobalAveragePool over 21 M values read 1% off)."""
    if spec.lower().endswith(".tflite"):
        return verify_with_tflite_micro(spec, graph, x, outputs)
    model = spec if spec not in zoo.names() and spec.lower().endswith(".onnx") and Path(spec).is_file() else onnx_bytes_for(spec, input_shape)
    x_np = model_input(graph, x)
    if any(t.dtype != "fp32" for t in graph.tensors.values()):
        return verify_int8(graph, model, x_np, outputs)
    ref = onnxruntime_outputs(model, x_np)
    verdict = worst(compare(outputs[name], ref[name]) for name in graph.outputs)
    if verdict.ok or graph_macs(graph) > FLOAT64_MACS_LIMIT:
        return verdict
    exact = float64_outputs(model, x_np)
    if exact is None:
        return verdict
    ours = worst(compare(outputs[name], exact[name]) for name in graph.outputs)
    theirs = worst(compare(ref[name], exact[name]) for name in graph.outputs)
    if not ours.ok or theirs.ok:
        return verdict
    return replace(ours, against=f"float64 (onnx's reference evaluator; onnxruntime's float32 differs from it by "
                                 f"{theirs.max_abs_diff:.3g}, from tightfit by {verdict.max_abs_diff:.3g})")


def verify_with_tflite_micro(spec: str, graph: Graph, x, outputs: Mapping[str, np.ndarray]) -> Comparison:
    """Our outputs against TFLite Micro's interpreter on the same .tflite file, bit for bit: an
    int8 graph input fed to it as it is (the same int8 values), a float one quantized as the
    graph's first step does (TFLite's rounding, half away from zero); int8 outputs dequantized as
    the graph's last steps do. `outputs`: ours as the file gives them (graph/forms.py: NHWC maps),
    compared with the interpreter's as they are."""
    try:
        from tflite_micro.python.tflite_micro import runtime
    except ImportError:
        raise OptionError("--verify of a .tflite file runs TFLite Micro's interpreter: pip install tflite-micro") from None
    interp = runtime.Interpreter.from_bytes(Path(spec).read_bytes())
    x = np.asarray(x, np.float32)
    if graph.tensors[graph.inputs[0]].dtype == "int8":  # the file's int8 input: the same values fed to both
        x = np.asarray(x, np.int8)
    elif interp.get_input_details(0)["dtype"] == np.int8:
        q = next(l for l in graph.layers if l.op == "quantize" and l.inputs[0] == graph.inputs[0])
        v = x / np.float32(q.attrs["scale"])
        x = np.clip(np.sign(v) * np.floor(np.abs(v.astype(np.float64)) + 0.5) + q.attrs["zero_point"], -128, 127)
    interp.set_input(model_input(graph, x).astype(interp.get_input_details(0)["dtype"]), 0)
    interp.invoke()
    found = []
    for i, name in enumerate(graph.outputs):
        want = interp.get_output(i)
        layer = graph.producer(name)
        if want.dtype == np.int8 and layer is not None and layer.op == "dequantize":
            want = (want.astype(np.float32) - np.float32(layer.attrs["zero_point"])) * np.float32(layer.attrs["scale"])
        got = np.asarray(outputs[name], np.float64)
        want = np.asarray(want, np.float64)
        if want.ndim != 4 and want.size == got.size:  # (a vector the file holds as (1, K) or (K,))
            want = want.reshape(got.shape)
        if want.shape != got.shape:  # a layout or shape mistake of ours: a mismatch, not a reshape that hides it
            found.append(Comparison(False, float("inf"), float(np.abs(want).max(initial=0)), 0.0,
                                    f"TFLite Micro's interpreter: output {name!r} is {want.shape}, tightfit's {got.shape}"))
            continue
        diff = float(np.abs(got - want).max(initial=0))
        found.append(Comparison(diff == 0.0, diff, float(np.abs(want).max(initial=0)), 0.0,
                                "TFLite Micro's interpreter (tflite-micro) on the same file, bit for bit"))
    return worst(found)


def graph_macs(graph: Graph) -> int:
    return sum(get_op(l.op).macs(l, Region.whole(graph.shape(l.output)), [graph.shape(t) for t in l.inputs],
                                 graph.shape(l.output)) for l in graph.layers)


def float64_outputs(model: bytes | str, x) -> dict[str, np.ndarray] | None:
    """The model's outputs by onnx's reference evaluator with every float32 tensor made float64;
    None where the evaluator cannot run it."""
    import onnx
    from onnx import TensorProto, numpy_helper
    from onnx.reference import ReferenceEvaluator

    m = onnx.load(model) if isinstance(model, str) else onnx.load_from_string(model)
    for t in m.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for v in [*m.graph.input, *m.graph.output, *m.graph.value_info]:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.DOUBLE
    for node in m.graph.node:
        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
            elif a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
    try:
        evaluator = ReferenceEvaluator(m)
        names = [o.name for o in m.graph.output]
        feed = _feed([i.name for i in m.graph.input], x)
        return dict(zip(names, evaluator.run(names, {k: np.asarray(v, np.float64) for k, v in feed.items()})))
    except Exception:  # an op or attribute form the evaluator lacks: onnxruntime's verdict stands
        return None


# --- int8 (issue 40) --------------------------------------------------------------------------------
# An int8 model's outputs are compared with onnxruntime's int8 run (ORT_ENABLE_ALL: its QLinearConv,
# QGemm, ... where it fuses the QDQ pairs) in units of the output's quantization step (LSB). Where
# onnxruntime keeps a layer in float between DequantizeLinear and QuantizeLinear (a conv whose input
# is read twice), its float sum and our int32 one round a tie differently now and then: at most
# 1 LSB, on at most this share of the elements.
INT8_LSB_SHARE = 0.01


def verify_int8(graph: Graph, model: bytes | str, x, outputs: Mapping[str, np.ndarray]) -> Comparison:
    ref = onnxruntime_outputs(model, x, level="all")
    found = []
    for name in graph.outputs:
        layer = graph.producer(name)
        step = float(layer.attrs["scale"]) if layer is not None and layer.op == "dequantize" else None
        got, want = np.asarray(outputs[name], np.float64), np.asarray(ref[name], np.float64).reshape(np.shape(outputs[name]))
        if step is None:  # an fp32 output (a float layer after the last dequantize)
            found.append(compare(got, want))
            continue
        lsb = np.rint(np.abs(got - want) / step)
        share = float((lsb > 0).mean()) if lsb.size else 0.0
        ok = bool(lsb.max(initial=0) <= 1 and share <= INT8_LSB_SHARE)
        found.append(Comparison(ok, float(np.abs(got - want).max(initial=0)), float(np.abs(want).max(initial=0)), step,
                                f"onnxruntime int8 (ORT_ENABLE_ALL): {share:.3%} of elements 1 LSB off, "
                                f"at most {int(lsb.max(initial=0))} LSB"))
    return worst(found)
