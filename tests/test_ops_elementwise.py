"""Issue 22, part A: elementwise arithmetic, activations, normalizations, channel reductions and
softmax, and the shape arithmetic exporters leave in graphs.

Each operator is a tiny ONNX model (a conv producing its data, the operator, a conv reading it)
that must import, compute onnxruntime's outputs in the reference executor, and compute the
reference executor's outputs when planned by rows (parts, one row per phase) and by tiles, so
the op's region and window code runs. One model holding every new op is exported to C and
built with the portable flags. Exporter patterns (SiLU, hard-swish as x / 6, GELU in erf and
tanh form, Mish) fuse into the layer producing their input; ConvNeXt's channels-last block
imports as an NCHW chain."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tightfit
from tightfit.errors import TightfitError, UnsupportedOpsError
from tightfit.frontend.onnx_import import import_model
from tightfit.ops import get_op
from tightfit.plan.check import check_plan
from tightfit.runtime.executor import ArenaExecutor
from tightfit.reference import run_reference
from tightfit.verify import compare

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ort.set_default_logger_severity(3)

C, H, W = 4, 8, 6
RNG = np.random.default_rng(22)


def _const(shape, low=-1.0, high=1.0) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(np.float32)


def _model(body: list, inits: dict, out: str = "y", opset: int = 17, extra_outputs=()) -> onnx.ModelProto:
    """x (1, 3, H, W) -> conv a, conv b -> body -> 1x1 conv -> y. `body` reads a and b (both
    (1, C, H, W)) and ends in tensor "z"."""
    inits = dict(inits)
    inits.update(wa=_const((C, 3, 3, 3)), wo=_const((C, C, 1, 1)))
    if any("b" in n.input for n in body):
        inits["wb"] = _const((C, 3, 3, 3))
    reads_b = any("b" in n.input for n in body)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
             *([helper.make_node("Conv", ["x", "wb"], ["b"], name="conv_b", pads=[1, 1, 1, 1])] if reads_b else []),
             *body,
             helper.make_node("Conv", ["z", "wo"], [out], name="conv_out")]
    graph = helper.make_graph(
        nodes, "case", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, H, W])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, C, H, W]) for o in (out, *extra_outputs)],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset <= 17 else 9
    return model


def _n(op: str, inputs: list, output: str = "z", **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, [output], name=f"{op.lower()}_{output}", **attrs)


def _scalar(v: float) -> np.ndarray:
    return np.array(v, np.float32)


# name -> (body nodes, constants, opset); the body reads a, b and writes z.
CASES = {
    "sub": ([_n("Sub", ["a", "b"])], {}, 17),
    "sub_broadcast_first": ([_n("GlobalAveragePool", ["b"], "g"), _n("Sub", ["g", "a"])], {}, 17),
    "sub_const_first": ([_n("Sub", ["k", "a"])], {"k": _const((C, 1, 1))}, 17),
    "div": ([_n("Abs", ["b"], "ab"), _n("Add", ["ab", "one"], "d"), _n("Div", ["a", "d"])], {"one": _scalar(1.0)}, 17),
    "div_const": ([_n("Div", ["a", "k"])], {"k": _const((1, C, 1, W), 0.5, 2.0)}, 17),
    "div_by_six": ([_n("Div", ["a", "six"])], {"six": _scalar(6.0)}, 17),
    "pow_square": ([_n("Pow", ["a", "two"])], {"two": _scalar(2.0)}, 17),
    "pow_tensor": ([_n("Abs", ["a"], "aa"), _n("Add", ["aa", "half"], "base"), _n("Sigmoid", ["b"], "e"), _n("Pow", ["base", "e"])],
                   {"half": _scalar(0.5)}, 17),
    "min": ([_n("Min", ["a", "b", "k"])], {"k": _const((C, 1, 1))}, 17),
    "max": ([_n("GlobalMaxPool", ["b"], "g"), _n("Max", ["a", "g"])], {}, 17),
    "clip_tensor_bounds": ([_n("Clip", ["a", "lo", "hi"])], {"lo": _scalar(-0.25), "hi": np.array([0.5], np.float32)}, 17),
    "clip_upper_only": ([_n("Clip", ["a", "", "hi"])], {"hi": _scalar(0.3)}, 17),
    "prelu": ([_n("PRelu", ["a", "slope"])], {"slope": _const((C, 1, 1))}, 17),
    "sqrt": ([_n("Abs", ["a"], "aa"), _n("Sqrt", ["aa"])], {}, 17),
    "exp": ([_n("Exp", ["a"])], {}, 17),
    "log": ([_n("Abs", ["a"], "aa"), _n("Add", ["aa", "one"], "p"), _n("Log", ["p"])], {"one": _scalar(1.0)}, 17),
    "neg": ([_n("Neg", ["a"])], {}, 17),
    "reciprocal": ([_n("Abs", ["a"], "aa"), _n("Add", ["aa", "one"], "p"), _n("Reciprocal", ["p"])], {"one": _scalar(1.0)}, 17),
    "erf": ([_n("Erf", ["a"])], {}, 17),
    "sigmoid_tanh": ([_n("Sigmoid", ["a"], "s"), _n("Tanh", ["b"], "t"), _n("Add", ["s", "t"])], {}, 17),
    "hardsigmoid_hardswish": ([_n("HardSigmoid", ["a"], "s", alpha=0.25, beta=0.4), _n("HardSwish", ["b"], "t"),
                               _n("Mul", ["s", "t"])], {}, 17),
    "mish": ([_n("Mish", ["a"])], {}, 18),
    "gelu": ([_n("Gelu", ["a"])], {}, 20),
    "gelu_tanh": ([_n("Gelu", ["a"], approximate="tanh")], {}, 20),
    "softplus": ([_n("Softplus", ["a"])], {}, 17),
    "leakyrelu_elu_selu": ([_n("LeakyRelu", ["a"], "l", alpha=0.2), _n("Elu", ["l"], "e", alpha=0.7),
                            _n("Selu", ["e"], alpha=1.5, gamma=1.1)], {}, 17),
    "batchnorm_standalone": ([_n("Add", ["a", "b"], "s"),
                              _n("BatchNormalization", ["s", "bn_g", "bn_b", "bn_m", "bn_v"])],
                             {"bn_g": _const(C), "bn_b": _const(C), "bn_m": _const(C), "bn_v": _const(C, 0.5, 2.0)}, 17),
    "instancenorm": ([_n("InstanceNormalization", ["a", "in_s", "in_b"], epsilon=1e-3)],
                     {"in_s": _const(C), "in_b": _const(C)}, 17),
    "layernorm_channels": ([_n("Transpose", ["a"], "t", perm=[0, 2, 3, 1]), _n("LayerNormalization", ["t", "ln_s", "ln_b"], "n",
                                                                                 axis=-1, epsilon=1e-6),
                            _n("Transpose", ["n"], perm=[0, 3, 1, 2])], {"ln_s": _const(C), "ln_b": _const(C)}, 17),
    "layernorm_decomposed": ([_n("ReduceMean", ["a"], "m", axes=[1], keepdims=1), _n("Sub", ["a", "m"], "d"),
                              _n("Pow", ["d", "two"], "p"), _n("ReduceMean", ["p"], "v", axes=[1], keepdims=1),
                              _n("Add", ["v", "eps"], "e"), _n("Sqrt", ["e"], "s"), _n("Div", ["d", "s"], "q"),
                              _n("Mul", ["q", "ln_s"], "r"), _n("Add", ["r", "ln_b"])],
                             {"two": _scalar(2.0), "eps": _scalar(1e-5), "ln_s": _const((C, 1, 1)), "ln_b": _const((C, 1, 1))}, 13),
    "reducemean_c": ([_n("ReduceMean", ["a"], "m", axes=[1], keepdims=1), _n("Sub", ["a", "m"])], {}, 17),
    "reducemax_c_axes_input": ([_n("ReduceMax", ["a", "ax"], "m", keepdims=1), _n("Mul", ["b", "m"])],
                               {"ax": np.array([1], np.int64)}, 18),
    "reducemean_hw": ([_n("ReduceMean", ["a"], "m", axes=[2, 3], keepdims=1), _n("Mul", ["b", "m"])], {}, 17),
    "softmax_c": ([_n("Softmax", ["a"], axis=1)], {}, 17),
    "logsoftmax_c": ([_n("LogSoftmax", ["a"], axis=1)], {}, 17),
}


def _onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


def _save(tmp_path: Path, model: onnx.ModelProto, name: str = "m") -> str:
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return str(path)


def _assert_plans_match(path: str, g, x: np.ndarray, ref: dict) -> None:
    """Parts by one row per phase, and (where every layer splits) tiles of a 2x2 grid."""
    kinds = [{"method": "reuse"}, {"method": "parts", "rows": 1}]
    if all(get_op(l.op).splittable for l in g.layers):
        kinds.append({"method": "tiling", "tiling": f"0-{len(g.layers) - 1}:2x2:reuse"})
    for kw in kinds:
        plan, graphs = tightfit.api.plan(path, **kw)
        check_plan(plan, graphs)
        outs = ArenaExecutor(plan, graphs, fill_nan=True).run(x)[0]
        for t in g.outputs:
            result = compare(outs[t], ref[t])
            assert result.ok, f"{kw}: output {t}: {result}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_matches_onnxruntime_whole_and_split(tmp_path, case):
    body, inits, opset = CASES[case]
    model = _model(body, inits, opset=opset)
    path = _save(tmp_path, model)
    g = tightfit.load(path)
    x = _const((1, 3, H, W), -2.0, 2.0)
    ref = run_reference(g, x)
    expected = _onnxruntime(model, np.asarray(x))[0]
    got = np.asarray(ref[g.outputs[0]])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(expected).max())))
    _assert_plans_match(path, g, x, ref)


def _every_op_model() -> onnx.ModelProto:
    """Every op of this file's cases in one model (opset 20: Gelu), as branches from a and b
    summed into z. The exporter patterns are here too, on tensors with other readers (so
    standalone activation layers)."""
    k = {"one": _scalar(1.0), "two": _scalar(2.0), "three": _scalar(3.0), "six": _scalar(6.0), "half": _scalar(0.5),
         "rt2": _scalar(2 ** 0.5), "lo": _scalar(-0.25), "hi": _scalar(0.5), "kc": _const((C, 1, 1)), "slope": _const((C, 1, 1)),
         "kw": _const((1, C, 1, W), 0.5, 2.0), "bn_g": _const(C), "bn_b": _const(C), "bn_m": _const(C), "bn_v": _const(C, 0.5, 2.0),
         "in_s": _const(C), "in_b": _const(C), "ln_s": _const(C), "ln_b": _const(C), "ax1": np.array([1], np.int64)}
    n = _n
    branches = [
        n("Sub", ["a", "b"], "r0"), n("Abs", ["b"], "ab"), n("Add", ["ab", "one"], "ab1"), n("Div", ["a", "ab1"], "r1"),
        n("Pow", ["a", "two"], "r2"), n("Min", ["a", "b", "kc"], "r3"), n("GlobalMaxPool", ["b"], "gb"), n("Max", ["a", "gb"], "r4"),
        n("Clip", ["a", "lo", "hi"], "r5"), n("PRelu", ["a", "slope"], "r6"), n("Div", ["kw", "ab1"], "r7"),
        n("Abs", ["a"], "aa"), n("Sqrt", ["aa"], "r8"), n("Tanh", ["a"], "ta"), n("Exp", ["ta"], "r9"), n("Add", ["aa", "one"], "aa1"),
        n("Log", ["aa1"], "r10"), n("Neg", ["a"], "r11"), n("Reciprocal", ["aa1"], "r12"), n("Erf", ["a"], "r13"),
        n("Sigmoid", ["a"], "r14"), n("HardSigmoid", ["a"], "r15", alpha=0.25, beta=0.4), n("HardSwish", ["a"], "r16"),
        n("Mish", ["a"], "r17"), n("Gelu", ["a"], "r18"), n("Gelu", ["b"], "r19", approximate="tanh"), n("Softplus", ["a"], "r20"),
        n("LeakyRelu", ["a"], "r21", alpha=0.2), n("Elu", ["a"], "r22", alpha=0.7), n("Selu", ["a"], "r23"),
        n("Add", ["a", "b"], "ab_sum"), n("BatchNormalization", ["ab_sum", "bn_g", "bn_b", "bn_m", "bn_v"], "r24"),
        n("InstanceNormalization", ["a", "in_s", "in_b"], "r25"),
        n("Transpose", ["b"], "bt", perm=[0, 2, 3, 1]), n("LayerNormalization", ["bt", "ln_s", "ln_b"], "bn", axis=-1),
        n("Transpose", ["bn"], "r26", perm=[0, 3, 1, 2]),
        n("ReduceMean", ["a", "ax1"], "m", keepdims=1), n("Sub", ["a", "m"], "r27"), n("ReduceMax", ["b", "ax1"], "mx", keepdims=1),
        n("Mul", ["a", "mx"], "r28"), n("Softmax", ["a"], "r29", axis=1), n("LogSoftmax", ["b"], "r30", axis=1),
        # SiLU, hard-swish as x * relu6(x + 3) / 6, GELU as exporters decompose it.
        n("Sigmoid", ["b"], "sb"), n("Mul", ["b", "sb"], "r31"),
        n("Add", ["b", "three"], "b3"), n("Clip", ["b3", "", "six"], "b6"), n("Relu", ["b6"], "b6r"), n("Mul", ["b", "b6r"], "bh"),
        n("Div", ["bh", "six"], "r32"),
        n("Div", ["a", "rt2"], "ar"), n("Erf", ["ar"], "ae"), n("Add", ["ae", "one"], "ae1"), n("Mul", ["a", "ae1"], "ag"),
        n("Mul", ["ag", "half"], "r33"),
    ]
    outs = [nd.output[0] for nd in branches if nd.output[0].startswith("r")]
    sums, cur = [], outs[0]
    for i, t in enumerate(outs[1:]):
        sums.append(n("Add", [cur, t], f"s{i}"))
        cur = f"s{i}"
    sums.append(n("Identity", [cur], "z"))
    return _model(branches + sums, k, opset=20)


def test_every_op_model_imports_and_matches():
    model = _every_op_model()
    g = import_model(model, None, "every_op")
    ops = {l.op for l in g.layers}
    assert {"eltwise", "channel_norm", "instancenorm", "channel_reduce", "softmax", "batchnorm", "activation"} <= ops
    kinds = {a[0] for l in g.layers for a in l.attrs.get("act", ())}
    assert {"silu", "hardswish", "gelu"} <= kinds, kinds
    x = _const((1, 3, H, W), -2.0, 2.0)
    expected = _onnxruntime(model, np.asarray(x))[0]
    got = np.asarray(run_reference(g, x)[g.outputs[0]])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
@pytest.mark.parametrize("kw", [{"method": "reuse"}, {"method": "parts", "rows": 2}], ids=["reuse", "parts"])
def test_every_op_exports_to_portable_c(tmp_path, kw):
    from tightfit.api import check_export
    from tightfit.export import export

    path = _save(tmp_path, _every_op_model())
    plan, graphs = tightfit.api.plan(path, **kw)
    sources = export(plan, graphs, tmp_path / "out")
    c = check_export(plan, graphs, sources, tmp_path / "out", cflags=["-std=c99", "-O2"], runs=1)
    assert c.ok, f"outputs differ: {c.max_abs_diff} > {c.tolerance}"


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_tiled_constant_operands_export_to_portable_c(tmp_path):
    """Tiles of a 2x2 grid: a constant operand varying over H and W (1, C, 1, W), first in the
    fold (k / x), is read from each tile's own rows and columns; and a channel LayerNorm."""
    from tightfit.api import check_export
    from tightfit.export import export

    body = [_n("Abs", ["a"], "aa"), _n("Add", ["aa", "one"], "d"), _n("Div", ["k", "d"], "q"),
            _n("Transpose", ["q"], "t", perm=[0, 2, 3, 1]), _n("LayerNormalization", ["t", "ln_s", "ln_b"], "n", axis=-1),
            _n("Transpose", ["n"], perm=[0, 3, 1, 2])]
    path = _save(tmp_path, _model(body, {"one": _scalar(1.0), "k": _const((1, C, 1, W)), "ln_s": _const(C), "ln_b": _const(C)}))
    plan, graphs = tightfit.api.plan(path, method="tiling", tiling=f"0-{len(tightfit.load(path).layers) - 1}:2x2:reuse")
    sources = export(plan, graphs, tmp_path / "out")
    c = check_export(plan, graphs, sources, tmp_path / "out", cflags=["-std=c99", "-O2"], runs=1)
    assert c.ok, f"outputs differ: {c.max_abs_diff} > {c.tolerance}"


# --- the PyTorch path: activation modules as torch.onnx exports them ----------------------------

# (torch.nn's class, its arguments, the activation kind it fuses as: None where it stays a layer)
TORCH_ACTS = [("SiLU", {}, "silu"), ("Hardswish", {}, "hardswish"), ("GELU", {}, "gelu"),
              ("GELU", {"approximate": "tanh"}, "gelu_tanh"), ("Mish", {}, "mish"), ("Softplus", {}, "softplus"),
              ("ELU", {"alpha": 0.5}, "elu"), ("SELU", {}, "selu"), ("PReLU", {"num_parameters": 5}, None)]


@pytest.mark.requires_torch
@pytest.mark.parametrize("act, kwargs, kind", TORCH_ACTS, ids=[k or a for a, _, k in TORCH_ACTS])
def test_torch_activation_fuses_into_conv(act, kwargs, kind):
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3, padding=1), getattr(torch.nn, act)(**kwargs),
                                 torch.nn.Conv2d(5, 4, 1)).eval()
    g = tightfit.load(module, (1, 3, 9, 7))
    if kind is not None:
        assert [l.op for l in g.layers] == ["conv", "conv"] and g.layers[0].attrs["act"][0][0] == kind, g.layers
    x = torch.randn(1, 3, 9, 7)
    with torch.no_grad():
        expected = module(x)
    got = tightfit.run(g, x).outputs[g.outputs[0]]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.requires_torch
def test_torch_hardswish_as_x_relu6_over_six_fuses():
    """A model written as x * relu6(x + 3) / 6 (torch exports Add, Clip, Mul, Div)."""
    import torch

    class HardSwishByHand(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            return y * torch.nn.functional.relu6(y + 3) / 6

    module = HardSwishByHand().eval()
    g = tightfit.load(module, (1, 3, 8, 8))
    assert len(g.layers) == 1 and g.layers[0].attrs["act"] == (("hardswish",),)
    x = torch.randn(1, 3, 8, 8) * 3
    with torch.no_grad():
        np.testing.assert_allclose(tightfit.run(g, x).outputs[g.outputs[0]], module(x), rtol=1e-4, atol=1e-5)


def _convnext_pieces():
    from functools import partial

    import torch
    from torchvision.models.convnext import CNBlock, LayerNorm2d

    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 2, stride=2), LayerNorm2d(8, eps=1e-6),
        CNBlock(8, layer_scale=0.5, stochastic_depth_prob=0.0, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6)),
        LayerNorm2d(8, eps=1e-6), torch.nn.Conv2d(8, 16, 2, stride=2)).eval()
    with torch.no_grad():  # a non-trivial norm: random affine parameters
        for m in module.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.normal_()
                m.bias.normal_()
    return module


@pytest.mark.requires_torch
@pytest.mark.parametrize("opset", [17, 13])
def test_convnext_block_imports_as_an_nchw_chain_that_splits(tmp_path, opset):
    """torchvision's CNBlock (dwconv -> Permute -> LayerNorm -> Linear -> GELU -> Linear -> Permute
    -> layer scale) and the LayerNorm2d of its downsampling: no transpose is left, the block is
    channel LayerNorms (at opset 13 from their decomposition into ReduceMean, Sub, Pow, ...),
    1x1 convs with GELU fused; plans by rows and tiles match."""
    import io
    import warnings

    import torch

    module = _convnext_pieces()
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.zeros(1, 3, 32, 24),), buf, dynamo=False, opset_version=opset,
                          input_names=["input"], output_names=["output"])
    path = tmp_path / "convnext.onnx"
    path.write_bytes(buf.getvalue())
    g = tightfit.load(str(path))
    ops = [l.op for l in g.layers]
    assert "transpose" not in ops and all(get_op(op).splittable for op in ops), ops
    assert ops.count("channel_norm") == 3, ops
    assert any(l.attrs.get("act") == (("gelu",),) and l.attrs["kernel"] == (1, 1) for l in g.layers if l.op == "conv")
    x = torch.randn(1, 3, 32, 24)
    with torch.no_grad():
        expected = module(x)
    ref = run_reference(g, x)
    np.testing.assert_allclose(ref[g.outputs[0]], expected, rtol=1e-4, atol=1e-4)
    _assert_plans_match(str(path), g, x, ref)


def test_layernorm_spelled_out_is_one_channel_norm():
    body, inits, opset = CASES["layernorm_decomposed"]
    g = import_model(_model(body, inits, opset=opset), None, "ln")
    assert [l.op for l in g.layers] == ["conv", "channel_norm", "conv"]
    assert g.layers[1].attrs["epsilon"] == pytest.approx(1e-5)


# --- shape arithmetic folded at import -----------------------------------------------------------

def _shape_arithmetic_body() -> tuple[list, dict]:
    """Reshape of a to a target computed from Shape(a) (Gather, Mul, Div, Unsqueeze, Concat), a
    Cast and an Expand of data that change nothing, and an operand made by ConstantOfShape,
    Range, Cast, Expand and Where."""
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    inits = {"i01": i64(0, 1), "i2": np.array(2, np.int64), "i3": np.array(3, np.int64), "two": np.array(2, np.int64),
             "ax0": i64(0), "one1": i64(1), "start": np.array(0, np.int64), "step": np.array(1, np.int64),
             "shape4": i64(1, C, 1, 1), "cond": (np.arange(C) % 2 == 0).reshape(1, C, 1, 1)}
    n = _n
    body = [
        n("Shape", ["a"], "s"), n("Gather", ["s", "i01"], "nc"), n("Gather", ["s", "i2"], "h"), n("Mul", ["h", "two"], "h2"),
        n("Div", ["h2", "two"], "h1"), n("Unsqueeze", ["h1", "ax0"], "hu"), n("Gather", ["s", "i3"], "w"),
        n("Unsqueeze", ["w", "ax0"], "wu"), n("Concat", ["nc", "hu", "wu"], "target", axis=0), n("Reshape", ["a", "target"], "r"),
        n("Cast", ["r"], "rc", to=TensorProto.FLOAT), n("Expand", ["rc", "target"], "re"),
        n("Gather", ["s", "one1"], "c"), n("Concat", ["one1", "c", "one1", "one1"], "cshape", axis=0),
        helper.make_node("ConstantOfShape", ["cshape"], ["quarter"], name="cos",
                         value=numpy_helper.from_array(np.array([0.25], np.float32))),
        n("Squeeze", ["c", "ax0"], "cs"), n("Range", ["start", "cs", "step"], "rng"), n("Cast", ["rng"], "rngf", to=TensorProto.FLOAT),
        n("Reshape", ["rngf", "shape4"], "rng4"), n("Expand", ["quarter", "shape4"], "q4"), n("Where", ["cond", "q4", "rng4"], "k"),
        n("Add", ["re", "k"]),
    ]
    return body, inits


def test_shape_arithmetic_folds_to_constants(tmp_path):
    body, inits = _shape_arithmetic_body()
    model = _model(body, inits, opset=17)
    path = _save(tmp_path, model)
    g = tightfit.load(path)
    assert [l.op for l in g.layers] == ["conv", "reshape", "add", "conv"], [l.op for l in g.layers]
    x = _const((1, 3, H, W), -2.0, 2.0)
    ref = run_reference(g, x)
    expected = _onnxruntime(model, np.asarray(x))[0]
    np.testing.assert_allclose(np.asarray(ref[g.outputs[0]]), expected, rtol=1e-5, atol=1e-5)
    _assert_plans_match(path, g, x, ref)


def test_numpy_folding_semantics():
    from tightfit.frontend.folding import fold

    assert fold("Div", {}, [np.array([-7, 7], np.int64), np.array(2, np.int64)], 17).tolist() == [-3, 3]  # truncates
    assert fold("Range", {}, [np.array(1.0, np.float32), np.array(2.0, np.float32), np.array(0.25, np.float32)], 17).tolist() == \
        [1.0, 1.25, 1.5, 1.75]
    assert fold("Gather", {"axis": 0}, [np.array([5, 6, 7]), np.array(-1)], 17) == 7
    assert fold("Unsqueeze", {"axes": [0, -1]}, [np.ones((2, 3))], 11).shape == (1, 2, 3, 1)
    assert fold("Squeeze", {}, [np.ones((1, 2, 1)), np.array([0])], 13).shape == (2, 1)
    assert fold("ConstantOfShape", {}, [np.array([2, 1])], 17).dtype == np.float32
    assert fold("Cast", {"to": TensorProto.INT64}, [np.array([1.7, -1.7])], 17).tolist() == [1, -1]
    assert fold("NoSuchType", {}, [], 17) is None


# --- validation: one clear error naming the node --------------------------------------------------

@pytest.mark.parametrize("body, inits, message", [
    # over the last axis, any axis and keepdims=0 run since issue 38; over two axes of a map, the batch not
    ([_n("LayerNormalization", ["a", "ln_s"], axis=2)], {"ln_s": _const((H, W))}, "only over the last axis"),
    ([_n("Softmax", ["a"], axis=0)], {}, "only over C"),
    ([_n("ReduceMean", ["a"], axes=[0], keepdims=0)], {}, "batch axis"),
    ([_n("InstanceNormalization", ["a", "a", "a"])], {}, "must be a constant"),
    ([_n("Expand", ["a", "big"])], {"big": np.array([1, C, 2 * H, W], np.int64)}, "only to the shape they have"),
    ([_n("Gelu", ["a"], approximate="erf")], {}, "approximate"),
    ([_n("Sub", ["a", "a"])], {}, "same tensor twice"),
    ([_n("PRelu", ["a", "slope"])], {"slope": _const((2, C, 1, 1))}, "varies over the batch"),
    ([_n("Div", ["a", "k"])], {"k": _const((1, 1, C, H, W))}, "higher rank"),
    ([_n("Cast", ["a"], to=TensorProto.INT32)], {}, "cast of activations"),
], ids=["layernorm_w", "softmax_h", "reducemean_keepdims0", "instancenorm_dynamic", "expand_grows", "gelu_mode",
        "sub_same", "prelu_batch", "div_rank5", "cast_int"])
def test_invalid_nodes_are_one_clear_error(body, inits, message):
    model = _model(body, inits, opset=20)
    with pytest.raises(TightfitError) as err:
        import_model(model, None, "bad")
    text = str(err.value)
    assert message in text and body[-1].name in text, text


def test_operators_doc_lists_every_supported_onnx_type():
    import re

    from tightfit.frontend.onnx_import import supported_onnx_types

    doc = (Path(__file__).parents[1] / "docs" / "operators.md").read_text()
    section = doc.split("## Supported operators", 1)[1].split("\n## ", 1)[0]
    paragraph = next(p for p in section.split("\n\n") if p.startswith("`"))  # the list itself
    listed = set(re.findall(r"`([A-Za-z][A-Za-z0-9]*)`", paragraph))  # ReduceL2
    assert listed == set(supported_onnx_types()), (sorted(set(supported_onnx_types()) - listed), sorted(listed - set(supported_onnx_types())))


def test_unsupported_type_lists_each_supported_type_once():
    with pytest.raises(UnsupportedOpsError) as err:
        import_model(_model([_n("Sin", ["a"])], {}), None, "sin")
    text = str(err.value)
    supported = text.split("supported:")[1].strip().split(", ")
    assert "sin_z" in text and len(supported) == len(set(supported)) and "Gelu" in supported, text


def test_every_registered_op_has_a_c_kernel():
    from tightfit.export.codegen import EMITTERS
    from tightfit.ops import op_names

    assert not set(op_names()) - set(EMITTERS), sorted(set(op_names()) - set(EMITTERS))
