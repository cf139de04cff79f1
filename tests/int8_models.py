"""Small float ONNX models and their int8 QDQ forms made by onnxruntime's `quantize_static` (its
defaults: QDQ, int8 activations and weights; or per-channel weights), calibrated on random data
from a fixed seed: the int8 tests' inputs (tests/test_int8.py)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

CALIBRATION_SAMPLES = 4


class _Reader:
    """A calibration data reader (onnxruntime.quantization.CalibrationDataReader's protocol):
    `CALIBRATION_SAMPLES` standard-normal inputs from seeds 0, 1, ..."""

    def __init__(self, name: str, shape: Sequence[int]):
        self._it = iter([{name: np.random.default_rng(i).standard_normal(tuple(shape), dtype=np.float32)}
                         for i in range(CALIBRATION_SAMPLES)])

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # not needed: each quantization makes a reader of its own
        pass


def quantize(model: onnx.ModelProto, path: Path, per_channel: bool = False, preprocess: bool = False,
             extra_options: dict | None = None, qoperator: bool = False, **kw) -> Path:
    """The model's QDQ int8 form, written to `path` (its float form beside it, `.float.onnx`).
    `preprocess`: first onnxruntime's `quant_pre_process` (the step its quantizer advises: batch
    norms folded into convs, which quantize_static would otherwise leave in float). `qoperator`: the
    QOperator form (QLinearConv, QGemm, QLinearAdd, ...) instead; `kw`: more of quantize_static's
    arguments (weight_type, ...)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    inp = model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    src = path.with_suffix(".float.onnx")
    onnx.save(model, src)
    if preprocess:
        quant_pre_process(str(src), str(src))
    reader = type("Reader", (_Reader, CalibrationDataReader), {})(inp.name, shape)
    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process the model
    try:
        quantize_static(str(src), str(path), reader, per_channel=per_channel, extra_options=extra_options,
                        quant_format=QuantFormat.QOperator if qoperator else QuantFormat.QDQ, **kw)
    finally:
        logging.getLogger().setLevel(level)
    return path


def ort_run(path: Path, x: np.ndarray, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> list[np.ndarray]:
    """onnxruntime's run of the file on one thread (ORT_ENABLE_ALL fuses QDQ into QLinearConv,
    QGemm, QLinearConcat, QLinearGlobalAveragePool where its selectors allow)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    so.graph_optimization_level = level
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})


def weight(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    """Fan-in scaled, so activations keep their size through layers."""
    fan_in = int(np.prod(shape[1:])) or 1
    return (rng.standard_normal(tuple(shape)) / np.sqrt(fan_in)).astype(np.float32)


class Builder:
    """A float ONNX model node by node: `conv`, `add`, ... append and return their output name."""

    def __init__(self, shape: Sequence[int], seed: int = 0):
        self.shape, self.rng = tuple(shape), np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def _name(self, op: str) -> str:
        self.count += 1
        return f"{op}{self.count}"

    def const(self, value: np.ndarray, name: str | None = None) -> str:
        name = name or self._name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: Sequence[str], **attrs) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, pad: int = 1, groups: int = 1,
             bias: bool = True, dilation: int = 1) -> str:
        ins = [x, self.const(weight(self.rng, (cout, cin // groups, k, k)))]
        if bias:
            ins.append(self.const((self.rng.standard_normal(cout) * 0.1).astype(np.float32)))
        return self.node("Conv", ins, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=groups,
                         dilations=[dilation, dilation])

    def gemm(self, x: str, fin: int, fout: int, bias: bool = True, trans_b: int = 1) -> str:
        w = weight(self.rng, (fout, fin))
        ins = [x, self.const(w if trans_b else w.T.copy())]
        if bias:
            ins.append(self.const((self.rng.standard_normal(fout) * 0.1).astype(np.float32)))
        return self.node("Gemm", ins, transB=trans_b)

    def matmul(self, x: str, fin: int, fout: int) -> str:
        return self.node("MatMul", [x, self.const(weight(self.rng, (fout, fin)).T.copy())])

    def clip(self, x: str, lo: float, hi: float) -> str:
        return self.node("Clip", [x, self.const(np.float32(lo)), self.const(np.float32(hi))])

    def model(self, out: str, name: str = "case", out_shape=None) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(self.shape))],
                                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        return model


def small_cnn(shape=(1, 3, 32, 32), seed: int = 0) -> onnx.ModelProto:
    """Every int8 kernel once: conv + ReLU, depthwise + ReLU6, pointwise, a residual add, max and
    average pooling joined by a concat, global average pooling, flatten and a classifier."""
    b = Builder(shape, seed)
    c = shape[1]
    r1 = b.node("Relu", [b.conv("x", c, 16, 3, 2)])
    r2 = b.clip(b.conv(r1, 16, 16, 3, 1, 1, groups=16), 0.0, 6.0)
    p = b.conv(r2, 16, 16, 1, 1, 0)
    a = b.node("Add", [p, r1])
    m = b.node("MaxPool", [a], kernel_shape=[2, 2], strides=[2, 2])
    ap = b.node("AveragePool", [a], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cat = b.node("Concat", [m, ap], axis=1)
    g = b.node("GlobalAveragePool", [b.node("Relu", [b.conv(cat, 32, 24, 3, 1, 1)])])
    f = b.node("Flatten", [g])
    return b.model(b.gemm(f, 24, 10), "small_cnn")


def activations_cnn(shape=(1, 3, 16, 16), seed: int = 3) -> onnx.ModelProto:
    """The QOperator ops small_cnn lacks: QLinearSigmoid and QLinearMul (a SiLU), QLinearLeakyRelu,
    QLinearAveragePool and QLinearMatMul."""
    b = Builder(shape, seed)
    c = b.conv("x", shape[1], 8, 3, 1, 1)
    m = b.node("Mul", [c, b.node("Sigmoid", [c])])
    leaky = b.node("LeakyRelu", [b.conv(m, 8, 8, 3, 2, 1)], alpha=0.1)
    p = b.node("AveragePool", [leaky], kernel_shape=[2, 2], strides=[2, 2])
    h, w = shape[2] // 4, shape[3] // 4
    return b.model(b.matmul(b.node("Flatten", [p]), 8 * h * w, 12), "activations_cnn")
