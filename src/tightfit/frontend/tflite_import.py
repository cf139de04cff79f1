""".tflite files (the flatbuffer TFLite and TFLite Micro run) with TFLite's int8 quantization.

The file is read with the `tflite` package (the flatbuffer schema's generated Python, not a parser
of ours) and written as the ONNX QDQ model it means, in NCHW: each int8 tensor a QuantizeLinear ->
DequantizeLinear pair with its scale and zero point, int8 weights and int32 biases as
DequantizeLinear of constants (per-channel scales on the output channels), weights transposed from
TFLite's NHWC forms (conv OHWI, depthwise 1HWO) to ONNX's OIHW, SAME padding as explicit pads, a
PAD folded into the convolution it feeds, the NHWC input a Transpose that the ONNX importer absorbs
(the graph's `input_forms` say the file takes NHWC). The ONNX importer then folds the pairs into
int8 layers (frontend/qdq.py), and every layer that came from the file is marked
`attrs["rounding"] = "tflite"`: its kernel requantizes as TFLite's reference kernels do (fixed-point
multiplier and shift; kernels/step_args.py), so that outputs equal TFLite Micro's bit for bit.

Taken: CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, ADD and MUL (of two computed tensors of one
shape, or of a (1, 1, 1, C) map broadcast onto an NHWC one; not of a constant), AVERAGE_POOL_2D and
MAX_POOL_2D (a fused activation: an int8 clamp after the pool), MEAN (over H and W), CONCATENATION,
RESHAPE (a flatten; a (1, 1, 1, C) map squeezed for ADD or MUL), PAD (into a convolution), SOFTMAX
(over C, beta 1: TFLite's int8 softmax on gemmlowp's fixed-point exp), QUANTIZE (float to int8),
DEQUANTIZE; fused RELU, RELU6, RELU_N1_TO_1. Inside, a 4-D tensor is NCHW; the graph's 4-D input
and outputs keep the file's NHWC (its `input_forms` and `output_forms`, graph/forms.py), which
`run`, `--verify` and the exported C program take and give. The graph takes and gives int8 where
the file does (its int8 input and outputs, TFLite Micro's integers): no quantize step on the way
in, no dequantize on the way out.
"""
from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx
import tflite
from onnx import TensorProto, helper, numpy_helper

from tightfit.errors import ModelLoadError
from tightfit.frontend.onnx_import import import_model
from tightfit.graph.ir import Graph, Layer, Tensor

OPS = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
TYPES = {v: k.lower() for k, v in vars(tflite.TensorType).items() if not k.startswith("_")}
NUMPY = {"int8": np.int8, "int32": np.int32, "float32": np.float32, "int64": np.int64}
TAKEN_TYPES = ("int8", "int32", "float32", "int64")  # activations int8 (or float at the edges), biases and shapes int32
# What reading a damaged flatbuffer raises (offsets past the end, garbage values, absent tables).
CORRUPT = (struct.error, IndexError, ValueError, TypeError, UnicodeDecodeError, AttributeError, OverflowError, KeyError)
ACTIVATIONS = {0: None, 1: "relu", 2: "relu_n1_to_1", 3: "relu6"}
TO_NCHW = (0, 3, 1, 2)


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    scale: np.ndarray  # empty: not quantized
    zero: np.ndarray
    axis: int
    data: np.ndarray | None  # a constant's values


@dataclass(frozen=True)
class _Op:
    code: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options: Any  # the op's options table (tflite.*Options), or None


def load_tflite(path: str | Path, input_shape: Sequence[int] | None = None, name: str | None = None,
                nchw_shape: bool = False) -> Graph:
    """Import a .tflite file as an int8 graph. `input_shape`: NHWC (the file's), or NCHW with `nchw_shape`."""
    path = Path(path)
    tensors, ops, inputs, outputs = read(path)
    try:  # the options tables are read lazily, here: a corrupt one fails now
        model = _Converter(tensors, ops, path.name).model(inputs, outputs)
    except CORRUPT as e:
        raise ModelLoadError(f"{path} is a corrupt .tflite file ({type(e).__name__} converting it: {e})") from None
    graph = _fold_int8(import_model(model, input_shape, name or path.stem, nchw_shape=nchw_shape))
    if tensors[inputs[0]].dtype == "int8":
        graph = _int8_input(graph)
    graph = _int8_outputs(graph, {graph.outputs[k] for k, i in enumerate(outputs) if tensors[i].dtype == "int8"})
    layers = tuple(dataclasses.replace(l, attrs={**l.attrs, "rounding": "tflite"})
                   if l.attrs.get("quant") == "int8" or l.op in ("quantize", "dequantize") else l for l in graph.layers)
    # Naive accounting counts the file's own tensors (int8, 1 byte each), not the QDQ model's.
    own = tuple(Tensor(t.name, (t.shape[0], t.shape[3], t.shape[1], t.shape[2]) if len(t.shape) == 4 else t.shape,
                       "int8" if t.dtype == "int8" else "fp32") for t in tensors if t.data is None and t.shape)
    # The file's quantized constants as it stores them: int8 weights, int32 biases, and per tensor or
    # channel a float32 scale and an int64 zero point (TFLite's QuantizationParameters).
    params = sum(t.data.nbytes + t.scale.size * 4 + t.zero.size * 8 for t in tensors
                 if t.data is not None and t.dtype in ("int8", "int32") and t.scale.size)
    forms = tuple((graph.outputs[k], "nhwc", tensors[i].shape) for k, i in enumerate(outputs)
                  if len(tensors[i].shape) == 4)
    return dataclasses.replace(graph, layers=layers, original_tensors=own, original_param_count=0,
                               original_int_param_bytes=params,
                               output_forms=forms)


def _foldable(layer: Layer) -> bool:
    """A layer the QDQ folding leaves in float whose TFLite int8 kernel is here: a softmax (an ONNX
    model's int8 softmax is onnxruntime's, which no kernel here runs), an add with a fused ReLU or
    RELU6 (onnxruntime's QDQ add takes no activation; TFLite's clamps its int8 output), a mul (TFLite's
    int8 MUL: the product of the inputs less their zero points, requantized)."""
    act = tuple(layer.attrs.get("act", ()))
    if layer.op == "softmax":
        return not layer.attrs.get("log")
    return (layer.op in ("add", "mul") and len(layer.inputs) == 2 and not layer.params
            and len(act) <= 1 and all(a[0] in ("relu", "clip") for a in act))


def _fold_int8(g: Graph) -> Graph:
    """Each foldable layer between dequantize layers and one quantize layer becomes an int8 layer
    reading and writing the int8 tensors; the dequantize and quantize layers nothing reads go."""
    gone: set[int] = set()
    new: dict[int, Layer] = {}
    for l in g.layers:
        dqs, q = [g.producer(t) for t in l.inputs], g.consumers(l.output)
        if (not _foldable(l) or any(d is None or d.op != "dequantize" for d in dqs) or len(q) != 1
                or q[0].op != "quantize" or l.output in g.outputs):
            continue
        gone.add(q[0].id)
        new[l.id] = dataclasses.replace(l, inputs=tuple(d.inputs[0] for d in dqs), output=q[0].output,
                                        nodes=l.nodes + q[0].nodes, attrs={**l.attrs, "quant": "int8"})
    if not new:
        return g
    kept = [new.get(l.id, l) for l in g.layers if l.id not in gone]
    while True:  # dequantize layers no layer reads any more
        read = {t for l in kept for t in l.inputs} | set(g.outputs)
        left = [l for l in kept if l.op != "dequantize" or l.output in read]
        if len(left) == len(kept):
            break
        kept = left
    layers = tuple(dataclasses.replace(l, id=i) for i, l in enumerate(kept))
    used = {t for l in layers for t in (*l.inputs, l.output)} | set(g.inputs)
    return dataclasses.replace(g, layers=layers, tensors={k: v for k, v in g.tensors.items() if k in used})


def _int8_input(g: Graph) -> Graph:
    """The graph taking the file's int8 input as TFLite Micro does: its input quantize layer left
    out, the graph input the int8 tensor (scale and zero point its Quant) that layer wrote, in the
    file's form (the NHWC form moves to it). The arena then holds the input's int8 bytes alone."""
    x = g.inputs[0]
    q = g.layers[0]
    if q.op != "quantize" or q.inputs != (x,) or len(g.consumers(x)) != 1:
        return g  # the file's input feeds more than its quantization: the float input stays
    # Named as the file names its input (the int8 tensor's ":q" suffix dropped where that is free).
    new = q.output.removesuffix(":q") if q.output.removesuffix(":q") not in g.tensors else q.output
    layers = tuple(dataclasses.replace(l, id=l.id - 1, inputs=tuple(new if t == q.output else t for t in l.inputs))
                   for l in g.layers[1:])
    tensors = {k: v for k, v in g.tensors.items() if k not in (x, q.output)}
    tensors[new] = dataclasses.replace(g.tensors[q.output], name=new)
    forms = tuple((new if t == x else t, form, shape) for t, form, shape in g.input_forms)
    return dataclasses.replace(g, layers=layers, tensors=tensors, inputs=(new,), input_forms=forms)


def _int8_outputs(g: Graph, names: set[str]) -> Graph:
    """Each output the file gives as int8 given as int8 too: its dequantize layer left out, the
    int8 tensor taking the output's name (TFLite Micro's output integers, bit for bit)."""
    rename: dict[str, str] = {}
    gone: set[int] = set()
    for t in names:
        d = g.producer(t)
        if d is not None and d.op == "dequantize" and d.inputs[0] not in g.inputs and not g.consumers(t):
            rename[d.inputs[0]], gone = t, gone | {d.id}
    if not rename:
        return g
    kept = [l for l in g.layers if l.id not in gone]
    layers = tuple(dataclasses.replace(l, id=i, output=rename.get(l.output, l.output),
                                       inputs=tuple(rename.get(t, t) for t in l.inputs)) for i, l in enumerate(kept))
    tensors = {k: v for k, v in g.tensors.items() if k not in rename.values() and k not in rename}
    tensors.update({new: dataclasses.replace(g.tensors[old], name=new) for old, new in rename.items()})
    return dataclasses.replace(g, layers=layers, tensors=tensors)


# --- reading the flatbuffer ----------------------------------------------------------------------

def read(path: Path) -> tuple[list[_Tensor], list[_Op], list[int], list[int]]:
    """The tensors, operators, input and output tensor indices of the file's one subgraph."""
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    data = path.read_bytes()
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ModelLoadError(f"{path} is not a .tflite flatbuffer (no TFL3 identifier)")
    try:
        model = tflite.Model.GetRootAs(data, 0)
        if model.SubgraphsLength() != 1:
            raise ModelLoadError(f"{path}: {model.SubgraphsLength()} subgraphs; tightfit imports models of one")
        sg = model.Subgraphs(0)
        tensors = [_tensor(model, sg.Tensors(i), data, path) for i in range(sg.TensorsLength())]
        ops = [_op(model, sg.Operators(i)) for i in range(sg.OperatorsLength())]
        inputs, outputs = [int(i) for i in sg.InputsAsNumpy()], [int(i) for i in sg.OutputsAsNumpy()]
    except ModelLoadError:
        raise
    except CORRUPT as e:
        raise ModelLoadError(f"{path} is a truncated or corrupt .tflite file ({type(e).__name__} reading it)") from None
    for i in inputs + outputs + [t for op in ops for t in op.inputs + op.outputs if t >= 0]:
        if not 0 <= i < len(tensors):
            raise ModelLoadError(f"{path} names tensor {i} of {len(tensors)} (a corrupt .tflite file)")
    return tensors, ops, inputs, outputs


def _tensor(model, t, data: bytes, path: Path) -> _Tensor:
    name = t.Name().decode("utf-8", "replace") if t.Name() else ""
    dtype = TYPES.get(t.Type(), f"type {t.Type()}")
    if dtype not in TAKEN_TYPES:
        raise ModelLoadError(f"{path}: tensor {name!r} is {dtype}; tightfit runs int8 .tflite models (int8 tensors, "
                             "int32 biases, float32 inputs and outputs)")
    shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
    q = t.Quantization()
    scale = q.ScaleAsNumpy().astype(np.float32) if q is not None and q.ScaleLength() else np.zeros(0, np.float32)
    zero = q.ZeroPointAsNumpy().astype(np.int64) if q is not None and q.ZeroPointLength() else np.zeros(0, np.int64)
    axis = int(q.QuantizedDimension()) if q is not None else 0
    buf = model.Buffers(t.Buffer()) if t.Buffer() < model.BuffersLength() else None
    raw = _buffer(buf, data) if buf is not None else b""
    values = None
    if raw:
        count = int(np.prod(shape)) if shape else 1
        itemsize = np.dtype(NUMPY[dtype]).itemsize
        if len(raw) != count * itemsize:
            raise ModelLoadError(f"{path}: tensor {name!r} of shape {shape} ({dtype}) has {len(raw)} bytes of data, "
                                 f"not {count * itemsize} (a truncated file?)")
        values = np.frombuffer(raw, NUMPY[dtype]).reshape(shape).copy()
    return _Tensor(name, shape, dtype, scale, zero, axis, values)


def _buffer(buf, data: bytes) -> bytes:
    """A buffer's bytes: inside the flatbuffer, or (files over 2 GB) at an offset after it."""
    if buf.Offset() > 1:
        start, size = int(buf.Offset()), int(buf.Size())
        if start + size > len(data):
            raise ModelLoadError("a .tflite buffer lies past the end of the file (a truncated file)")
        return data[start:start + size]
    return buf.DataAsNumpy().tobytes() if buf.DataLength() else b""


BROADCAST_READERS = ("ADD", "MUL")  # ops that broadcast a (1, 1, 1, C) map's channels onto an NHWC map
TAKEN_OPS = ("ADD", "AVERAGE_POOL_2D", "CONCATENATION", "CONV_2D", "DEPTHWISE_CONV_2D", "DEQUANTIZE",
             "FULLY_CONNECTED", "MAX_POOL_2D", "MEAN", "MUL", "PAD", "QUANTIZE", "RESHAPE", "SOFTMAX")
OPTIONS = {
    "CONV_2D": tflite.Conv2DOptions, "DEPTHWISE_CONV_2D": tflite.DepthwiseConv2DOptions,
    "AVERAGE_POOL_2D": tflite.Pool2DOptions, "MAX_POOL_2D": tflite.Pool2DOptions, "ADD": tflite.AddOptions,
    "FULLY_CONNECTED": tflite.FullyConnectedOptions, "CONCATENATION": tflite.ConcatenationOptions,
    "SOFTMAX": tflite.SoftmaxOptions, "MEAN": tflite.ReducerOptions, "MUL": tflite.MulOptions,
}


def _op(model, op) -> _Op:
    oc = model.OperatorCodes(op.OpcodeIndex())
    code = OPS.get(max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode()), "unknown")
    if code == "CUSTOM":
        code = f"custom op {oc.CustomCode().decode('utf-8', 'replace') if oc.CustomCode() else '?'}"
    options = None
    table = op.BuiltinOptions()
    if code in OPTIONS and table is not None:
        options = OPTIONS[code]()
        options.Init(table.Bytes, table.Pos)
    ins = tuple(int(i) for i in op.InputsAsNumpy()) if op.InputsLength() else ()
    outs = tuple(int(i) for i in op.OutputsAsNumpy()) if op.OutputsLength() else ()
    return _Op(code, ins, outs, options)


# --- writing the ONNX QDQ model ------------------------------------------------------------------

def _same_pads(size: int, k: int, stride: int, dilation: int) -> tuple[int, int]:
    """TFLite's SAME padding (before, after): the total split with the odd one after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


class _Converter:
    def __init__(self, tensors: list[_Tensor], ops: list[_Op], label: str):
        self.t, self.ops, self.label = list(tensors), ops, label  # (a MEAN adds a tensor of its own)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.alias: dict[int, int] = {}  # a tensor that is another (a folded PAD, a same-shape RESHAPE)
        self.pads: dict[int, tuple[int, int, int, int]] = {}  # a folded PAD's output: (top, left, bottom, right)
        self.flat: dict[int, tuple[int, int, int]] = {}  # a flatten of an NHWC map: (H, W, C)
        self.readers: dict[int, list[_Op]] = {}
        for op in ops:
            for i in op.inputs:
                self.readers.setdefault(i, []).append(op)
        names: dict[str, int] = {}
        self.names = []
        for i, t in enumerate(tensors):
            base = t.name or f"tensor{i}"
            self.names.append(base if base not in names else f"{base}#{i}")
            names[base] = i

    def fail(self, op: _Op, why: str) -> ModelLoadError:
        out = self.names[op.outputs[0]] if op.outputs else "?"
        return ModelLoadError(f"{self.label}: {op.code} (output {out!r}): {why}")

    # Tensor names: an int8 tensor's float value (what readers take) is its name; the producer
    # writes NAME:f, quantized into NAME:q.
    def name(self, i: int) -> str:
        while i in self.alias:
            i = self.alias[i]
        return self.names[i]

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op_type: str, inputs: Sequence[str], output: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=f"{output}::{op_type}", **attrs))
        return output

    def produce(self, op: _Op, i: int, raw: str) -> None:
        """Tensor i made as the float `raw`: quantized and dequantized where it is int8."""
        t = self.t[i]
        if t.dtype == "float32":
            self.node("Identity", [raw], self.names[i])
            return
        if t.dtype != "int8" or t.scale.size != 1:
            raise self.fail(op, f"output {t.name!r} is {t.dtype} with {t.scale.size} scales (int8 per tensor only)")
        if not -128 <= int(t.zero[0]) <= 127 or not (np.isfinite(t.scale[0]) and t.scale[0] > 0):
            raise self.fail(op, f"tensor {t.name!r}: scale {t.scale[0]} and zero point {t.zero[0]} out of range")
        n = self.names[i]
        s = self.const(f"{n}:scale", np.float32(t.scale[0]))
        z = self.const(f"{n}:zero", np.int8(t.zero[0]))
        self.node("DequantizeLinear", [self.node("QuantizeLinear", [raw, s, z], f"{n}:q"), s, z], n)

    def weight(self, op: _Op, i: int, value: np.ndarray, axis_after: int = 0) -> str:
        """A quantized constant (int8 weight, int32 bias) in its ONNX form `value`, dequantized."""
        t = self.t[i]
        if t.dtype not in ("int8", "int32") or t.scale.size == 0:
            raise self.fail(op, f"constant {t.name!r} is {t.dtype} without int8 quantization (a float model?)")
        n = self.names[i]
        zero = np.zeros(t.scale.size, NUMPY[t.dtype])
        s, z = (t.scale, zero) if t.scale.size > 1 else (np.float32(t.scale[0]), zero[0])
        self.const(f"{n}:int", value.astype(NUMPY[t.dtype]))
        attrs = {"axis": axis_after} if t.scale.size > 1 else {}
        return self.node("DequantizeLinear", [f"{n}:int", self.const(f"{n}:scale", s), self.const(f"{n}:zero", z)], n,
                         **attrs)

    def activation(self, op: _Op, x: str, out: str) -> str:
        code = op.options.FusedActivationFunction() if op.options is not None else 0
        if code not in ACTIVATIONS:
            raise self.fail(op, f"fused activation {code} (RELU, RELU6 and RELU_N1_TO_1 are taken)")
        kind = ACTIVATIONS[code]
        if kind is None:
            return self.node("Identity", [x], out)
        if kind == "relu":
            return self.node("Relu", [x], out)
        lo, hi = (0.0, 6.0) if kind == "relu6" else (-1.0, 1.0)
        return self.node("Clip", [x, self.const(f"{out}:lo", np.float32(lo)), self.const(f"{out}:hi", np.float32(hi))], out)

    def model(self, inputs: list[int], outputs: list[int]) -> onnx.ModelProto:
        if len(inputs) != 1:
            raise ModelLoadError(f"{self.label}: {len(inputs)} inputs; tightfit imports .tflite models of one")
        graph_inputs = [self._input(inputs[0])]
        for op in self.ops:
            if op.code not in TAKEN_OPS:
                raise ModelLoadError(f"{self.label}: op {op.code} is not imported (tightfit imports "
                                     f"{', '.join(TAKEN_OPS)})")
            getattr(self, "_" + op.code.lower())(op)
        outs = [helper.make_tensor_value_info(self.name(i), TensorProto.FLOAT, None) for i in outputs]
        graph = helper.make_graph(self.nodes, self.label, graph_inputs, outs, self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    def _input(self, i: int) -> onnx.ValueInfoProto:
        t = self.t[i]
        if t.dtype not in ("int8", "float32"):
            raise ModelLoadError(f"{self.label}: input {t.name!r} is {t.dtype} (int8 or float32 inputs)")
        name = f"{self.names[i]}:input"
        x = name
        if len(t.shape) == 4:  # NHWC in the file: a Transpose the ONNX importer absorbs into the input's form
            x = self.node("Transpose", [name], f"{self.names[i]}:nchw", perm=list(TO_NCHW))
        if t.dtype == "int8":
            self.produce(_Op("input", (), (i,), None), i, x)
        else:
            self.node("Identity", [x], self.names[i])
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(t.shape))

    def nchw(self, i: int) -> tuple[int, ...]:
        s = self.t[i].shape
        return (s[0], s[3], s[1], s[2]) if len(s) == 4 else s

    # --- the ops -------------------------------------------------------------------------------
    def _conv(self, op: _Op, w_onnx: np.ndarray, groups: int) -> None:
        o = op.options
        x = op.inputs[0]
        _, h, w_, _ = self.t[x].shape
        kh, kw = w_onnx.shape[2:]
        sh, sw, dh, dw = o.StrideH(), o.StrideW(), o.DilationHFactor(), o.DilationWFactor()
        if o.Padding() == tflite.Padding.SAME:
            (t, b), (l, r) = _same_pads(h, kh, sh, dh), _same_pads(w_, kw, sw, dw)
        else:
            t = b = l = r = 0
        pt, pl, pb, pr = self.pads.get(x, (0, 0, 0, 0))
        ins = [self.name(x), self.weight(op, op.inputs[1], w_onnx)]
        if len(op.inputs) > 2 and op.inputs[2] >= 0:
            ins.append(self.weight(op, op.inputs[2], self.t[op.inputs[2]].data.reshape(-1)))
        out = self.names[op.outputs[0]]
        y = self.node("Conv", ins, f"{out}:conv", kernel_shape=[kh, kw], strides=[sh, sw], dilations=[dh, dw],
                      pads=[t + pt, l + pl, b + pb, r + pr], group=groups)
        self.produce(op, op.outputs[0], self.activation(op, y, f"{out}:f"))

    def _conv_2d(self, op: _Op) -> None:
        w = self._const(op, 1)
        self._conv(op, w.transpose(0, 3, 1, 2), 1)

    def _depthwise_conv_2d(self, op: _Op) -> None:
        w = self._const(op, 1)  # (1, kh, kw, C * multiplier)
        cin = self.t[op.inputs[0]].shape[3]
        if w.shape[3] % cin:
            raise self.fail(op, f"weight {w.shape} for {cin} input channels")
        self._conv(op, w[0].transpose(2, 0, 1)[:, None], cin)

    def _const(self, op: _Op, k: int) -> np.ndarray:
        if len(op.inputs) <= k or op.inputs[k] < 0 or self.t[op.inputs[k]].data is None:
            raise self.fail(op, f"input {k} is not a constant")
        return self.t[op.inputs[k]].data

    def _fully_connected(self, op: _Op) -> None:
        w = self._const(op, 1)  # (out, in)
        if op.options is not None and op.options.WeightsFormat() != 0:
            raise self.fail(op, "shuffled weights (only the default weights format)")
        x = op.inputs[0]
        xname = self.name(x)
        flat = self.flat.get(self._root(x))
        shape = self.t[self._root(x)].shape
        if len(shape) == 4:  # TFLite flattens its input: an NHWC map's (H, W, C) order
            flat = shape[1:]
            xname = self.node("Flatten", [xname], f"{self.names[op.outputs[0]]}:flat", axis=1)
        if flat is not None and flat[0] * flat[1] > 1:  # our flatten is (C, H, W): the columns follow it
            hh, ww, cc = flat
            w = w.reshape(w.shape[0], hh, ww, cc).transpose(0, 3, 1, 2).reshape(w.shape[0], -1)
        ins = [xname, self.weight(op, op.inputs[1], w)]
        if len(op.inputs) > 2 and op.inputs[2] >= 0:
            ins.append(self.weight(op, op.inputs[2], self.t[op.inputs[2]].data.reshape(-1)))
        out = self.names[op.outputs[0]]
        y = self.node("Gemm", ins, f"{out}:gemm", transB=1)
        self.produce(op, op.outputs[0], self.activation(op, y, f"{out}:f"))

    def _root(self, i: int) -> int:
        while i in self.alias:
            i = self.alias[i]
        return i

    def _add(self, op: _Op) -> None:
        self._binary(op, "Add")

    def _mul(self, op: _Op) -> None:
        self._binary(op, "Mul")

    def _binary(self, op: _Op, op_type: str) -> None:
        """An elementwise op of two computed tensors of one shape, or of an NHWC map and one
        that broadcasts onto it (a (1, 1, 1, C) map, or the (C,) vector a RESHAPE made of one)."""
        if len(op.inputs) != 2 or any(self.t[self._root(i)].data is not None for i in op.inputs):
            raise self.fail(op, f"{op.code} of a constant operand (an int8 {op.code} of two computed tensors is taken)")
        shapes = [self.t[self._root(i)].shape for i in op.inputs]
        out_shape = self.t[op.outputs[0]].shape
        if shapes[0] != shapes[1] and not all(len(s) == 4 for s in shapes):
            raise self.fail(op, f"a broadcast {op.code} of {shapes[0]} and {shapes[1]} (of 4-D maps only)")
        try:
            wide = tuple(np.broadcast_shapes(*shapes))
        except ValueError:
            raise self.fail(op, f"operands {shapes[0]} and {shapes[1]} do not broadcast") from None
        if wide != out_shape or any(s[0] != out_shape[0] for s in shapes):
            raise self.fail(op, f"operands {shapes[0]} and {shapes[1]} for an output {out_shape}")
        out = self.names[op.outputs[0]]
        y = self.node(op_type, [self.name(i) for i in op.inputs], f"{out}:{op_type.lower()}")
        self.produce(op, op.outputs[0], self.activation(op, y, f"{out}:f"))

    def _pool(self, op: _Op, op_type: str) -> None:
        o = op.options
        x, out_i = op.inputs[0], op.outputs[0]
        tx, ty = self.t[x], self.t[out_i]
        if tx.scale.size and (tx.scale[0] != ty.scale[0] or tx.zero[0] != ty.zero[0]):
            raise self.fail(op, "input and output quantized differently (TFLite's pools keep the quantization)")
        _, h, w, _ = tx.shape
        kh, kw, sh, sw = o.FilterHeight(), o.FilterWidth(), o.StrideH(), o.StrideW()
        (t, b), (l, r) = ((_same_pads(h, kh, sh, 1), _same_pads(w, kw, sw, 1)) if o.Padding() == tflite.Padding.SAME
                          else ((0, 0), (0, 0)))
        out = self.names[out_i]
        y = self.node(op_type, [self.name(x)], f"{out}:pool", kernel_shape=[kh, kw], strides=[sh, sw],
                      pads=[t, l, b, r])
        if op.options is None or op.options.FusedActivationFunction() == 0:
            self.produce(op, out_i, y)
            return
        # A fused activation: TFLite clamps the pool's int8 result at the activation's bounds. Here
        # the pool's int8 result (quantized as the output: pools keep the quantization), then an int8
        # clamp of it (the QDQ folding makes it an int8 activation layer): the same integers.
        mid = len(self.t)
        self.t.append(dataclasses.replace(ty, name=f"{out}:pooled"))
        self.names.append(f"{out}:pooled")
        self.produce(op, mid, y)
        self.produce(op, out_i, self.activation(op, self.names[mid], f"{out}:f"))

    def _average_pool_2d(self, op: _Op) -> None:
        self._pool(op, "AveragePool")

    def _max_pool_2d(self, op: _Op) -> None:
        self._pool(op, "MaxPool")

    def _mean(self, op: _Op) -> None:
        axes = sorted(int(a) % 4 for a in self._const(op, 1).reshape(-1))
        x, out_i = op.inputs[0], op.outputs[0]
        if len(self.t[x].shape) != 4 or axes != [1, 2]:
            raise self.fail(op, f"a MEAN over axes {axes} (over H and W of an NHWC map only)")
        out = self.names[out_i]
        y = self.node("GlobalAveragePool", [self.name(x)], f"{out}:mean")
        if len(self.t[out_i].shape) == 4:
            self.produce(op, out_i, y)
            return
        # keep_dims false: the pooled (N, C, 1, 1) map, quantized as the output, then flattened
        mid = len(self.t)
        self.t.append(dataclasses.replace(self.t[out_i], name=f"{out}:pooled", shape=(self.t[out_i].shape[0], 1, 1, -1)))
        self.names.append(f"{out}:pooled")
        self.produce(op, mid, y)
        self.produce(op, out_i, self.node("Flatten", [self.names[mid]], f"{out}:f", axis=1))

    def _concatenation(self, op: _Op) -> None:
        rank = len(self.t[op.outputs[0]].shape)
        axis = op.options.Axis() % rank
        axis = {0: 0, 1: 2, 2: 3, 3: 1}[axis] if rank == 4 else axis
        out = self.names[op.outputs[0]]
        y = self.node("Concat", [self.name(i) for i in op.inputs], f"{out}:concat", axis=axis)
        self.produce(op, op.outputs[0], self.activation(op, y, f"{out}:f"))

    def _reshape(self, op: _Op) -> None:
        x, out_i = op.inputs[0], op.outputs[0]
        src, dst = self.t[x].shape, self.t[out_i].shape
        same_q = (np.array_equal(self.t[x].scale, self.t[out_i].scale)
                  and np.array_equal(self.t[x].zero, self.t[out_i].zero))
        if not same_q:
            raise self.fail(op, "input and output quantized differently")
        if src == dst:
            self.alias[out_i] = x
            return
        if len(src) == 4 and src[:3] == (1, 1, 1) and dst[-1:] == src[-1:] and all(d == 1 for d in dst[:-1]):
            # (1, 1, 1, C) as a vector of C (a MEAN kept 4-D, squeezed): the same values, which an
            # elementwise reader broadcasts over channels as it would the map itself.
            readers = self.readers.get(out_i, [])
            if not readers or any(r.code not in BROADCAST_READERS for r in readers):
                raise self.fail(op, f"a RESHAPE of {src} to {dst} read by {sorted({r.code for r in readers})} "
                                    f"(taken where {' or '.join(BROADCAST_READERS)} read it)")
            self.alias[out_i] = x
            return
        if len(src) == 4 and len(dst) == 2 and dst[1] == int(np.prod(src[1:])):
            readers = self.readers.get(out_i, [])
            if src[1] * src[2] > 1 and any(r.code != "FULLY_CONNECTED" for r in readers):
                raise self.fail(op, f"a flatten of an NHWC map {src} read by other ops than FULLY_CONNECTED "
                                    "(its element order differs from NCHW's)")
            self.flat[out_i] = tuple(src[1:])
            self.produce(op, out_i, self.node("Flatten", [self.name(x)], f"{self.names[out_i]}:f", axis=1))
            return
        raise self.fail(op, f"a RESHAPE of {src} to {dst} (flattens of NHWC maps are taken)")

    def _pad(self, op: _Op) -> None:
        pads = self._const(op, 1).reshape(-1, 2)
        x, out_i = op.inputs[0], op.outputs[0]
        readers = self.readers.get(out_i, [])
        into_conv = readers and all(r.code in ("CONV_2D", "DEPTHWISE_CONV_2D") and r.inputs[0] == out_i for r in readers)
        if pads.shape != (4, 2) or pads[0].any() or pads[3].any() or not into_conv:
            raise self.fail(op, f"a PAD {pads.tolist()} (only spatial pads read by convolutions are taken: they "
                                "become the convolution's padding)")
        tx, ty = self.t[x], self.t[out_i]
        if not (np.array_equal(tx.scale, ty.scale) and np.array_equal(tx.zero, ty.zero)):
            raise self.fail(op, "input and output quantized differently")
        self.alias[out_i] = x
        # A convolution of the PAD's output reads its (aliased) input with these pads added.
        self.pads[out_i] = (int(pads[1][0]), int(pads[2][0]), int(pads[1][1]), int(pads[2][1]))

    def _softmax(self, op: _Op) -> None:
        if op.options is not None and op.options.Beta() != 1.0:
            raise self.fail(op, f"beta {op.options.Beta()} (1.0 only)")
        rank = len(self.t[op.inputs[0]].shape)
        out = self.names[op.outputs[0]]
        y = self.node("Softmax", [self.name(op.inputs[0])], f"{out}:f", axis=1 if rank in (2, 4) else -1)
        self.produce(op, op.outputs[0], y)

    def _quantize(self, op: _Op) -> None:
        if self.t[op.inputs[0]].dtype != "float32":
            raise self.fail(op, "a requantization of int8 (QUANTIZE of float input only)")
        self.produce(op, op.outputs[0], self.node("Identity", [self.name(op.inputs[0])], f"{self.names[op.outputs[0]]}:f"))

    def _dequantize(self, op: _Op) -> None:
        if self.t[op.outputs[0]].dtype != "float32":
            raise self.fail(op, "output is not float32")
        self.node("Identity", [self.name(op.inputs[0])], self.names[op.outputs[0]])


def tflite_as_onnx(path: str | Path) -> onnx.ModelProto:
    """The ONNX QDQ model a .tflite file means, the one load_tflite imports (its float input in
    the file's NHWC layout, quantized by its first node where the file takes int8; its outputs
    float, dequantized): for tools that take ONNX (bench/mcu.py gives it to emx-onnx-cgen)."""
    path = Path(path)
    tensors, ops, inputs, outputs = read(path)
    try:
        return _Converter(tensors, ops, path.name).model(inputs, outputs)
    except CORRUPT as e:
        raise ModelLoadError(f"{path} is a corrupt .tflite file ({type(e).__name__} converting it: {e})") from None
