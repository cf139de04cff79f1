"""Every zoo model imports, runs in the reference executor and matches an independent runtime.

DESIGN.md invariant 1 for the foundation: the executor's pre-softmax logits and one tensor about
halfway through the layers match the torch module (torchvision models) or onnxruntime on the
same ONNX bytes, within max abs diff <= 1e-4 x max abs value of the reference; the logits' std
must be > 1e-3 so that the random weights do not make the check trivial.

The table models and the ONNX zoo's are built without PyTorch (test_tables_need_no_torch).
"""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

from tightfit.frontend import zoo
from tightfit.frontend.onnx_import import import_model
from tightfit.reference import run_reference
from tightfit.runtime.reference import random_input

RTOL = 1e-4

REQUIRED = [
    "resnet18", "resnet50", "mobilenet_v2", "googlenet", "squeezenet1_0", "densenet121", "vgg19",
    "efficientnet_b0", "inception_v3", "mobilenet_v3_small", "yolov2-16", "tiny-yolov2",
    "mobilenet_v1", "mobilenet_v1_025", "minakova5",
] + [f"onnxzoo-{n}" for n in ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                              "shufflenet", "squeezenet", "vgg19", "zfnet512")]


# --- helpers -------------------------------------------------------------------------------

def diff_ratio(got, ref) -> float:
    """max |got - ref| / max |ref| (float64)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.isfinite(got).all() and np.isfinite(ref).all()
    scale = float(np.abs(ref).max())
    assert scale > 0, "reference is all zeros"
    return float(np.abs(got - ref).max()) / scale


def prune(model: onnx.ModelProto, outputs: list[str]) -> onnx.ModelProto:
    """Cut `model` in place down to what computes `outputs`, which become its graph outputs
    (onnxruntime then loads only the weights it needs: VGG-19's dense layers are 86% of its
    bytes). Weights are not copied."""
    g = model.graph
    need = set(outputs)
    nodes = []
    for node in reversed(g.node):
        if any(o in need for o in node.output):
            nodes.append(node)
            need.update(i for i in node.input if i)
    if len(nodes) < len(g.node):
        nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for n in reversed(nodes)]
        del g.node[:]
        g.node.extend(nodes)
        for i in reversed(range(len(g.initializer))):
            if g.initializer[i].name not in need:
                del g.initializer[i]
        kept = [i for i in g.input if i.name in need]
        del g.input[:]
        g.input.extend(kept)
    del g.output[:]
    g.output.extend(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None) for t in outputs)
    return model


def onnxruntime_run(model_bytes: bytes, x: np.ndarray, outputs: list[str]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    model = prune(onnx.load_from_string(model_bytes), list(dict.fromkeys(outputs)))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, {sess.get_inputs()[0].name: x})))


def probe_tensors(graph) -> tuple[str, str]:
    """(pre-softmax logits, a layer output about halfway through the layers)."""
    last = graph.layers[-1]
    logits = last.inputs[0] if last.op == "softmax" else graph.outputs[0]
    mid = graph.layers[len(graph.layers) // 2].output
    return logits, mid


# --- the zoo lists what the issue requires ----------------------------------------------------

def test_zoo_lists_every_required_model():
    names = zoo.names()
    assert not [n for n in REQUIRED if n not in names]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name", [pytest.param(e.name, marks=[pytest.mark.requires_torch] if e.source == "torchvision" else [])
                                  for e in zoo.entries()])
def test_zoo_model_matches_reference(name):
    graph = zoo.load(name)
    assert zoo.load(name) is graph  # cached: tests and tools import each model many times
    x = random_input(graph, seed=0)
    logits, mid = probe_tensors(graph)
    ours = run_reference(graph, x, keep=[logits, mid])
    torch_sourced = name in zoo.TORCHVISION

    # A mid-network tensor (and for ONNX-only models the logits) against onnxruntime on the same
    # ONNX bytes. Tensor names in the graph are the ONNX model's: a fused layer's output is its
    # last node's output.
    wanted = [mid] if torch_sourced else [mid, logits]
    ort_out = onnxruntime_run(zoo.onnx_model(name), np.asarray(x), wanted)
    for t in wanted:
        r = diff_ratio(ours[t], ort_out[t])
        assert r <= RTOL, f"{name}: {t} differs from onnxruntime by {r:.2e} x max abs"

    if torch_sourced:
        from tightfit.frontend.torch_import import run_module

        expected = run_module(zoo.torch_module(name), np.asarray(x))
        r = diff_ratio(ours[graph.outputs[0]], expected)
        assert r <= RTOL, f"{name}: output differs from the torch module by {r:.2e} x max abs"

    std = float(np.asarray(ours[logits], dtype=np.float64).std())
    assert std > 1e-3 and math.isfinite(std), f"{name}: logits std {std} (weights make the check trivial)"


# --- the ONNX zoo's placeholder weights are re-drawn -------------------------------------------

@pytest.mark.parametrize("name", zoo.ONNXZOO)
def test_randomize_onnx_replaces_placeholder_weights(name):
    from onnx import numpy_helper

    original = onnx.load(zoo._onnxzoo_path(name))
    assert any(n.op_type == "ConstantOfShape" for n in original.graph.node)  # what the wheel ships
    model = onnx.load_from_string(zoo.onnx_model(f"onnxzoo-{name}"))
    assert not [n.name for n in model.graph.node if n.op_type == "ConstantOfShape"]
    onnx.checker.check_model(model)
    before = {i.name: numpy_helper.to_array(i) for i in original.graph.initializer}
    floats = 0
    for init in model.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype.kind != "f":
            continue
        floats += 1
        assert np.isfinite(a).all(), init.name
        if a.size > 1:
            assert np.ptp(a) > 0, f"{init.name} is still a constant placeholder"
        if init.name in before and a.size > 1:
            assert not np.array_equal(a, before[init.name]), f"{init.name} was not re-drawn"
    assert floats > 0


def test_randomize_onnx_is_seeded():
    path = zoo._onnxzoo_path("squeezenet")
    a = zoo.randomize_onnx(onnx.load(path)).SerializeToString()
    b = zoo.randomize_onnx(onnx.load(path)).SerializeToString()
    c = zoo.randomize_onnx(onnx.load(path), seed=zoo.SEED + 1).SerializeToString()
    assert a == b and a != c


# --- layer tables from the papers -------------------------------------------------------------

def test_minakova5_layers():
    """Minakova & Stefanov Fig. 1: n2 17x17 conv to 16x16x4, n3 5x5 stride-3 conv after a crop of
    one pixel on every side (pads -1) to 4x4x3, n4 4x4 conv to 1x1x2."""
    g = zoo.load("minakova5")
    assert [layer.op for layer in g.layers] == ["conv", "conv", "conv"]
    assert [g.shape(layer.output) for layer in g.layers] == [(1, 4, 16, 16), (1, 3, 4, 4), (1, 2, 1, 1)]
    assert [layer.attrs["kernel"] for layer in g.layers] == [(17, 17), (5, 5), (4, 4)]
    assert [layer.attrs["stride"] for layer in g.layers] == [(1, 1), (3, 3), (1, 1)]
    assert [layer.attrs["pads"] for layer in g.layers] == [(0, 0, 0, 0), (-1, -1, -1, -1), (0, 0, 0, 0)]
    assert g.shape(g.inputs[0]) == (1, 1, 32, 32)


# MAFAT Table 2.1: layer, type, input dims (W x H x C), weight bytes, output MB (MiB).
MAFAT_TABLE_2_1 = [
    (0, "conv", (608, 608, 3), 3456, 45.13),
    (1, "maxpool", (608, 608, 32), 0, 11.28),
    (2, "conv", (304, 304, 32), 73728, 22.56),
    (3, "maxpool", (304, 304, 64), 0, 5.64),
    (4, "conv", (152, 152, 64), 294912, 11.28),
    (5, "conv", (152, 152, 128), 32768, 5.64),
    (6, "conv", (152, 152, 64), 294912, 11.28),
    (7, "maxpool", (152, 152, 128), 0, 2.82),
    (8, "conv", (76, 76, 128), 1179648, 5.64),
    (9, "conv", (76, 76, 256), 131072, 2.82),
    (10, "conv", (76, 76, 128), 1179648, 5.64),
    (11, "maxpool", (76, 76, 256), 0, 1.41),
    (12, "conv", (38, 38, 256), 4718592, 2.82),  # the paper prints 4717872, a typo: 3*3*256*512*4
    (13, "conv", (38, 38, 512), 524288, 1.41),
    (14, "conv", (38, 38, 256), 4718592, 2.82),
    (15, "conv", (38, 38, 512), 524288, 1.41),
]


def test_yolov2_16_matches_mafat_table_2_1():
    g = zoo.load("yolov2-16")
    assert len(g.layers) == 16
    assert [layer.op for layer in g.layers] == [row[1] for row in MAFAT_TABLE_2_1]
    # Each layer's input is the table's "Dimensions"; its output is the next row's (608x608x32
    # after conv 0, 304x304x32 after max 1, ...), ending at 38x38x256.
    dims = [row[2] for row in MAFAT_TABLE_2_1] + [(38, 38, 256)]
    for layer, (i, _, _, weight_bytes, out_mib) in zip(g.layers, MAFAT_TABLE_2_1):
        w, h, c = dims[i]
        assert g.shape(layer.inputs[0]) == (1, c, h, w), f"layer {i} input"
        w, h, c = dims[i + 1]
        assert g.shape(layer.output) == (1, c, h, w), f"layer {i} output"
        assert abs(g.tensors[layer.output].nbytes("fp32") / 2**20 - out_mib) <= 0.005 + 1e-9, f"layer {i} output MiB"
        kernel = g.params[layer.params[0]].size * 4 if layer.op == "conv" else 0
        assert kernel == weight_bytes, f"layer {i} weights"
        if layer.op == "conv":
            # conv + batch norm + leaky ReLU are one layer, as the paper counts them
            assert layer.attrs["act"] == (("leakyrelu", pytest.approx(0.1)),)
        else:
            assert layer.attrs["kernel"] == (2, 2) and layer.attrs["stride"] == (2, 2)


# --- caching ---------------------------------------------------------------------------------

def test_load_cache_keys_on_shape():
    a = zoo.load("minakova5")
    b = zoo.load("minakova5", (2, 1, 32, 32))
    assert b is not a and b.shape(b.inputs[0]) == (2, 1, 32, 32)
    assert zoo.load("minakova5", [2, 1, 32, 32]) is b
    assert [b.shape(l.output)[1:] for l in b.layers] == [a.shape(l.output)[1:] for l in a.layers]


def test_onnxzoo_batch_is_free():
    """ShuffleNet's reshapes spell batch 1 into their targets; at batch 2 each sample still
    computes what it computes alone."""
    one = zoo.load("onnxzoo-shufflenet")
    two = zoo.load("onnxzoo-shufflenet", (2, 3, 224, 224))
    assert [l.op for l in two.layers] == [l.op for l in one.layers]
    assert sum(l.op == "channel_shuffle" for l in two.layers) == 16
    x = random_input(two, seed=2)
    both = run_reference(two, x)[two.outputs[0]]
    assert both.shape == (2, 1000)
    for i in range(2):
        alone = run_reference(one, x[i : i + 1])[one.outputs[0]]
        assert diff_ratio(both[i : i + 1], alone) <= RTOL


def test_exported_bytes_are_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("TIGHTFIT_CACHE", str(tmp_path))
    zoo._onnx_bytes.cache_clear()
    try:
        data = zoo.onnx_model("minakova5")
        files = list((tmp_path / "zoo").glob("minakova5-1x1x32x32-*.onnx"))
        assert len(files) == 1 and files[0].read_bytes() == data
        zoo._onnx_bytes.cache_clear()

        def no_export(*a, **k):
            raise AssertionError("made again despite the disk cache")

        monkeypatch.setattr("tightfit.frontend.zoo._make", no_export)
        assert zoo.onnx_model("minakova5") == data
        monkeypatch.setenv("TIGHTFIT_CACHE", "off")
        assert zoo._cache_path("minakova5", (1, 1, 32, 32)) is None
    finally:
        zoo._onnx_bytes.cache_clear()


# --- old-opset forms the ONNX zoo uses ---------------------------------------------------------

def _tiny_model(nodes, inits, out_shape, opset):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 4, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, out_shape)
    graph = onnx.helper.make_graph(nodes, "tiny", [x], [y], [onnx.numpy_helper.from_array(a, n) for n, a in inits.items()])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=7)


def _check_against_onnxruntime(model, graph):
    x = random_input(graph, seed=1)
    out = run_reference(graph, x)[graph.outputs[0]]
    ref = onnxruntime_run(model.SerializeToString(), np.asarray(x), [graph.outputs[0]])[graph.outputs[0]]
    assert diff_ratio(out, ref) <= RTOL


def test_opset9_caffe_scale_and_softmax_fold_into_layers():
    """Opset 9: Unsqueeze with an `axes` attribute folds at the model's opset; BN -> Mul -> Add by
    per-channel constants (Caffe's Scale) folds into the conv; Softmax over (N, C, 1, 1) uses the
    pre-13 default axis 1."""
    rng = np.random.default_rng(0)
    inits = {
        "w": rng.standard_normal((5, 3, 3, 3)).astype(np.float32),
        "s": (1 + rng.random(5)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32),
        "m": rng.standard_normal(5).astype(np.float32) * 0.1, "v": (0.5 + rng.random(5)).astype(np.float32),
        "g": (1 + rng.random(5)).astype(np.float32), "h": rng.standard_normal(5).astype(np.float32),
    }
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        onnx.helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
        onnx.helper.make_node("Unsqueeze", ["g"], ["g3"], axes=[1, 2]),
        onnx.helper.make_node("Mul", ["bn", "g3"], ["sc"]),
        onnx.helper.make_node("Unsqueeze", ["h"], ["h3"], axes=[1, 2]),
        onnx.helper.make_node("Add", ["sc", "h3"], ["sh"]),
        onnx.helper.make_node("Relu", ["sh"], ["r"]),
        onnx.helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        onnx.helper.make_node("Softmax", ["p"], ["y"]),
    ]
    model = _tiny_model(nodes, inits, [1, 5, 1, 1], 9)
    graph = import_model(model, None, "tiny")
    assert [l.op for l in graph.layers] == ["conv", "global_pool", "softmax"]
    assert graph.layers[0].output == "r" and graph.layers[0].attrs["act"] == (("relu",),)
    _check_against_onnxruntime(model, graph)


def test_channel_shuffle_and_flattening_reshape_fuse():
    """ShuffleNet's Reshape -> Transpose -> Reshape is one channel_shuffle layer; a Reshape that
    flattens each sample folds into the dense layer after it."""
    rng = np.random.default_rng(1)
    inits = {
        "w": rng.standard_normal((6, 3, 1, 1)).astype(np.float32),
        "split": np.array([1, 2, 3, 4, 4], np.int64), "back": np.array([1, 6, 4, 4], np.int64),
        "flat": np.array([1, 96], np.int64), "fc": rng.standard_normal((7, 96)).astype(np.float32),
        "fb": rng.standard_normal(7).astype(np.float32),
    }
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
        onnx.helper.make_node("Reshape", ["c", "split"], ["r5"]),
        onnx.helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
        onnx.helper.make_node("Reshape", ["t5", "back"], ["sh"]),
        onnx.helper.make_node("Reshape", ["sh", "flat"], ["f"]),
        onnx.helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1),
    ]
    model = _tiny_model(nodes, inits, [1, 7], 9)
    graph = import_model(model, None, "tiny")
    assert [l.op for l in graph.layers] == ["conv", "channel_shuffle", "gemm"]
    assert graph.layers[1].attrs["groups"] == 2
    _check_against_onnxruntime(model, graph)


def test_opset4_reshape_shape_attribute():
    inits = {"w": np.random.default_rng(2).standard_normal((4, 3, 1, 1)).astype(np.float32)}
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
        onnx.helper.make_node("Reshape", ["c"], ["y"], shape=[1, 4, 2, 8]),
    ]
    model = _tiny_model(nodes, inits, [1, 4, 2, 8], 4)
    graph = import_model(model, None, "tiny")
    assert [l.op for l in graph.layers] == ["conv", "reshape"]
    assert graph.shape("y") == (1, 4, 2, 8)


def test_opset8_attribute_forms_match_onnxruntime():
    """Opset 8 spellings: BatchNormalization with `spatial`, Upsample with a `scales` attribute,
    Pad with a `pads` attribute, a three-input Sum, Dropout; Softmax's pre-13 default axis."""
    rng = np.random.default_rng(3)
    inits = {
        "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "s": (1 + rng.random(4)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32),
        "m": rng.standard_normal(4).astype(np.float32) * 0.1, "v": (0.5 + rng.random(4)).astype(np.float32),
        "w2": rng.standard_normal((4, 4, 3, 3)).astype(np.float32),
    }
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        onnx.helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], spatial=1, epsilon=1e-3),
        onnx.helper.make_node("Relu", ["bn"], ["r"]),
        onnx.helper.make_node("Upsample", ["r"], ["u"], mode="nearest", scales=[1.0, 1.0, 2.0, 2.0]),
        onnx.helper.make_node("Pad", ["u"], ["p"], pads=[0, 0, 1, 1, 0, 0, 1, 1]),
        onnx.helper.make_node("Conv", ["p", "w2"], ["c2"], kernel_shape=[3, 3]),
        onnx.helper.make_node("Sum", ["c2", "u", "u"], ["sum"]),
        onnx.helper.make_node("Dropout", ["sum"], ["d"], ratio=0.5),
        onnx.helper.make_node("GlobalAveragePool", ["d"], ["gp"]),
        onnx.helper.make_node("Softmax", ["gp"], ["y"]),
    ]
    model = _tiny_model(nodes, inits, [1, 4, 1, 1], 8)
    model.ir_version = 3
    graph = import_model(model, None, "tiny")
    assert [l.op for l in graph.layers] == ["conv", "resize", "conv", "add", "global_pool", "softmax"]
    assert graph.layers[2].attrs["pads"] == (1, 1, 1, 1)  # the Pad folded into the conv
    _check_against_onnxruntime(model, graph)
