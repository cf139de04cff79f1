"""ONNX QDQ models (as `onnxruntime.quantization.quantize_static` writes them) into int8 layers.

Such a file is a float model with QuantizeLinear -> DequantizeLinear pairs on every activation
and DequantizeLinear nodes on int8 weights and int32 biases. The importer reads it as a float
model with quantize / dequantize layers (ops/quant.py), recording each dequantized constant
(`QConst`); `fold` then makes every layer whose data inputs all come from dequantize layers,
whose output goes only to one quantize layer and which has an int8 kernel, an int8 layer: it reads
the int8 tensors, writes the quantized one, holds the int8 weight and int32 bias, and the
dequantize / quantize layers around it go. A layer with no int8 kernel stays a float layer between
a dequantize and a quantize layer (`inspect` says so)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tightfit.errors import ModelLoadError
from tightfit.graph.ir import Quant

# Layer ops with an int8 kernel (kernels/step_args.INT8_BINDERS), each with its own conditions below.
WEIGHTED = ("conv", "gemm")
PLAIN = ("add", "maxpool", "avgpool", "global_pool", "concat", "flatten", "reshape", "transpose", "activation")
MOVES = ("flatten", "reshape", "transpose")  # int8 copies: input and output quantized alike
# Integer types of quantized constants: a weight's, a bias's.
CONST_TYPES = {np.dtype(np.int8): "int8", np.dtype(np.int32): "int32"}


@dataclass(frozen=True)
class QConst:
    """A DequantizeLinear of a constant: the integers, their scale and zero point (per tensor, or
    per index of `axis`)."""

    q: np.ndarray
    scale: np.ndarray
    zero: np.ndarray
    axis: int

    def real(self) -> np.ndarray:
        """The float values (q - zero) * scale, as DequantizeLinear gives them."""
        shape = [1] * self.q.ndim
        if self.scale.size > 1:
            shape[self.axis] = self.scale.size
        diff = self.q.astype(np.int64) - self.zero.reshape(shape if self.zero.size > 1 else ()).astype(np.int64)
        return (diff.astype(np.float32) * self.scale.reshape(shape if self.scale.size > 1 else ())).astype(np.float32)

    @staticmethod
    def of(label: str, values: Sequence[np.ndarray | None], attrs: dict) -> "QConst":
        q, scale = values[0], values[1] if len(values) > 1 else None
        if scale is None:
            raise ModelLoadError(f"node {label!r} (DequantizeLinear): no scale (its second input is missing)")
        zero = values[2] if len(values) > 2 and values[2] is not None else np.zeros((), q.dtype)
        if q.dtype not in CONST_TYPES:
            raise ModelLoadError(f"node {label!r} (DequantizeLinear): {q.dtype} quantized constants are not run "
                                 f"(int8 weights and int32 biases are)")
        if scale.dtype != np.float32 or not np.all(scale > 0):
            raise ModelLoadError(f"node {label!r} (DequantizeLinear): scale must be positive float32, got {scale.dtype} "
                                 f"{scale.reshape(-1)[:4]}")
        if zero.shape != scale.shape and zero.size != 1:
            raise ModelLoadError(f"node {label!r} (DequantizeLinear): zero point of shape {zero.shape} for a scale of "
                                 f"shape {scale.shape}")
        axis = int(attrs.get("axis", 1))
        axis = axis + q.ndim if axis < 0 else axis
        if scale.size > 1 and not 0 <= axis < q.ndim:
            raise ModelLoadError(f"node {label!r} (DequantizeLinear): axis {attrs.get('axis', 1)} is out of range for a "
                                 f"{q.ndim}-D constant")
        if scale.size > 1 and q.shape[axis] != scale.size:
            raise ModelLoadError(f"node {label!r} (DequantizeLinear): {scale.size} per-channel scales along axis "
                                 f"{attrs.get('axis', 1)} of a {q.shape} constant")
        return QConst(q, scale.reshape(-1), zero.reshape(-1), axis)


def fold(protos: list, qconsts: dict[str, QConst], node_inputs: Callable[[str], Sequence[str]],
         keep: set[str], node_attrs: Callable[[str], dict]) -> tuple[list, dict[str, Quant]]:
    """The layers with QDQ pairs folded into int8 layers, and the quantization of every int8
    tensor. `node_inputs(label)` / `node_attrs(label)`: a layer's first ONNX node's input names and
    attributes (where its weight and bias come from); `keep`: the model's outputs."""
    quants = _tensor_quants(protos)
    producer = {p.output: p for p in protos}
    readers: dict[str, list] = {}
    for p in protos:
        for t in dict.fromkeys(p.inputs):
            readers.setdefault(t, []).append(p)
    int8_of = {p.output: p.inputs[0] for p in protos if p.op == "dequantize"}
    gone: set[int] = set()
    for p in protos:
        out = readers.get(p.output, [])
        if p.op not in WEIGHTED + PLAIN or p.output in keep or len(out) != 1 or out[0].op != "quantize":
            continue
        if not p.inputs or any(t not in int8_of for t in p.inputs):
            continue
        ins = [int8_of[t] for t in p.inputs]
        q_out = out[0].output
        params = _int8_params(p, ins, q_out, quants, qconsts, node_inputs, node_attrs)
        if params is None or not _plain_ok(p, ins, q_out, quants):
            continue
        fused = {"ort_fused": all(len(readers.get(t, [])) == 1 for t in p.inputs)} if p.op == "avgpool" else {}
        p.inputs, p.output, p.attrs = ins, q_out, {**p.attrs, "quant": "int8", **fused, **params.pop("attrs", {})}
        p.params = params["params"]
        p.nodes = p.nodes + out[0].nodes
        gone.add(id(out[0]))
    kept = [p for p in protos if id(p) not in gone]
    for p in kept:  # a uint8 tensor is held as int8 (its values less 128): the model's outputs are not
        if p.op == "quantize" and p.attrs.get("stored") == "uint8" and p.output in keep:
            raise ModelLoadError(f"output {p.output!r} is a uint8 tensor; tightfit runs models whose outputs are "
                                 "float (end the model with a DequantizeLinear) or int8")
    return _fold_moves_into_gemm(_drop_unread(kept, keep)), quants


def _tensor_quants(protos: list) -> dict[str, Quant]:
    """Every int8 tensor (a quantize layer's output, a dequantize layer's input) -> its Quant."""
    out: dict[str, Quant] = {}
    for p in protos:
        if p.op in ("quantize", "dequantize"):
            t = p.output if p.op == "quantize" else p.inputs[0]
            q = Quant((p.attrs["scale"],), (p.attrs["zero_point"],))
            if out.setdefault(t, q) != q:
                raise ModelLoadError(f"tensor {t!r} is quantized with two scales or zero points ({out[t]} and {q})")
    return out


def _plain_ok(p, ins: list[str], q_out: str, quants: dict[str, Quant]) -> bool:
    """The conditions of the weightless int8 kernels (else the layer stays float)."""
    a = p.attrs
    if p.op in ("maxpool", "avgpool", "global_pool", "concat", "add") and a.get("act"):
        return False
    if p.op == "add":
        return len(ins) == 2 and not p.params
    if p.op == "concat":
        return a.get("axis", 1) == 1
    if p.op == "activation":  # a ReLU / Clip kept between DequantizeLinear and QuantizeLinear
        act = tuple(a.get("act", ()))
        return len(act) == 1 and act[0][0] in ("relu", "clip")
    if p.op in MOVES:
        return quants[ins[0]] == quants[q_out] and (p.op != "transpose" or len(a["perm"]) <= 4)
    return True


def _int8_params(p, ins: list[str], q_out: str, quants: dict[str, Quant], qconsts: dict[str, QConst],
                 node_inputs: Callable, node_attrs: Callable) -> dict[str, Any] | None:
    """{"params": [int8 weight, int32 bias], "attrs": {"w_scale": ...}} of a conv or gemm whose
    weight and bias are quantized constants as onnxruntime's QLinearConv / QGemm take them; None
    where they are not (the layer then stays float); {"params": []} for a weightless op."""
    if p.op not in WEIGHTED:
        return {"params": []}
    if p.attrs.get("act") and p.attrs["act"][0][0] not in ("relu", "clip") or len(p.attrs.get("act", ())) > 1:
        return None
    label = next((n for n in p.nodes if node_attrs(n).get("__type") in ("Conv", "Gemm", "MatMul")), p.nodes[0])
    names = list(node_inputs(label))
    w = qconsts.get(names[1]) if len(names) > 1 else None
    b = qconsts.get(names[2]) if len(names) > 2 and names[2] else None
    if w is None or w.q.dtype != np.int8 or np.any(w.zero != 0) or (len(names) > 2 and names[2] and b is None):
        return None
    attrs = node_attrs(label)
    transposed = p.onnx_type == "MatMul" or (p.onnx_type == "Gemm" and not attrs.get("transB", 0))
    if p.op == "gemm" and (float(attrs.get("alpha", 1.0)) != 1.0 or float(attrs.get("beta", 1.0)) != 1.0):
        return None
    out_axis = 1 if transposed else 0
    if w.scale.size > 1 and w.axis != out_axis:
        raise ModelLoadError(f"node {label!r} ({p.onnx_type}): per-channel weight scales along axis {w.axis}, "
                             f"not the output channels' axis {out_axis}")
    weight = w.q.T if transposed else w.q
    params = [np.ascontiguousarray(weight)]
    if b is not None:
        if b.q.dtype != np.int32 or np.any(b.zero != 0):
            return None
        xs = np.float32(quants[ins[0]].scale[0])
        expected = xs * np.broadcast_to(w.scale, (weight.shape[0],))
        if not np.allclose(np.broadcast_to(b.scale, expected.shape), expected, rtol=1e-5):
            return None  # a bias not in the accumulator's scale: QLinearConv could not take it
        params.append(np.ascontiguousarray(np.broadcast_to(b.q.reshape(-1), (weight.shape[0],)), dtype=np.int32))
    return {"params": params, "attrs": {"w_scale": tuple(float(s) for s in w.scale)}}


def _fold_moves_into_gemm(protos: list) -> list:
    """An int8 flatten or reshape to (N, features) read only by an int8 gemm is dropped: the gemm
    reads its input's elements in the same logical order."""
    readers: dict[str, list] = {}
    for p in protos:
        for t in p.inputs:
            readers.setdefault(t, []).append(p)
    gone: set[int] = set()
    for p in protos:
        r = readers.get(p.output, [])
        if (p.op in ("flatten", "reshape") and p.attrs.get("quant") == "int8" and len(r) == 1 and r[0].op == "gemm"
                and r[0].attrs.get("quant") == "int8"):
            r[0].inputs = [p.inputs[0] if t == p.output else t for t in r[0].inputs]
            r[0].nodes = p.nodes + r[0].nodes
            gone.add(id(p))
    return [p for p in protos if id(p) not in gone]


def _drop_unread(protos: list, keep: set[str]) -> list:
    """Dequantize layers nothing reads any more (their readers became int8 layers)."""
    while True:
        read = {t for p in protos for t in p.inputs} | keep
        left = [p for p in protos if p.op != "dequantize" or p.output in read]
        if len(left) == len(protos):
            return left
        protos = left
