"""ONNX QOperator files (issue 40 point 1): `quantize_static(..., quant_format=QuantFormat.QOperator)`'s
QLinearConv, QGemm, QLinearMatMul, QLinearAdd, QLinearMul, QLinearConcat, QLinearAveragePool,
QLinearGlobalAveragePool, QLinearSigmoid, QLinearLeakyRelu read into the int8 layers a QDQ file
gives (frontend/qoperator.py), every int8 tensor equal to onnxruntime's run of the same file;
and bad int8 input, QDQ or QOperator, is one line and exit 2 through the CLI.

Found here: onnxruntime's QLinearAdd, QLinearConcat and QLinearAveragePool give the same int8
values as the arithmetic the QDQ kernels follow (0 differing elements on these models and on a
per-channel MobileNetV2); QLinearSigmoid / QLinearLeakyRelu (lookup tables onnxruntime builds from
float) run here in fp32 between a dequantize and a quantize layer, and matched too."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tightfit.cli import main
from tightfit.frontend.onnx_import import load_onnx
from tightfit.reference import run_reference
from tightfit.verify import onnxruntime_outputs

from int8_models import Builder, activations_cnn, quantize, small_cnn
from test_int8 import _split_runs_equal


def _int8_tensors_equal_ort(path: Path, float_ok: bool = False) -> None:
    """Every int8 tensor of our run equals onnxruntime's run of the file (its tensors as extra
    outputs); with `float_ok`, a tensor made by a quantize layer after an fp32 layer may differ by
    1 LSB (its share printed)."""
    g = load_onnx(path)
    x = np.random.default_rng(7).standard_normal(g.shape(g.inputs[0]), dtype=np.float32)
    names = [l.output for l in g.layers if g.tensors[l.output].dtype == "int8"]
    ours, ref = run_reference(g, x, keep=names), onnxruntime_outputs(str(path), x, extra=names)
    for t in names:
        d = np.abs(ours[t].astype(np.int64) - ref[t].reshape(ours[t].shape).astype(np.int64))
        kernel = g.producer(t).op != "quantize"
        print(f"{t}: {(d > 0).mean():.4%} of elements off onnxruntime's QOperator run")
        assert not d.any() or (float_ok and not kernel and d.max() == 1), (t, int(d.max()), float((d > 0).mean()))
    out = g.outputs[0]
    assert np.array_equal(run_reference(g, x)[out], onnxruntime_outputs(str(path), x)[out].reshape(g.shape(out)))


def _ops(path: Path) -> list[tuple[str, str | None]]:
    return [(l.op, l.attrs.get("quant")) for l in load_onnx(path).layers]


@pytest.mark.parametrize("per_channel", [False, True])
def test_qoperator_reads_into_the_qdq_layers_exactly(tmp_path, per_channel):
    qop = quantize(small_cnn(), tmp_path / "qop.onnx", per_channel, qoperator=True)
    types = {n.op_type for n in onnx.load(qop).graph.node}
    assert {"QLinearConv", "QLinearAdd", "QLinearAveragePool", "QLinearConcat", "QLinearGlobalAveragePool", "QGemm"} <= types
    qdq = quantize(small_cnn(), tmp_path / "qdq.onnx", per_channel)
    assert _ops(qop) == _ops(qdq)  # the same int8 layers, whichever form the file takes
    _int8_tensors_equal_ort(qop)
    _split_runs_equal(qop)


def test_qoperator_activations_run_in_fp32_between_quantize_steps(tmp_path, capsys):
    path = quantize(activations_cnn(), tmp_path / "act.onnx", qoperator=True)
    types = {n.op_type for n in onnx.load(path).graph.node}
    assert {"QLinearSigmoid", "QLinearMul", "QLinearLeakyRelu", "QLinearMatMul", "QLinearAveragePool"} <= types
    ops = _ops(path)
    assert ops.count(("conv", "int8")) == 2 and ("gemm", "int8") in ops and ("avgpool", "int8") in ops
    assert ("activation", None) in ops and ("mul", None) in ops
    _int8_tensors_equal_ort(path, float_ok=True)
    _split_runs_equal(path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("fp32 (no int8 kernel") == 3, out


def test_qoperator_mobilenet_v2_per_channel_is_bit_exact(tmp_path):
    """Every int8 tensor of a per-channel QOperator MobileNetV2 (at 96) equals onnxruntime's."""
    pytest.importorskip("torchvision")
    from tightfit.frontend import zoo

    path = quantize(onnx.load_from_string(zoo.onnx_model("mobilenet_v2", (1, 3, 96, 96))), tmp_path / "mbv2.onnx",
                    per_channel=True, preprocess=True, qoperator=True)
    assert [op for op, q in _ops(path) if q != "int8"] == ["quantize", "dequantize"]
    _int8_tensors_equal_ort(path)


# --- bad int8 input: one line, exit 2 ------------------------------------------------------------

def _node(m: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    return next(n for n in m.graph.node if n.op_type == op_type)


def _set(m: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    next(i for i in m.graph.initializer if i.name == name).CopyFrom(numpy_helper.from_array(value, name))


def _uint8_weights(m: onnx.ModelProto) -> None:
    conv = _node(m, "QLinearConv")
    w = numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == conv.input[3]))
    _set(m, conv.input[3], (w.astype(np.int16) + 128).astype(np.uint8))
    _set(m, conv.input[5], np.full(w.shape[0], 128, np.uint8))


def _weight_axis(m: onnx.ModelProto, axis: int) -> None:
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and any(a.name == "axis" for a in n.attribute))
    next(a for a in dq.attribute if a.name == "axis").i = axis


BAD = {  # name -> (QOperator file?, edit, what the line says)
    "missing scale (QOperator)": (True, lambda m: _node(m, "QLinearConv").input.__setitem__(4, ""), "is missing"),
    "missing scale (QDQ weight)": (False, lambda m: next(n for n in m.graph.node if n.op_type == "DequantizeLinear")
                                   .input.__setitem__(1, ""), "no scale"),
    "missing scale (QuantizeLinear)": (False, lambda m: _node(m, "QuantizeLinear").input.__setitem__(1, ""),
                                       "scale is not a constant"),
    "zero point out of range": (False, lambda m: _set(m, _node(m, "QuantizeLinear").input[2], np.int32(300)),
                                "zero point [300]"),
    "zero point out of range (QOperator)": (True, lambda m: _set(m, _node(m, "QLinearConv").input[7], np.int32(-200)),
                                            "zero point [-200]"),
    "per-channel scales for another axis": (True, lambda m: (_set(m, _node(m, "QLinearConv").input[4], np.full(5, 0.01, np.float32)),
                                                             _set(m, _node(m, "QLinearConv").input[5], np.zeros(5, np.int8))),
                                            "5 per-channel scales along axis 0"),
    "axis out of range": (False, lambda m: _weight_axis(m, 7), "axis 7 is out of range"),
    "uint8 weights with int8 activations": (True, _uint8_weights, "uint8 quantized constants are not run"),
    "float16 scale": (False, lambda m: _set(m, _node(m, "QuantizeLinear").input[1], np.float16(0.1)), "float16 scale"),
    "float16 weight scale (QOperator)": (True, lambda m: _set(m, _node(m, "QLinearConv").input[4], np.full(8, 0.01, np.float16)),
                                         "float16"),
}


@pytest.fixture(scope="module")
def one_conv(tmp_path_factory) -> dict[bool, Path]:
    b = Builder((1, 3, 6, 6))
    model, folder = b.model(b.conv("x", 3, 8, 3, 1, 1)), tmp_path_factory.mktemp("one_conv")
    return {qop: quantize(model, folder / f"conv{int(qop)}.onnx", per_channel=True, qoperator=qop) for qop in (False, True)}


def _one_line(path: Path, what: str, capsys) -> None:
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and what in err[0], err


@pytest.mark.parametrize("case", list(BAD))
def test_bad_int8_input_is_one_line(one_conv, tmp_path, case, capsys):
    qop, edit, what = BAD[case]
    m = onnx.load(one_conv[qop])
    edit(m)
    path = tmp_path / "bad.onnx"
    onnx.save(m, path)
    _one_line(path, what, capsys)


def test_dynamic_quantization_is_one_line(tmp_path, capsys):
    """ConvInteger (onnxruntime's dynamic quantization: scales computed at run time) is refused by name."""
    g = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("ConvInteger", ["q", "w", "z", "wz"], ["y32"], kernel_shape=[1, 1]),
         helper.make_node("Cast", ["y32"], ["y"], to=TensorProto.FLOAT)],
        "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.int8(0), "z"),
         numpy_helper.from_array(np.ones((2, 2, 1, 1), np.int8), "w"), numpy_helper.from_array(np.int8(0), "wz")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "dyn.onnx")
    _one_line(tmp_path / "dyn.onnx", "dynamic quantization", capsys)


def _qop_model(path: Path, node: onnx.NodeProto, inputs: list) -> Path:
    """x quantized, then `node` (com.microsoft) on the int8 tensor, then dequantized."""
    g = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), node,
         helper.make_node("DequantizeLinear", ["qy", "s", "z"], ["y"])],
        "qop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.int8(0), "z"), *inputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def test_qlinear_softmax_is_one_line(tmp_path, capsys):
    """onnxruntime's QLinearSoftmax (its lookup-table arithmetic; no kernel here) is refused by name."""
    node = helper.make_node("QLinearSoftmax", ["q", "s", "z", "s", "z"], ["qy"], domain="com.microsoft", axis=1, opset=13)
    _one_line(_qop_model(tmp_path / "softmax.onnx", node, []), "QLinearSoftmax, com.microsoft", capsys)


def test_channels_last_qlinear_ops_are_one_line(tmp_path, capsys):
    """channels_last=1 (int8 tensors channels-last) and the Nhwc ops are refused by name."""
    pool = helper.make_node("QLinearGlobalAveragePool", ["q", "s", "z", "s", "z"], ["qy"], domain="com.microsoft",
                            channels_last=1)
    _one_line(_qop_model(tmp_path / "pool.onnx", pool, []), "channels_last=1", capsys)
    conv = helper.make_node("NhwcQLinearConv", ["q", "s", "z", "w", "s", "z", "s", "z"], ["qy"], domain="com.microsoft")
    w = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.int8), "w")
    _one_line(_qop_model(tmp_path / "conv.onnx", conv, [w]), "NhwcQLinearConv, com.microsoft", capsys)
