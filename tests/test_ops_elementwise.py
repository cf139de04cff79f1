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
import torch
from onnx import TensorProto, helper, numpy_helper

import tightfit
from tightfit.errors import TightfitError, UnsupportedOpsError
from tightfit.frontend.onnx_import import import_model
from tightfit.ops import get_op
from tightfit.plan.check import check_plan
from tightfit.runtime.executor import ArenaExecutor
from tightfit.runtime.reference import run_reference
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


def _assert_plans_match(path: str, g, x: torch.Tensor, ref: dict) -> None:
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
    x = torch.from_numpy(_const((1, 3, H, W), -2.0, 2.0))
    ref = run_reference(g, x)
    expected = _onnxruntime(model, x.numpy())[0]
    got = ref[g.outputs[0]].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(expected).max())))
    _assert_plans_match(path, g, x, ref)
