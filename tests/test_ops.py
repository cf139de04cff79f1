"""The op-case table (CASES) and the property tests it drives for every registered op's C kernel.

For each op there is a hypothesis strategy that builds a one-layer case the way the importer
would: a small ONNX model (the op's node, plus any nodes its fused attributes stand for: a crop
Pad in front of a conv, the activation chain behind a host) and the op's own `from_onnx` turning
that node into layer attributes. Every case runs on the kernel library (kernels/tf_kernels.c, the
build the executor loads), bound by kernels/step_args.py exactly as plans and the exported program
bind their steps.

Properties per op:

* the whole-tensor output (channels-first views: the kernels' portable paths) equals onnxruntime's
  on the same ONNX model (ONNX semantics are what we import), to 1e-5 x max abs;
* any region of the output computed into a view of an arena (NaN-filled, channels-first or
  channels-last: the vector paths where the build has them, inputs in either layout) equals the
  same slice of the whole output, writes nothing outside the view and leaves its inputs alone;
  non-splittable ops get sample ranges; ops that may run in place do, over any operand;
* `macs` and `workspace_bytes` are non-negative; conv's darknet workspace is MAFAT eq. 2.1.

A registered op without a case, without a C kernel (a binder) or an activation kind without a
case fails `test_every_op_has_a_case_and_a_kernel`. The default run draws a few examples per op;
`test_kernels_at_length` (slow) draws thousands.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tightfit.kernels.step_args import BINDERS, Bind, Pool, access_view, layer_args
from tightfit.graph.ir import Graph, Layer, Tensor, spatial
from tightfit.ops import WORKSPACE_MODELS, abi, get_op, op_names
from tightfit.runtime.reference import run_layer
from tightfit.ops.base import InputWindow, OnnxNode, Region
from tightfit.plan.schema import Access, Buffer
from tightfit.kernels import library

# --- int8 (issue 40): quantize and dequantize run between fp32 and int8 tensors, which this
# table's float cases do not hold; their cases are tests/test_int8.py's (int8 one-layer models
# against onnxruntime, regions by parts and tiling).
INT8_OPS = ("quantize", "dequantize")
FLOAT_OPS = [n for n in op_names() if n not in INT8_OPS]
# --- end int8 ----------------------------------------------------------------------------------

SETTINGS = dict(
    derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
REGION_EXAMPLES = 25
REFERENCE_EXAMPLES = 20
LONG_EXAMPLES = 1000  # per op, whole and regions: test_kernels_at_length (slow)
RTOL = 1e-5

ort.set_default_logger_severity(3)  # no deprecation chatter (tf_half_pixel_for_nn)


# --- cases ---------------------------------------------------------------------------------

@dataclass
class Case:
    layer: Layer
    inputs: list[np.ndarray]                # whole input arrays, contiguous
    params: list[np.ndarray]                # the layer's parameter arrays, in its order
    model: onnx.ModelProto | None = None    # reference model for onnxruntime
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    ref: object = None                      # a numpy reference where onnxruntime has none

    @property
    def op(self):
        return get_op(self.layer.op)

    @property
    def in_shapes(self) -> list[tuple[int, ...]]:
        return [tuple(x.shape) for x in self.inputs]

    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.op.output_shape(self.layer, self.in_shapes))

    def whole(self) -> np.ndarray:
        out = np.full(self.out_shape(), np.nan, np.float32)
        run_layer(self.layer, list(self.inputs), list(self.params), out)
        return out

    def reference(self) -> np.ndarray:
        if self.ref is not None:
            return self.ref(*self.feeds.values())
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(self.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return sess.run(None, self.feeds)[0]


def _decode_attrs(node: onnx.NodeProto) -> dict:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, TensorProto):
            v = numpy_helper.to_array(v)
        out[a.name] = v
    return out


def _rng(draw) -> np.random.Generator:
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


def _randn(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# Activation chains as layers carry them in attrs["act"], and the ONNX nodes they stand for.
# Parameters are exact in float32 so both sides see the same numbers.
ACTIVATIONS = st.one_of(
    st.just(("relu",)),
    st.sampled_from([0.0625, 0.125, 0.25, 0.5]).map(lambda a: ("leakyrelu", a)),
    st.tuples(st.sampled_from([-1.5, -0.5, 0.0]), st.sampled_from([0.25, 1.0, 6.0])).map(lambda t: ("clip",) + t),
    st.just(("sigmoid",)),
    st.just(("tanh",)),
    st.tuples(st.sampled_from([0.125, 0.25, 0.5]), st.sampled_from([0.25, 0.5, 0.75])).map(lambda t: ("hardsigmoid",) + t),
    st.just(("hardswish",)),
    st.just(("silu",)),
    st.sampled_from([("mish",), ("gelu",), ("gelu_tanh",), ("softplus",), ("sqrt",), ("exp",), ("log",), ("neg",), ("abs",),
                     ("reciprocal",), ("erf",)]),
    st.sampled_from([0.25, 1.0, 1.5]).map(lambda a: ("elu", a)),
    st.tuples(st.sampled_from([1.0, 1.5]), st.sampled_from([0.5, 1.25])).map(lambda t: ("selu",) + t),
)
# Functions defined on part of the line get their input brought into it first (the chain as
# the layer carries it, spelled the same in ONNX): |x| clipped to [0.25, 6] before sqrt, log and
# reciprocal, tanh before exp.
DOMAIN = {"sqrt": (("abs",), ("clip", 0.25, 6.0)), "log": (("abs",), ("clip", 0.25, 6.0)),
          "reciprocal": (("abs",), ("clip", 0.25, 6.0)), "exp": (("tanh",),)}


def _in_domain(chain: tuple) -> tuple:
    return tuple(a for act in chain for a in DOMAIN.get(act[0], ()) + (act,))


CHAINS = st.lists(ACTIVATIONS, min_size=0, max_size=3).map(tuple).map(_in_domain)
ACTIVATION_KINDS = {"relu", "leakyrelu", "clip", "sigmoid", "tanh", "hardsigmoid", "hardswish", "silu", "mish", "gelu",
                    "gelu_tanh", "softplus", "sqrt", "exp", "log", "neg", "abs", "reciprocal", "erf", "elu", "selu"}
# Unary ONNX types that spell an activation of the same name, no attributes.
UNARY_ONNX = {"softplus": "Softplus", "sqrt": "Sqrt", "exp": "Exp", "log": "Log", "neg": "Neg", "abs": "Abs",
              "reciprocal": "Reciprocal", "erf": "Erf"}


def _act_nodes(chain, src: str, prefix: str = "act"):
    """ONNX nodes computing `chain` from tensor `src`; returns (nodes, initializers, output)."""
    nodes, inits, cur = [], {}, src
    for i, (kind, *args) in enumerate(chain):
        out = f"{prefix}{i}"
        if kind == "relu":
            nodes.append(helper.make_node("Relu", [cur], [out]))
        elif kind == "leakyrelu":
            nodes.append(helper.make_node("LeakyRelu", [cur], [out], alpha=args[0]))
        elif kind == "clip":
            lo, hi = f"{out}_lo", f"{out}_hi"
            inits[lo], inits[hi] = np.array(args[0], np.float32), np.array(args[1], np.float32)
            nodes.append(helper.make_node("Clip", [cur, lo, hi], [out]))
        elif kind == "sigmoid":
            nodes.append(helper.make_node("Sigmoid", [cur], [out]))
        elif kind == "tanh":
            nodes.append(helper.make_node("Tanh", [cur], [out]))
        elif kind == "hardsigmoid":
            nodes.append(helper.make_node("HardSigmoid", [cur], [out], alpha=args[0], beta=args[1]))
        elif kind == "hardswish":
            nodes.append(helper.make_node("HardSwish", [cur], [out]))
        elif kind == "silu":
            nodes.append(helper.make_node("Sigmoid", [cur], [out + "_s"]))
            nodes.append(helper.make_node("Mul", [cur, out + "_s"], [out]))
        elif kind in UNARY_ONNX:
            nodes.append(helper.make_node(UNARY_ONNX[kind], [cur], [out]))
        elif kind == "elu":
            nodes.append(helper.make_node("Elu", [cur], [out], alpha=args[0]))
        elif kind == "selu":
            nodes.append(helper.make_node("Selu", [cur], [out], alpha=args[0], gamma=args[1]))
        elif kind == "mish":  # x * tanh(softplus(x)): the Mish node needs opset 18
            nodes.append(helper.make_node("Softplus", [cur], [out + "_sp"]))
            nodes.append(helper.make_node("Tanh", [out + "_sp"], [out + "_t"]))
            nodes.append(helper.make_node("Mul", [cur, out + "_t"], [out]))
        elif kind in ("gelu", "gelu_tanh"):  # decomposed as exporters write it: the Gelu node needs opset 20
            c = {k: f"{out}_{k}" for k in ("half", "one", "a", "b", "three")}
            inits.update({c["half"]: np.array(0.5, np.float32), c["one"]: np.array(1.0, np.float32),
                          c["a"]: np.array(2 ** -0.5 if kind == "gelu" else (2 / np.pi) ** 0.5, np.float32),
                          c["b"]: np.array(0.044715, np.float32), c["three"]: np.array(3.0, np.float32)})
            if kind == "gelu":
                nodes.append(helper.make_node("Mul", [cur, c["a"]], [out + "_u"]))
                nodes.append(helper.make_node("Erf", [out + "_u"], [out + "_e"]))
            else:
                nodes.append(helper.make_node("Pow", [cur, c["three"]], [out + "_p"]))
                nodes.append(helper.make_node("Mul", [out + "_p", c["b"]], [out + "_pb"]))
                nodes.append(helper.make_node("Add", [cur, out + "_pb"], [out + "_s"]))
                nodes.append(helper.make_node("Mul", [out + "_s", c["a"]], [out + "_u"]))
                nodes.append(helper.make_node("Tanh", [out + "_u"], [out + "_e"]))
            nodes.append(helper.make_node("Add", [out + "_e", c["one"]], [out + "_e1"]))
            nodes.append(helper.make_node("Mul", [cur, out + "_e1"], [out + "_m"]))
            nodes.append(helper.make_node("Mul", [out + "_m", c["half"]], [out]))
        else:  # pragma: no cover - a new activation needs its ONNX spelling here
            raise AssertionError(f"no ONNX spelling for activation {kind!r}")
        cur = out
    return nodes, inits, cur


def _model(nodes, inputs: dict[str, np.ndarray], inits: dict[str, np.ndarray], output: str, opset: int) -> onnx.ModelProto:
    if any(nd.op_type == "HardSwish" for nd in nodes):
        opset = max(opset, 14)  # HardSwish is opset 14
    graph = helper.make_graph(
        nodes, "case",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset <= 17 else 9
    return model


def onnx_case(op_name: str, nodes: list, main: int, inputs: dict[str, np.ndarray], inits: dict[str, np.ndarray],
              opset: int = 19, acts=(), layer_inputs=None, overrides=None) -> Case:
    """A case from ONNX nodes; `nodes[main]` is the node the op imports. `acts` are appended to
    the model and to the layer's fused chain. `layer_inputs`/`overrides` stand in for what the
    importer's fusions do (e.g. a crop Pad folded into conv pads)."""
    act_nodes, act_inits, output = _act_nodes(acts, nodes[-1].output[0])
    all_inits = {**inits, **act_inits}
    model = _model(list(nodes) + act_nodes, inputs, all_inits, output, opset)
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {k: tuple(v.shape) for k, v in inputs.items()}
    for vi in inferred.graph.value_info:
        shapes[vi.name] = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    node = nodes[main]
    view = OnnxNode(node.op_type, node.name or "main", _decode_attrs(node), tuple(node.input), tuple(node.output),
                    lambda t: all_inits.get(t), shapes.__getitem__, opset)
    op = get_op(op_name)
    spec = op.from_onnx(view)
    attrs = dict(spec.attrs)
    attrs.update(overrides or {})
    if acts:
        attrs["act"] = tuple(attrs.get("act", ())) + tuple(acts)
    names = layer_inputs if layer_inputs is not None else spec.inputs
    layer = Layer(0, "main", op_name, tuple(names), "y", attrs, tuple(f"p{i}" for i in range(len(spec.params))))
    params = op.prepare_params(layer, spec.params)
    return Case(layer, [inputs[n].copy() for n in names], params, model, dict(inputs))


def _hand_case(op_name: str, attrs: dict, inputs: dict[str, np.ndarray], nodes, output: str, opset: int = 13,
               inits=None) -> Case:
    """A case for ops no ONNX node maps onto directly (activation, channel_shuffle)."""
    model = _model(nodes, inputs, inits or {}, output, opset)
    layer = Layer(0, "main", op_name, tuple(inputs), "y", attrs)
    return Case(layer, [v.copy() for v in inputs.values()], [], model, dict(inputs))


# --- per-op strategies ----------------------------------------------------------------------

@st.composite
def conv_cases(draw):
    rng = _rng(draw)
    n = draw(st.integers(1, 3))
    kind = draw(st.sampled_from(["dense", "groups", "depthwise"]))
    if kind == "dense":
        g, cin, cout = 1, draw(st.integers(1, 4)), draw(st.integers(1, 4))
    elif kind == "groups":
        g = draw(st.integers(2, 3))
        cin, cout = g * draw(st.integers(1, 2)), g * draw(st.integers(1, 2))
    else:
        cin = draw(st.integers(1, 4))
        g, cout = cin, cin * draw(st.integers(1, 2))
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    auto = draw(st.sampled_from(["NOTSET"] * 4 + ["SAME_UPPER", "SAME_LOWER", "VALID"]))
    # onnxruntime supports no dilation with SAME_* auto padding.
    d = (draw(st.integers(1, 3)), draw(st.integers(1, 3))) if not auto.startswith("SAME") else (1, 1)
    ext = [(k[i] - 1) * d[i] + 1 for i in range(2)]
    # Net pad per side (top, left, bottom, right): positive = zero padding, negative = crop by a
    # Pad node the importer folds into the conv. Pads may exceed the kernel extent.
    net = [draw(st.integers(-2, 4)) for _ in range(4)] if auto == "NOTSET" else [0] * 4
    hw = []
    for i in range(2):
        before, after = net[i], net[i + 2]
        crop = max(0, -before) + max(0, -after)
        lo = max(1 + crop, ext[i] - max(0, before) - max(0, after) + crop, 1)
        hw.append(draw(st.integers(lo, lo + 7)))
    x = _randn(rng, (n, cin, hw[0], hw[1]))
    w = _randn(rng, (cout, cin // g, k[0], k[1]))
    inits = {"w": w}
    conv_in = ["x", "w"]
    if draw(st.booleans()):
        inits["b"] = _randn(rng, (cout,))
        conv_in.append("b")
    nodes = []
    src = "x"
    if any(p < 0 for p in net):
        crop = [0, 0] + [min(0, net[0]), min(0, net[1])] + [0, 0] + [min(0, net[2]), min(0, net[3])]
        inits["crop"] = np.array(crop, np.int64)
        nodes.append(helper.make_node("Pad", ["x", "crop"], ["xc"]))
        src = "xc"
        conv_in[0] = "xc"
    kw = dict(kernel_shape=list(k), strides=list(s), dilations=list(d), group=g)
    if auto != "NOTSET":
        kw["auto_pad"] = auto
    else:
        kw["pads"] = [max(0, p) for p in net]
    nodes.append(helper.make_node("Conv", conv_in, ["y0"], **kw))
    acts = draw(CHAINS)
    overrides = {"pads": tuple(net)} if src != "x" else None
    return onnx_case("conv", nodes, len(nodes) - 1, {"x": x}, inits, acts=acts, layer_inputs=["x"], overrides=overrides)


@st.composite
def pool_cases(draw, op_type: str):
    rng = _rng(draw)
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    auto = draw(st.sampled_from(["NOTSET"] * 5 + ["SAME_UPPER", "SAME_LOWER"]))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))  # AveragePool has dilations from opset 19
    if auto != "NOTSET":
        # onnxruntime's pools compute a negative SAME pad (and fail) when stride > kernel.
        d, s = (1, 1), (min(s[0], k[0]), min(s[1], k[1]))
    kw = dict(kernel_shape=list(k), strides=list(s))
    if d != (1, 1):
        kw["dilations"] = list(d)
    # onnxruntime requires pads smaller than the kernel.
    pads = [draw(st.integers(0, k[i % 2] - 1)) for i in range(4)] if auto == "NOTSET" else [0] * 4
    ext = [(k[i] - 1) * d[i] + 1 for i in range(2)]
    hw = [draw(st.integers(max(1, ext[i] - pads[i] - pads[i + 2]), ext[i] + 7)) for i in range(2)]
    if auto == "NOTSET":
        kw["pads"] = pads
        kw["ceil_mode"] = int(draw(st.booleans()))
    else:
        kw["auto_pad"] = auto
    if op_type == "AveragePool":
        kw["count_include_pad"] = int(draw(st.booleans()))
    x = _randn(rng, (n, c, hw[0], hw[1]))
    acts = draw(CHAINS)
    node = helper.make_node(op_type, ["x"], ["y0"], **kw)
    return onnx_case("maxpool" if op_type == "MaxPool" else "avgpool", [node], 0, {"x": x}, {}, acts=acts)


@st.composite
def global_pool_cases(draw):
    rng = _rng(draw)
    x = _randn(rng, (draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 6)), draw(st.integers(1, 6))))
    kind = draw(st.sampled_from(["GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceMax"]))
    inits, opset = {}, 13
    if kind.startswith("Global"):
        node = helper.make_node(kind, ["x"], ["y0"])
    else:
        axes = draw(st.sampled_from([[2, 3], [-1, -2], [3, 2]]))
        keep = int(draw(st.booleans()))
        if draw(st.booleans()):
            node = helper.make_node(kind, ["x"], ["y0"], axes=axes, keepdims=keep)
        else:  # opset 18: axes as an input
            opset = 18
            inits["axes"] = np.array(axes, np.int64)
            node = helper.make_node(kind, ["x", "axes"], ["y0"], keepdims=keep)
    return onnx_case("global_pool", [node], 0, {"x": x}, inits, opset=opset, acts=draw(CHAINS))


def _broadcast_shape(draw, full: tuple[int, ...]) -> tuple[int, ...]:
    """`full` with some of C, H, W (never N) set to 1."""
    if len(full) == 2:
        return draw(st.sampled_from([full, (full[0], 1)]))
    n, c, h, w = full
    return draw(st.sampled_from([full, (n, c, 1, 1), (n, 1, h, w), (n, c, h, 1), (n, 1, 1, w), (n, c, 1, w)]))


@st.composite
def elementwise_cases(draw, op_name: str):
    """Add/Sum of 1-3 data inputs, Mul of 1-2 (ONNX Mul is binary), each maybe with a constant
    operand; operands broadcast over C, H, W (squeeze-excitation (N,C,H,W) * (N,C,1,1))."""
    rng = _rng(draw)
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    full = (n, c) if draw(st.integers(0, 5)) == 0 else (n, c, draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    count = draw(st.integers(1, 3 if op_name == "add" else 2))
    with_const = count == 1 or (op_name == "add" and draw(st.booleans()))
    shapes = [full] + [_broadcast_shape(draw, full) for _ in range(count - 1)]
    if draw(st.booleans()):  # the broadcast operand first: (N,C,1,1) * (N,C,H,W)
        shapes = shapes[::-1]
    inputs = {f"x{i}": _randn(rng, s) for i, s in enumerate(shapes)}
    names = list(inputs)
    inits = {}
    if with_const:  # a bias or scale of any shape that broadcasts into the data
        cshape = _broadcast_shape(draw, (1,) + full[1:])
        cshape = draw(st.sampled_from([cshape, cshape[1:], ()]))
        if count == 1 and draw(st.integers(0, 3)) == 0:  # or the constant is the larger operand
            cshape, inputs = (1,) + full[1:], {"x0": _randn(rng, _broadcast_shape(draw, full))}
        inits["k"] = _randn(rng, cshape)
        names.insert(draw(st.integers(0, len(names))), "k")
    if op_name == "mul":
        onnx_type = "Mul"
    else:
        onnx_type = "Add" if len(names) == 2 and draw(st.booleans()) else "Sum"
    node = helper.make_node(onnx_type, names, ["y0"])
    return onnx_case(op_name, [node], 0, inputs, inits, opset=13, acts=draw(CHAINS))


@st.composite
def concat_cases(draw):
    rng = _rng(draw)
    n = draw(st.integers(1, 3))
    rank2 = draw(st.integers(0, 5)) == 0
    hw = () if rank2 else (draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    axis = 1 if rank2 else draw(st.sampled_from([1, -3, 2, 3, -1]))
    c = draw(st.integers(1, 3))

    def shape() -> tuple[int, ...]:  # along H or W (issue 22) the inputs differ in that dim only
        if axis % 4 == 1:
            return (n, draw(st.integers(1, 3))) + hw
        dims = [n, c, *hw]
        dims[axis % 4] = draw(st.integers(1, 5))
        return tuple(dims)

    inputs = {f"x{i}": _randn(rng, shape()) for i in range(draw(st.integers(1, 3)))}
    node = helper.make_node("Concat", list(inputs), ["y0"], axis=axis)
    return onnx_case("concat", [node], 0, inputs, {}, opset=13, acts=draw(CHAINS))


@st.composite
def gemm_cases(draw):
    rng = _rng(draw)
    n, fout = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    four = draw(st.booleans())
    xshape = (n, draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))) if four else (n, draw(st.integers(1, 8)))
    fin = int(np.prod(xshape[1:]))
    x = _randn(rng, xshape)
    nodes, src, inits = [], "x", {}
    if four:  # Flatten -> Gemm, which the importer fuses into one gemm layer reading the rank-4 x
        nodes.append(helper.make_node("Flatten", ["x"], ["xf"], axis=1))
        src = "xf"
    if not four and draw(st.integers(0, 3)) == 0:
        inits["w"] = _randn(rng, (fin, fout))
        nodes.append(helper.make_node("MatMul", [src, "w"], ["y0"]))
    else:
        trans_b = int(draw(st.booleans()))
        inits["w"] = _randn(rng, (fout, fin) if trans_b else (fin, fout))
        kw = dict(transB=trans_b, alpha=draw(st.sampled_from([1.0, 0.5, 2.0])), beta=draw(st.sampled_from([1.0, 0.25])))
        ins = [src, "w"]
        bias = draw(st.sampled_from([None, (fout,), (1, fout), (), (1,)]))
        if bias is not None:
            inits["b"] = _randn(rng, bias)
            ins.append("b")
        nodes.append(helper.make_node("Gemm", ins, ["y0"], **kw))
    return onnx_case("gemm", nodes, len(nodes) - 1, {"x": x}, inits, opset=13, acts=draw(CHAINS), layer_inputs=["x"])


@st.composite
def softmax_cases(draw):
    rng = _rng(draw)
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    kind = draw(st.sampled_from(["Softmax", "LogSoftmax"]))
    if draw(st.booleans()):  # over C at every pixel (opset 13 on: the axis alone)
        x = _randn(rng, (n, c, draw(st.integers(1, 5)), draw(st.integers(1, 5)))) * 3
        return onnx_case("softmax", [helper.make_node(kind, ["x"], ["y0"], axis=1)], 0, {"x": x}, {}, opset=13)
    four = draw(st.booleans())
    x = _randn(rng, (n, c, 1, 1) if four else (n, c)) * 3
    opset = draw(st.sampled_from([11, 13]))
    axis = draw(st.sampled_from([1, None] if four and opset == 11 else [1] if four else [1, -1, None]))
    kw = {} if axis is None else {"axis": axis}  # opset 11's default axis is 1, opset 13's -1
    return onnx_case("softmax", [helper.make_node(kind, ["x"], ["y0"], **kw)], 0, {"x": x}, {}, opset=opset)


def _bounded(draw, rng, shape, low: float, high: float) -> np.ndarray:
    return rng.uniform(low, high, shape).astype(np.float32)


@st.composite
def eltwise_cases(draw):
    """Sub, Div, Pow, Min, Max, PRelu over 1-3 operands that broadcast into each other, data or
    constant, in any order (a constant first: 1 - x, 6 / x)."""
    rng = _rng(draw)
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    full = (n, c) if draw(st.integers(0, 5)) == 0 else (n, c, draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    onnx_type = draw(st.sampled_from(["Sub", "Div", "Pow", "Min", "Max", "PRelu"]))
    count = draw(st.integers(1, 3)) if onnx_type in ("Min", "Max") else 2
    shapes = [full] + [_broadcast_shape(draw, full) for _ in range(count - 1)]
    if onnx_type != "PRelu" and draw(st.booleans()):
        shapes = shapes[::-1]
    # Divisors and bases away from zero, exponents in [-2, 2]: every value finite.
    def values(position: int, shape) -> np.ndarray:
        low, high = {("Div", True): (0.5, 2.0), ("Pow", False): (0.25, 2.0)}.get((onnx_type, position > 0), (-2.0, 2.0))
        return _bounded(draw, rng, shape, low, high)

    names = [f"x{i}" for i in range(len(shapes))]
    inputs = {name: values(i, s) for i, (name, s) in enumerate(zip(names, shapes))}
    inits = {}
    if count == 2 and draw(st.booleans()) or len(names) == 1:  # one operand a constant, of any broadcasting shape
        k = draw(st.integers(0 if onnx_type != "PRelu" else 1, len(names) - 1)) if len(names) > 1 else 1
        cshape = _broadcast_shape(draw, (1,) + full[1:])
        cshape = draw(st.sampled_from([cshape, cshape[1:], ()]))
        if k < len(names):
            del inputs[names[k]]
            names[k] = "k"
        else:
            names.append("k")
        inits["k"] = values(k, cshape)
        if not inputs:
            return draw(eltwise_cases())
    node = helper.make_node(onnx_type, names, ["y0"])
    return onnx_case("eltwise", [node], 0, inputs, inits, opset=13, acts=draw(CHAINS))


@st.composite
def channel_norm_cases(draw):
    """LayerNormalization over C: of (N, C) or (N, C, 1, 1) as a node of its own, and of
    (N, C, H, W) as the channels-last block ConvNeXt has (Transpose, LayerNorm over the last
    axis, Transpose back), which the importer turns into this op."""
    rng = _rng(draw)
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    eps = draw(st.sampled_from([1e-6, 1e-5, 0.5]))
    inits = {"s": _randn(rng, (c,)), "b": _randn(rng, (c,))}
    acts = draw(CHAINS)
    style = draw(st.sampled_from(["2d", "1x1", "nhwc"]))
    if style != "nhwc":
        x = _randn(rng, (n, c) if style == "2d" else (n, c, 1, 1)) * 3
        if style == "1x1":  # scale and bias broadcast to X.shape[axis:]
            inits = {k: v.reshape(c, 1, 1) for k, v in inits.items()}
        node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y0"], axis=1 if style == "1x1" else -1, epsilon=eps)
        return onnx_case("channel_norm", [node], 0, {"x": x}, inits, opset=17, acts=acts)
    x = _randn(rng, (n, c, draw(st.integers(1, 6)), draw(st.integers(1, 6)))) * 3
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "s", "b"], ["u"], axis=-1, epsilon=eps),
             helper.make_node("Transpose", ["u"], ["y0"], perm=[0, 3, 1, 2])]
    act_nodes, act_inits, out = _act_nodes(acts, "y0")
    model = _model(nodes + act_nodes, {"x": x}, {**inits, **act_inits}, out, 17)
    layer = Layer(0, "main", "channel_norm", ("x",), "y", {"epsilon": eps, "act": acts}, ("p0", "p1"))
    params = get_op("channel_norm").prepare_params(layer, [inits["s"], inits["b"]])
    return Case(layer, [x.copy()], params, model, {"x": x})


@st.composite
def instancenorm_cases(draw):
    rng = _rng(draw)
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    x = _randn(rng, (n, c, draw(st.integers(1, 6)), draw(st.integers(2, 6)))) * 3
    inits = {"s": _randn(rng, (c,)), "b": _randn(rng, (c,))}
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y0"], epsilon=draw(st.sampled_from([1e-5, 0.5])))
    return onnx_case("instancenorm", [node], 0, {"x": x}, inits, opset=13, acts=draw(CHAINS))


@st.composite
def channel_reduce_cases(draw):
    rng = _rng(draw)
    x = _randn(rng, (draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 6))))
    kind = draw(st.sampled_from(["ReduceMean", "ReduceMax"]))
    axes = draw(st.sampled_from([[1], [-3]]))
    if draw(st.booleans()):
        return onnx_case("channel_reduce", [helper.make_node(kind, ["x"], ["y0"], axes=axes, keepdims=1)], 0, {"x": x}, {},
                         opset=13, acts=draw(CHAINS))
    node = helper.make_node(kind, ["x", "axes"], ["y0"], keepdims=1)  # opset 18: axes as an input
    return onnx_case("channel_reduce", [node], 0, {"x": x}, {"axes": np.array(axes, np.int64)}, opset=18, acts=draw(CHAINS))


@st.composite
def batchnorm_cases(draw):
    rng = _rng(draw)
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    shape = (n, c) if draw(st.integers(0, 4)) == 0 else (n, c, draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    inits = {"g": _randn(rng, (c,)), "b": _randn(rng, (c,)), "m": _randn(rng, (c,)),
             "v": (rng.random(c) + 0.1).astype(np.float32)}
    eps = draw(st.sampled_from([1e-5, 1e-3, 0.5]))
    node = helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y0"], epsilon=eps)
    return onnx_case("batchnorm", [node], 0, {"x": _randn(rng, shape)}, inits, opset=15, acts=draw(CHAINS))


@st.composite
def lrn_cases(draw):
    rng = _rng(draw)
    x = _randn(rng, (draw(st.integers(1, 2)), draw(st.integers(1, 7)), draw(st.integers(1, 5)), draw(st.integers(1, 5)))) * 2
    node = helper.make_node("LRN", ["x"], ["y0"], size=draw(st.integers(1, 6)),
                            alpha=draw(st.sampled_from([1e-4, 0.5, 2.0])), beta=draw(st.sampled_from([0.75, 0.5, 1.0])),
                            bias=draw(st.sampled_from([1.0, 2.0, 0.5])))
    case = onnx_case("lrn", [node], 0, {"x": x}, {}, opset=13)
    if _decode_attrs(node)["size"] % 2 == 0:  # onnxruntime takes odd sizes only
        a = _decode_attrs(node)
        case.ref = lambda x: _lrn_spec(x, a["size"], a["alpha"], a["beta"], a["bias"])
    return case


def _lrn_spec(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """ONNX LRN as its spec words it: square_sum over channels
    [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)] (onnx.reference's LRN loops over the
    batch instead of channels, so it is no reference)."""
    x64 = x.astype(np.float64)
    c = x.shape[1]
    sq = np.zeros_like(x64)
    for i in range(c):
        lo, hi = max(0, i - (size - 1) // 2), min(c - 1, i + -(-(size - 1) // 2))
        sq[:, i] = (x64[:, lo : hi + 1] ** 2).sum(axis=1)
    return (x64 / (bias + alpha / size * sq) ** beta).astype(np.float32)


@st.composite
def pad_cases(draw):
    rng = _rng(draw)
    n, c, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 7)), draw(st.integers(1, 7))
    mode = draw(st.sampled_from(["constant", "constant", "reflect", "edge"]))
    if mode == "constant":  # negative = crop, keeping at least one row and column
        t = draw(st.integers(-(h - 1), 3)); b = draw(st.integers(-(h - 1 + min(t, 0)), 3))
        l = draw(st.integers(-(w - 1), 3)); r = draw(st.integers(-(w - 1 + min(l, 0)), 3))
    elif mode == "reflect":
        t, b = draw(st.integers(0, h - 1)), draw(st.integers(0, h - 1))
        l, r = draw(st.integers(0, w - 1)), draw(st.integers(0, w - 1))
    else:
        t, b, l, r = (draw(st.integers(0, 4)) for _ in range(4))
    pads = [0, 0, t, l, 0, 0, b, r]
    x = _randn(rng, (n, c, h, w))
    value = draw(st.sampled_from([0.0, 1.5, -2.0])) if mode == "constant" else 0.0
    style = draw(st.sampled_from(["attrs", "inputs", "axes"]))
    if style == "attrs":  # opset 2: pads and value as attributes
        node = helper.make_node("Pad", ["x"], ["y0"], mode=mode, pads=pads, value=value)
        return onnx_case("pad", [node], 0, {"x": x}, {}, opset=10)
    if style == "axes":  # opset 18: pads for the listed axes only
        axes = draw(st.sampled_from([[2, 3], [-2, -1], [3, 2], [1, 2, 3]]))
        per = {0: (0, 0), 1: (0, 0), 2: (t, b), 3: (l, r)}
        idx = [a % 4 for a in axes]
        inits = {"pads": np.array([per[a][0] for a in idx] + [per[a][1] for a in idx], np.int64),
                 "v": np.array(value, np.float32), "ax": np.array(axes, np.int64)}
        node = helper.make_node("Pad", ["x", "pads", "v", "ax"], ["y0"], mode=mode)
        return onnx_case("pad", [node], 0, {"x": x}, inits, opset=18)
    inits = {"pads": np.array(pads, np.int64), "v": np.array(value, np.float32)}
    node = helper.make_node("Pad", ["x", "pads", "v"], ["y0"], mode=mode)
    return onnx_case("pad", [node], 0, {"x": x}, inits, opset=13)


COORD_MODES = ["asymmetric", "align_corners", "half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn",
               "half_pixel_symmetric"]
NEAREST_MODES = ["floor", "ceil", "round_prefer_floor", "round_prefer_ceil"]


@st.composite
def resize_cases(draw):
    rng = _rng(draw)
    n, c, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 6))
    x = _randn(rng, (n, c, h, w))
    style = draw(st.sampled_from(["scales", "sizes", "opset10", "upsample"]))
    up = st.sampled_from([1.0, 2.0, 3.0])
    scales = [1.0, 1.0, draw(up if style == "upsample" else st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])),
              draw(up if style == "upsample" else st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]))]
    if h * scales[2] < 1:
        scales[2] = 1.0
    if w * scales[3] < 1:
        scales[3] = 1.0
    s_arr = np.array(scales, np.float32)
    if style == "upsample":
        node = helper.make_node("Upsample", ["x", "s"], ["y0"], mode="nearest")
        return onnx_case("resize", [node], 0, {"x": x}, {"s": s_arr}, opset=9)
    if style == "opset10":
        node = helper.make_node("Resize", ["x", "s"], ["y0"], mode="nearest")
        return onnx_case("resize", [node], 0, {"x": x}, {"s": s_arr}, opset=10)
    mode = draw(st.sampled_from(["nearest", "nearest", "linear", "cubic"]))
    kw = dict(mode=mode, coordinate_transformation_mode=draw(st.sampled_from(COORD_MODES)))
    if mode == "nearest":
        kw["nearest_mode"] = draw(st.sampled_from(NEAREST_MODES))
    elif mode == "cubic":
        kw.update(cubic_coeff_a=draw(st.sampled_from([-0.75, -0.5])), exclude_outside=draw(st.sampled_from([0, 1])))
    if kw["coordinate_transformation_mode"] == "half_pixel_symmetric":
        opset_min = 19
    else:
        opset_min = 13
    if draw(st.booleans()):  # opset 18: scales/sizes for the listed axes only
        axes = draw(st.sampled_from([[2, 3], [3, 2], [-2, -1]]))
        idx = [a % 4 for a in axes]
        kw["axes"] = axes
        if style == "sizes":
            sz = {2: draw(st.integers(1, 12)), 3: draw(st.integers(1, 12))}
            node = helper.make_node("Resize", ["x", "", "", "sz"], ["y0"], **kw)
            return onnx_case("resize", [node], 0, {"x": x}, {"sz": np.array([sz[a] for a in idx], np.int64)}, opset=18)
        node = helper.make_node("Resize", ["x", "", "s"], ["y0"], **kw)
        return onnx_case("resize", [node], 0, {"x": x}, {"s": np.array([scales[a] for a in idx], np.float32)}, opset=18)
    if style == "sizes":
        sizes = np.array([n, c, draw(st.integers(1, 12)), draw(st.integers(1, 12))], np.int64)
        node = helper.make_node("Resize", ["x", "", "", "sz"], ["y0"], **kw)
        return onnx_case("resize", [node], 0, {"x": x}, {"sz": sizes}, opset=opset_min)
    node = helper.make_node("Resize", ["x", "", "s"], ["y0"], **kw)
    return onnx_case("resize", [node], 0, {"x": x}, {"s": s_arr}, opset=opset_min)


@st.composite
def flatten_cases(draw):
    rng = _rng(draw)
    x = _randn(rng, (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4))))
    return onnx_case("flatten", [helper.make_node("Flatten", ["x"], ["y0"], axis=1)], 0, {"x": x}, {}, opset=13)


@st.composite
def reshape_cases(draw):
    rng = _rng(draw)
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["Reshape", "Squeeze", "Unsqueeze"]))
    if kind == "Reshape":
        h, w = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        x = _randn(rng, (n, c, h, w))
        target = draw(st.sampled_from([[n, c * h, w], [n, -1], [0, c, h * w], [0, -1, 1, 1], [n, w, c, h]]))
        node = helper.make_node("Reshape", ["x", "t"], ["y0"])
        return onnx_case("reshape", [node], 0, {"x": x}, {"t": np.array(target, np.int64)}, opset=13)
    if kind == "Squeeze":
        x = _randn(rng, (n, c, 1, 1))
        node = helper.make_node("Squeeze", ["x", "a"], ["y0"])
        return onnx_case("reshape", [node], 0, {"x": x}, {"a": np.array(draw(st.sampled_from([[2, 3], [-1, -2]])), np.int64)}, opset=13)
    x = _randn(rng, (n, c))
    node = helper.make_node("Unsqueeze", ["x", "a"], ["y0"])
    return onnx_case("reshape", [node], 0, {"x": x}, {"a": np.array(draw(st.sampled_from([[2, 3], [-1, -2], [1]])), np.int64)}, opset=13)


@st.composite
def transpose_cases(draw):
    rng = _rng(draw)
    x = _randn(rng, (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4))))
    perm = draw(st.sampled_from([[0, 2, 3, 1], [0, 3, 1, 2], [0, 1, 3, 2], [0, 2, 1, 3], [0, 1, 2, 3]]))
    return onnx_case("transpose", [helper.make_node("Transpose", ["x"], ["y0"], perm=perm)], 0, {"x": x}, {}, opset=13)


@st.composite
def channel_shuffle_cases(draw):
    rng = _rng(draw)
    g, k = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    n, h, w = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
    x = _randn(rng, (n, g * k, h, w))
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r1"]),
             helper.make_node("Transpose", ["r1"], ["t"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t", "s2"], ["y0"])]
    inits = {"s1": np.array([n, g, k, h, w], np.int64), "s2": np.array([n, g * k, h, w], np.int64)}
    return _hand_case("channel_shuffle", {"groups": g}, {"x": x}, nodes, "y0", inits=inits)


@st.composite
def conv_transpose_cases(draw):
    rng = _rng(draw)
    n = draw(st.integers(1, 2))
    g = draw(st.sampled_from([1, 1, 2, 3]))
    cin, cog = g * draw(st.integers(1, 2)), draw(st.integers(1, 3))
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    x = _randn(rng, (n, cin, draw(st.integers(1, 5)), draw(st.integers(1, 5))))
    kw = dict(kernel_shape=list(k), strides=list(s), dilations=list(d), group=g)
    ext = [(k[i] - 1) * d[i] + 1 for i in range(2)]
    full = [(x.shape[2 + i] - 1) * s[i] + ext[i] for i in range(2)]
    style = draw(st.sampled_from(["pads", "pads", "SAME_UPPER", "SAME_LOWER", "output_shape"]))
    if style == "pads":  # pads leave at least one output place
        pads = [draw(st.integers(0, 2)) for _ in range(4)]
        kw["pads"] = [min(pads[i], max(0, full[i % 2] - 1 - pads[(i + 2) % 4])) for i in range(4)]
        kw["output_padding"] = [draw(st.integers(0, s[i] - 1)) for i in range(2)]  # onnxruntime: below the stride
    elif style == "output_shape":
        kw["output_shape"] = [draw(st.integers(max(1, full[i] - 2), full[i])) for i in range(2)]
    else:
        kw["auto_pad"] = style
    inits = {"w": _randn(rng, (cin, cog, k[0], k[1]))}
    if draw(st.booleans()):
        inits["b"] = _randn(rng, (cog * g,))
    node = helper.make_node("ConvTranspose", ["x"] + list(inits), ["y0"], **kw)
    return onnx_case("conv_transpose", [node], 0, {"x": x}, inits, opset=13, acts=draw(CHAINS))


@st.composite
def slice_cases(draw):
    rng = _rng(draw)
    x = _randn(rng, (draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 7)), draw(st.integers(1, 7))))
    axes = draw(st.lists(st.sampled_from([1, 2, 3, -1]), min_size=1, max_size=3, unique_by=lambda a: a % 4))
    starts, ends, steps = [], [], []
    for a in axes:
        size = x.shape[a % 4]
        step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
        first = draw(st.integers(0, size - 1))
        count = draw(st.integers(1, len(range(first, size if step > 0 else -1, step))))
        last = first + (count - 1) * step
        # Ends as exporters write them: exact, negative, or clamped (INT64 extremes).
        end = draw(st.sampled_from(["exact", "big"]))
        if end == "big" and step > 0 and first + count * step >= size:
            ends.append(2**62)
        elif step < 0 and last == 0:  # an end of -1 would mean the last place
            ends.append(-(2**62))
        else:
            ends.append(last + (1 if step > 0 else -1))
        starts.append(first - size if draw(st.booleans()) else first)
        steps.append(step)
    inits = {"st": np.array(starts, np.int64), "en": np.array(ends, np.int64), "ax": np.array(axes, np.int64),
             "sp": np.array(steps, np.int64)}
    node = helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y0"])
    return onnx_case("slice", [node], 0, {"x": x}, inits, opset=13)


@st.composite
def depth_space_cases(draw, op_type: str):
    rng = _rng(draw)
    b = draw(st.integers(1, 3))
    n = draw(st.integers(1, 2))
    if op_type == "DepthToSpace":
        shape = (n, b * b * draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4)))
        kw = dict(blocksize=b, mode=draw(st.sampled_from(["DCR", "CRD"])))
    else:
        shape = (n, draw(st.integers(1, 3)), b * draw(st.integers(1, 3)), b * draw(st.integers(1, 3)))
        kw = dict(blocksize=b)
    node = helper.make_node(op_type, ["x"], ["y0"], **kw)
    name = "depth_to_space" if op_type == "DepthToSpace" else "space_to_depth"
    return onnx_case(name, [node], 0, {"x": _randn(rng, shape)}, {}, opset=13)


@st.composite
def activation_cases(draw):
    rng = _rng(draw)
    n = draw(st.integers(1, 3))
    shape = (n, draw(st.integers(1, 8))) if draw(st.integers(0, 4)) == 0 else \
        (n, draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    x = _randn(rng, shape) * 4
    chain = draw(st.lists(ACTIVATIONS, min_size=1, max_size=3).map(tuple).map(_in_domain))
    nodes, inits, out = _act_nodes(chain, "x")
    return _hand_case("activation", {"act": chain}, {"x": x}, nodes, out, inits=inits)


# --- issue 38: attention blocks (ops/attention.py) -------------------------------------------------

@st.composite
def pad_axes_cases(draw):
    """Pad of one or two axes after the batch other than H and W of a map: a channels-last map
    (N, H, W, C) over H and W, tokens (N, T, C), (N, C) over C; constant, edge and reflect."""
    rng = _rng(draw)
    rank = draw(st.integers(2, 4))
    x = _randn(rng, tuple(draw(st.integers(1, 4)) for _ in range(rank)))
    choices = [(1,), (1, 2), (2,)] if rank > 2 else [(1,)]
    axes = draw(st.sampled_from([c for c in choices if c != (2,) or rank == 3] + ([(1, 2), (1, 3)] if rank == 4 else [])))
    mode = draw(st.sampled_from(["constant", "edge", "reflect"]))
    if mode == "reflect" and min(x.shape[a] for a in axes) < 2:
        mode = "constant"
    pads = [0] * (2 * rank)
    for a in axes:
        top = x.shape[a] - 1 if mode == "reflect" else 3
        pads[a], pads[a + rank] = draw(st.integers(0, top)), draw(st.integers(0, top))
    pads[axes[0]] = max(pads[axes[0]], 1)  # axis 1 (C of a map) or a token axis: not the pad op's
    inits = {"p": np.array(pads, np.int64)}
    ins = ["x", "p"]
    if mode == "constant":
        inits["v"] = np.array(draw(st.sampled_from([0.0, 1.5])), np.float32)
        ins.append("v")
    node = helper.make_node("Pad", ins, ["y0"], mode=mode)
    return onnx_case("pad_axes", [node], 0, {"x": x}, inits, opset=13)


@st.composite
def matmul_cases(draw):
    """Two activations of rank 3 or 4, batch dims broadcast (a dim of 1 on either side)."""
    rng = _rng(draw)
    n, m, k, cols = (draw(st.integers(1, 3)) for _ in range(4))
    heads = [] if draw(st.booleans()) else [draw(st.integers(1, 3))]
    a_heads = [draw(st.sampled_from([h, 1])) for h in heads]
    b_heads = [h if a == 1 else draw(st.sampled_from([h, 1])) for h, a in zip(heads, a_heads)]
    a = _randn(rng, (n, *a_heads, m, k * 3))
    b = _randn(rng, (n, *b_heads, k * 3, cols * 2))
    node = helper.make_node("MatMul", ["a", "b"], ["y0"])
    return onnx_case("matmul", [node], 0, {"a": a, "b": b}, {}, opset=13, acts=draw(CHAINS))


@st.composite
def einsum_cases(draw):
    """Einsum as attention writes it, of rank 3 to 5 (windows x heads): either matrix transposed."""
    rng = _rng(draw)
    rank = draw(st.integers(3, 5))
    batch = "bgh"[: rank - 2]
    dims = {c: draw(st.integers(1, 3)) for c in batch + "ijk"}
    a, b = draw(st.sampled_from(["ik", "ki"])), draw(st.sampled_from(["kj", "jk"]))
    eq = f"{batch}{a},{batch}{b}->{batch}ij"
    inputs = {"a": _randn(rng, [dims[c] for c in batch + a]), "b": _randn(rng, [dims[c] for c in batch + b])}
    node = helper.make_node("Einsum", ["a", "b"], ["y0"], equation=eq)
    return onnx_case("matmul", [node], 0, inputs, {}, opset=13, acts=draw(CHAINS))


@st.composite
def high_rank_cases(draw, op_name: str):
    """Add / Mul of rank 5-6 data (windows x heads x tokens: attention scores and their position
    bias), the other operand of 1s over a run of dims (at most 4 dims after merging), data or constant."""
    rng = _rng(draw)
    rank = draw(st.integers(5, 6))
    full = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    a = draw(st.integers(1, rank - 1))
    b = draw(st.integers(a, rank))
    other = tuple(1 if a <= k < b else d for k, d in enumerate(full))
    inputs, inits = {"x0": _randn(rng, full)}, {}
    if draw(st.booleans()):
        inputs["x1"] = _randn(rng, other)
    else:
        inits["k"] = _randn(rng, (1,) + other[1:])
    node = helper.make_node("Add" if op_name == "add" else "Mul", list(inputs) + list(inits), ["y0"])
    return onnx_case(op_name, [node], 0, inputs, inits, opset=13, acts=draw(CHAINS))


@st.composite
def linear_cases(draw):
    """MatMul of data of rank 3-5 by a constant weight: a Linear over the last axis (tokens,
    windows of tokens)."""
    rng = _rng(draw)
    rank = draw(st.integers(3, 5))
    x = _randn(rng, tuple(draw(st.integers(1, 3)) for _ in range(rank - 1)) + (draw(st.integers(1, 20)),))
    w = _randn(rng, (x.shape[-1], draw(st.integers(1, 5))))
    node = helper.make_node("MatMul", ["x", "w"], ["y0"])
    return onnx_case("gemm", [node], 0, {"x": x}, {"w": w}, opset=13, acts=draw(CHAINS))


@st.composite
def softmax_axis_cases(draw):
    rng = _rng(draw)
    rank = draw(st.integers(2, 6))
    x = _randn(rng, tuple(draw(st.integers(1, 5 if rank < 5 else 3)) for _ in range(rank))) * 3
    axis = draw(st.sampled_from([a for a in range(1, rank) if not (rank != 3 and a == 1)] or [1]))
    if rank == 2:
        return draw(softmax_axis_cases())  # over C of (N, C): the softmax op's
    axis = draw(st.sampled_from([axis, axis - rank]))
    kind = draw(st.sampled_from(["Softmax", "LogSoftmax"]))
    return onnx_case("softmax_axis", [helper.make_node(kind, ["x"], ["y0"], axis=axis)], 0, {"x": x}, {}, opset=13)


@st.composite
def layer_norm_cases(draw):
    """LayerNormalization over the last axis of tokens (N, T, C) or of rank-4 data."""
    rng = _rng(draw)
    rank = draw(st.integers(3, 5))
    x = _randn(rng, tuple(draw(st.integers(1, 4)) for _ in range(rank - 1)) + (draw(st.integers(2, 9)),)) * 3
    d = x.shape[-1]
    inits = {"s": _randn(rng, (d,))}
    names = ["x", "s"]
    if draw(st.booleans()):
        inits["b"] = _randn(rng, (d,))
        names.append("b")
    eps = draw(st.sampled_from([1e-6, 1e-5, 0.5]))
    node = helper.make_node("LayerNormalization", names, ["y0"], axis=draw(st.sampled_from([-1, rank - 1])), epsilon=eps)
    return onnx_case("layer_norm", [node], 0, {"x": x}, inits, opset=17, acts=draw(CHAINS))


@st.composite
def reduce_cases(draw):
    """ReduceMean / Sum / Max / L2 over any non-empty set of axes after the batch, keepdims or not;
    axes as the attribute (opset 13; ReduceSum's an input there) or an input (opset 18)."""
    rng = _rng(draw)
    rank = draw(st.integers(2, 6))
    x = _randn(rng, tuple(draw(st.integers(1, 5 if rank <= 4 else 3)) for _ in range(rank)))
    if rank <= 4:
        axes = draw(st.lists(st.integers(1, rank - 1), min_size=1, unique=True))
    else:  # a run of axes (rank 5-6 runs as merged dims), to rank 5-6
        first = draw(st.integers(1, rank - 1))
        axes = list(range(first, draw(st.integers(first + 1, rank))))
    keepdims = 1 if rank - len(axes) < 2 or (rank > 4 and rank - len(axes) <= 4) else draw(st.sampled_from([0, 1]))
    axes = [draw(st.sampled_from([a, a - rank])) for a in axes]
    kind = draw(st.sampled_from(["ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2"]))
    opset = draw(st.sampled_from([13, 18]))
    if opset == 18 or kind == "ReduceSum":
        node = helper.make_node(kind, ["x", "axes"], ["y0"], keepdims=keepdims)
        inits = {"axes": np.array(axes, np.int64)}
    else:
        node, inits = helper.make_node(kind, ["x"], ["y0"], axes=axes, keepdims=keepdims), {}
    return onnx_case("reduce", [node], 0, {"x": x}, inits, opset=opset, acts=draw(CHAINS))


@st.composite
def gather_cases(draw):
    """One constant index (negative too) along an axis after the batch of rank 3-5 data."""
    rng = _rng(draw)
    rank = draw(st.integers(3, 6))
    x = _randn(rng, tuple(draw(st.integers(1, 4 if rank < 6 else 3)) for _ in range(rank)))
    axis = draw(st.integers(1, rank - 1))
    index = draw(st.integers(-x.shape[axis], x.shape[axis] - 1))
    node = helper.make_node("Gather", ["x", "i"], ["y0"], axis=draw(st.sampled_from([axis, axis - rank])))
    return onnx_case("gather", [node], 0, {"x": x}, {"i": np.array(index, np.int64)}, opset=13)


@st.composite
def token_transpose_cases(draw):
    """Transposes of tokens (N, T, C) and of rank-5 data (attention's (N, T, 3, heads, d))."""
    rng = _rng(draw)
    rank = draw(st.sampled_from([3, 5]))
    x = _randn(rng, tuple(draw(st.integers(1, 4)) for _ in range(rank)))
    perm = [0] + list(draw(st.permutations(range(1, rank))))
    return onnx_case("transpose", [helper.make_node("Transpose", ["x"], ["y0"], perm=perm)], 0, {"x": x}, {}, opset=13)


@st.composite
def token_reshape_cases(draw):
    """Maps (N, C, H, W) to tokens (N, C, H W) and back, Squeeze / Unsqueeze between ranks 3 and 4."""
    rng = _rng(draw)
    n, c, h, w = (draw(st.integers(1, 4)) for _ in range(4))
    kind = draw(st.sampled_from(["to tokens", "to map", "Squeeze", "Unsqueeze"]))
    if kind in ("to tokens", "to map"):
        x = _randn(rng, (n, c, h, w) if kind == "to tokens" else (n, c, h * w))
        target = [0, c, -1] if kind == "to tokens" else [0, c, h, w]
        node = helper.make_node("Reshape", ["x", "t"], ["y0"])
        return onnx_case("reshape", [node], 0, {"x": x}, {"t": np.array(target, np.int64)}, opset=13)
    axis = draw(st.integers(1, 3))
    shape = [n, c, h, w]
    shape[axis] = 1
    x = _randn(rng, tuple(shape) if kind == "Squeeze" else tuple(shape[:axis] + shape[axis + 1 :]))
    node = helper.make_node(kind, ["x", "a"], ["y0"])
    return onnx_case("reshape", [node], 0, {"x": x}, {"a": np.array([draw(st.sampled_from([axis, axis - 4]))], np.int64)},
                     opset=13)


CASES = {
    "conv": conv_cases(),
    "maxpool": pool_cases("MaxPool"),
    "avgpool": pool_cases("AveragePool"),
    "global_pool": global_pool_cases(),
    "add": st.one_of(elementwise_cases("add"), high_rank_cases("add")),  # (rank 5-6: issue 38)
    "mul": st.one_of(elementwise_cases("mul"), high_rank_cases("mul")),
    "concat": concat_cases(),
    "gemm": st.one_of(gemm_cases(), linear_cases()),  # (over the last axis: issue 38)
    "softmax": softmax_cases(),
    "batchnorm": batchnorm_cases(),
    "lrn": lrn_cases(),
    "pad": pad_cases(),
    "resize": resize_cases(),
    "flatten": flatten_cases(),
    "reshape": st.one_of(reshape_cases(), token_reshape_cases()),  # (tokens: issue 38)
    "transpose": st.one_of(transpose_cases(), token_transpose_cases()),
    "channel_shuffle": channel_shuffle_cases(),
    "activation": activation_cases(),
    # issue 22: spatial and structural ops
    "conv_transpose": conv_transpose_cases(),
    "slice": slice_cases(),
    "depth_to_space": depth_space_cases("DepthToSpace"),
    "space_to_depth": depth_space_cases("SpaceToDepth"),
    "eltwise": eltwise_cases(),
    "channel_norm": channel_norm_cases(),
    "instancenorm": instancenorm_cases(),
    "channel_reduce": channel_reduce_cases(),
    # issue 38: attention blocks
    "matmul": st.one_of(matmul_cases(), einsum_cases()),
    "softmax_axis": softmax_axis_cases(),
    "layer_norm": layer_norm_cases(),
    "reduce": reduce_cases(),
    "gather": gather_cases(),
    "pad_axes": pad_axes_cases(),
}


def _case_strategy(op_name: str):
    if op_name not in CASES:
        pytest.fail(f"op {op_name!r} has no case in tests/test_ops.py::CASES; add one")
    return CASES[op_name]


# --- helpers ---------------------------------------------------------------------------------

def _tol(expected: np.ndarray) -> dict:
    finite = expected[np.isfinite(expected)]
    top = float(np.abs(finite).max()) if finite.size else 0.0
    return dict(rtol=RTOL, atol=max(1e-5 * top, 1e-30))


def _close(got: np.ndarray, want: np.ndarray, tol_from: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(got, want, **_tol(tol_from), equal_nan=False, err_msg=what)


@st.composite
def regions(draw, shape: tuple[int, ...], splittable: bool | str):
    """A region of an output of `shape`: any sample range; rows and columns too when splittable,
    rows alone (every column) when "rows" (an op over the last axis of rank-4 data), biased to hit borders (first/last rows) as well as the interior."""
    def span(size: int) -> tuple[int, int]:
        style = draw(st.sampled_from(["any", "first", "last", "one", "whole"]))
        if style == "whole":
            return 0, size
        if style == "first":
            return 0, draw(st.integers(1, size))
        if style == "last":
            return draw(st.integers(0, size - 1)), size
        if style == "one":
            i = draw(st.integers(0, size - 1))
            return i, i + 1
        a = draw(st.integers(0, size - 1))
        return a, draw(st.integers(a + 1, size))

    n0, n1 = span(shape[0])
    h, w = spatial(shape)
    if not splittable:
        return Region(n0, n1, 0, h, 0, w)
    h0, h1 = span(h)
    w0, w1 = span(w) if splittable != "rows" else (0, w)
    return Region(n0, n1, h0, h1, w0, w1)


def _check_window_bounds(windows: tuple[InputWindow, ...], in_shapes) -> None:
    for win, shape in zip(windows, in_shapes):
        r = win.region
        h, w = spatial(shape)
        assert 0 <= r.n0 <= r.n1 <= shape[0], (win, shape)
        assert 0 <= r.h0 <= r.h1 <= h and 0 <= r.w0 <= r.w1 <= w, (win, shape)
        assert all(p >= 0 for p in win.pad), (win, shape)


def _strides(shape: tuple[int, ...], fmt: str) -> tuple[int, ...]:
    """Element strides of a buffer of `shape` in `fmt` (channels-last only for rank 4)."""
    if len(shape) == 4 and fmt == "channels_last":
        _, c, h, w = shape
        return (h * w * c, 1, w * c, c)
    return tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))


class _Arena:
    """Buffers of given shapes and formats laid out one after another in one float32 arena (NaN
    first), as a plan places them; `array(i)` views buffer i in its logical shape."""

    def __init__(self, shapes_fmts: list[tuple[tuple[int, ...], str]]):
        self.buffers, at = [], 0
        for i, (shape, fmt) in enumerate(shapes_fmts):
            self.buffers.append(Buffer(i, "whole", tuple(shape), "nhwc" if len(shape) == 4 and fmt == "channels_last" else "nchw", (at * 4,)))
            at += -(-int(np.prod(shape)) // 16) * 16 + 16
        self.data = np.full(at, np.nan, np.float32)

    def array(self, i: int) -> np.ndarray:
        b = self.buffers[i]
        strides = _strides(b.shape, "channels_last" if b.layout == "nhwc" else "contiguous")
        return np.lib.stride_tricks.as_strided(self.data[b.offsets[0] // 4 :], b.shape, tuple(4 * s for s in strides))

    def view(self, i: int, tensor_shape, region: Region):
        return access_view(self.buffers[i], Access("t", i, region, (region.n0, region.h0, region.w0)), 0, tensor_shape)


def _run_step(case: Case, region: Region, arena: _Arena, ins: list[int], out: int) -> None:
    """The kernel call of `region` of the case's layer, its input windows read from buffers `ins`
    of `arena` and its output written to buffer `out` there (at the region's place)."""
    layer, in_shapes = case.layer, case.in_shapes
    out_shape = case.out_shape()
    names = list(dict.fromkeys(layer.inputs))
    tensors = {t: Tensor(t, s) for t, s in zip(layer.inputs, in_shapes)} | {layer.output: Tensor(layer.output, out_shape)}
    graph = Graph("case", (layer,), tensors, tuple(names), (layer.output,), dict(zip(layer.params, case.params)))
    windows = case.op.input_windows(layer, region, in_shapes)
    _check_window_bounds(windows, in_shapes)
    xs = [arena.view(i, s, w.region) for i, s, w in zip(ins, in_shapes, windows)]
    y = arena.view(out, out_shape, region)
    weights, indices = Pool(np.float32), Pool(np.int32)
    args = layer_args(Bind(graph, region, out_shape[0], 0, weights, indices), layer, xs, y)
    table, w, idx = library.StepTable([args]), weights.array(), indices.array()
    library.library().tf_run(arena.data.ctypes.data, w.ctypes.data, idx.ctypes.data, table.address, 1, None, None, 1)


def _compute_region(case: Case, region: Region, whole: np.ndarray, fmt_in: str, fmt_out: str) -> None:
    layer, out_shape = case.layer, tuple(whole.shape)
    arena = _Arena([(x.shape, fmt_in) for x in case.inputs] + [(out_shape, fmt_out)])
    for i, x in enumerate(case.inputs):
        arena.array(i)[...] = x
    out = len(case.inputs)
    _run_step(case, region, arena, list(range(out)), out)
    buf = arena.array(out)
    what = f"{layer.op} region {region} ({fmt_in} -> {fmt_out}) attrs {dict(layer.attrs)}"
    _close(region.slice(buf), region.slice(whole), whole, what)
    outside = np.ones(out_shape, dtype=bool)
    region.slice(outside)[...] = False
    assert np.isnan(buf[outside]).all(), f"{layer.op} wrote outside region {region}"
    for i, x in enumerate(case.inputs):
        assert np.array_equal(arena.array(i), x), f"{layer.op} modified its input"


def _compute_inplace(case: Case, region: Region, whole: np.ndarray, over: int = 0, fmt: str = "contiguous") -> None:
    """An inplace_ok op computing its output over its input `over` (for add and mul, any input
    of the output's shape: a planner may reuse either operand's buffer)."""
    arena = _Arena([(x.shape, fmt) for x in case.inputs])
    for i, x in enumerate(case.inputs):
        arena.array(i)[...] = x
    _run_step(case, region, arena, list(range(len(case.inputs))), over)
    _close(region.slice(arena.array(over)), region.slice(whole), whole, f"{case.layer.op} in place over input {over}")


# --- the tests ---------------------------------------------------------------------------------

def test_every_op_has_a_case_and_a_kernel():
    missing = sorted(set(FLOAT_OPS) - set(CASES))
    assert not missing, f"ops without a property-test case: {missing}"
    assert not set(CASES) - set(op_names()), "cases for ops that are not registered"
    no_kernel = sorted(set(op_names()) - set(BINDERS))
    assert not no_kernel, f"ops without a C kernel (a binder in kernels/step_args.py): {no_kernel}"
    no_cost = sorted(n for n in op_names() if not callable(getattr(get_op(n), "macs", None)))
    assert not no_cost, f"ops without a cost: {no_cost}"
    kinds = set(abi.ACT_NAMES)
    assert kinds == ACTIVATION_KINDS, f"activations without a case in ACTIVATIONS: {kinds - ACTIVATION_KINDS}"


@pytest.mark.parametrize("op_name", FLOAT_OPS)
@settings(max_examples=REFERENCE_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_whole_matches_onnxruntime(op_name, data):
    case = data.draw(_case_strategy(op_name))
    assert case.layer.op == op_name
    whole = case.whole()
    ref = case.reference()
    assert tuple(whole.shape) == ref.shape, f"{op_name}: shape {tuple(whole.shape)} but onnxruntime gives {ref.shape}"
    _close(whole, ref, ref, f"{op_name} attrs {dict(case.layer.attrs)} in {case.in_shapes}")


@pytest.mark.parametrize("op_name", FLOAT_OPS)
@settings(max_examples=REGION_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_region_equals_slice_of_whole(op_name, data):
    _region_property(op_name, data)


def _region_property(op_name, data) -> None:
    case = data.draw(_case_strategy(op_name))
    op = case.op
    whole = case.whole()
    assert not np.isnan(whole).any(), f"{op_name}: whole output has NaN (not all written?)"
    formats = st.sampled_from(["contiguous", "channels_last"])
    split = op.splittable or ("rows" if op.splits_rows(case.layer, case.in_shapes, tuple(whole.shape)) else False)
    for _ in range(3):
        region = data.draw(regions(tuple(whole.shape), split))
        _compute_region(case, region, whole, data.draw(formats), data.draw(formats))
    if op.inplace_ok:
        same = [i for i, s in enumerate(case.in_shapes) if s == tuple(whole.shape)]
        any_input = op_name in ("add", "mul", "eltwise")  # the planner may reuse any operand's buffer
        if same and (same[0] == 0 or any_input):
            over = data.draw(st.sampled_from(same)) if any_input else 0
            _compute_inplace(case, data.draw(regions(tuple(whole.shape), split)), whole, over, data.draw(formats))


@pytest.mark.slow
@pytest.mark.parametrize("op_name", FLOAT_OPS)
@settings(max_examples=LONG_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_kernels_at_length(op_name, data):
    """Thousands of drawn attribute sets per op: the whole output against onnxruntime, then
    regions against the whole."""
    case = data.draw(_case_strategy(op_name))
    whole, ref = case.whole(), case.reference()
    _close(whole, ref, ref, f"{op_name} attrs {dict(case.layer.attrs)} in {case.in_shapes}")
    _region_property(op_name, data)


@pytest.mark.parametrize("op_name", FLOAT_OPS)
@settings(max_examples=15, **SETTINGS)
@given(data=st.data())
def test_costs_are_non_negative(op_name, data):
    case = data.draw(_case_strategy(op_name))
    op, layer = case.op, case.layer
    out_shape = case.out_shape()
    region = data.draw(regions(out_shape, op.splittable))
    assert op.macs(layer, region, case.in_shapes, out_shape) >= 0
    for model in WORKSPACE_MODELS:
        for itemsize in (1, 2, 4):
            ws = op.workspace_bytes(layer, region, case.in_shapes, out_shape, itemsize, model=model)
            assert isinstance(ws, int) and ws >= 0, (model, ws)
    assert op.workspace_bytes(layer, region, case.in_shapes, out_shape, 4, model="none") == 0


@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_conv_costs(data):
    case = data.draw(conv_cases())
    op, layer = case.op, case.layer
    out_shape = case.out_shape()
    n, cout, oh, ow = out_shape
    cin = case.in_shapes[0][1]
    kh, kw = layer.attrs["kernel"]
    g = layer.attrs["groups"]
    whole = Region.whole(out_shape)
    assert op.macs(layer, whole, case.in_shapes, out_shape) == n * cout * oh * ow * (cin // g) * kh * kw
    region = data.draw(regions(out_shape, True))
    itemsize = data.draw(st.sampled_from([1, 2, 4]))
    # MAFAT eq. 2.1: scratch = w * h * f^2 * c / s (output w, h; per group for grouped convs).
    exact = region.n * region.w * region.h * kh * kw * (cin // g) * itemsize / layer.attrs["stride"][0]
    got = op.workspace_bytes(layer, region, case.in_shapes, out_shape, itemsize, model="darknet")
    assert exact - itemsize < got <= exact


def test_conv_darknet_workspace_matches_mafat_table():
    """MAFAT Table 2.1, YOLOv2 layers 0 and 2 (3x3, stride 1): 38.07 and 101.53 MiB of scratch."""
    conv = get_op("conv")
    for (cin, cout, hw), mib in (((3, 32, 608), 38.07), ((32, 64, 304), 101.53)):
        layer = Layer(0, "c", "conv", ("x",), "y", {"kernel": (3, 3), "stride": (1, 1), "dilation": (1, 1),
                                                     "pads": (1, 1, 1, 1), "groups": 1, "out_channels": cout, "act": ()})
        in_shape = (1, cin, hw, hw)
        out_shape = conv.output_shape(layer, [in_shape])
        ws = conv.workspace_bytes(layer, Region.whole(out_shape), [in_shape], out_shape, 4, model="darknet")
        assert round(ws / 2**20, 2) == mib


def _fixed_conv_case(x_shape, kernel, stride, pads, dilation=(1, 1)) -> Case:
    rng = np.random.default_rng(0)
    x = _randn(rng, x_shape)
    w = _randn(rng, (2, x_shape[1]) + tuple(kernel))
    node = helper.make_node("Conv", ["x", "w"], ["y0"], kernel_shape=list(kernel), strides=list(stride),
                            dilations=list(dilation), pads=[max(0, p) for p in pads])
    return onnx_case("conv", [node], 0, {"x": x}, {"w": w})


@pytest.mark.parametrize("x_shape,kernel,stride,pads", [
    ((1, 1, 1, 2), (1, 1), (1, 2), (0, 1, 0, 0)),   # output column 0 reads only the left pad
    ((2, 3, 3, 3), (1, 1), (1, 1), (3, 3, 3, 3)),   # pads wider than the kernel on every side
    ((1, 2, 4, 5), (2, 2), (2, 2), (4, 0, 0, 4)),   # whole rows/cols of padding at a corner
])
def test_windows_wholly_in_padding(x_shape, kernel, stride, pads):
    """Regression: a window lying wholly in the padding reads the empty span, not a negative
    slice (base.window_1d), and the conv kernel handles an empty input window."""
    case = _fixed_conv_case(x_shape, kernel, stride, pads)
    whole = case.whole()
    _close(whole, case.reference(), whole, "conv")
    n, _, oh, ow = whole.shape
    for h0 in range(oh):
        for w0 in range(ow):
            for fmt in ("contiguous", "channels_last"):
                _compute_region(case, Region(0, n, h0, h0 + 1, w0, w0 + 1), whole, fmt, fmt)
                _compute_region(case, Region(0, n, h0, oh, 0, w0 + 1), whole, fmt, fmt)


def test_constant_pad_region_wholly_in_padding():
    rng = np.random.default_rng(1)
    x = _randn(rng, (1, 2, 2, 3))
    node = helper.make_node("Pad", ["x", "p", "v"], ["y0"], mode="constant")
    case = onnx_case("pad", [node], 0, {"x": x}, {"p": np.array([0, 0, 3, 1, 0, 0, 2, 4], np.int64),
                                                  "v": np.array(1.5, np.float32)}, opset=13)
    whole = case.whole()
    _close(whole, case.reference(), whole, case.layer.op)
    for region in (Region(0, 1, 0, 3, 0, 8), Region(0, 1, 5, 7, 0, 1), Region(0, 1, 0, 1, 4, 8)):
        _compute_region(case, region, whole, "contiguous", "channels_last")


def test_identity_average_pool_is_a_copy_with_no_scratch():
    """torchvision's VGG exports its adaptive pool at the input size: a 1x1 AveragePool, stride 1,
    which runs as a copy into the output view (no temporary: workspace 0)."""
    rng = np.random.default_rng(2)
    node = helper.make_node("AveragePool", ["x"], ["y0"], kernel_shape=[1, 1], strides=[1, 1])
    case = onnx_case("avgpool", [node], 0, {"x": _randn(rng, (2, 3, 5, 4))}, {})
    whole = case.whole()
    _close(whole, case.reference(), whole, case.layer.op)
    out_shape = case.out_shape()
    for region in (Region.whole(out_shape), Region(0, 2, 1, 3, 0, 4)):
        assert case.op.workspace_bytes(case.layer, region, case.in_shapes, out_shape, 4) == 0
        _compute_region(case, region, whole, "channels_last", "channels_last")
