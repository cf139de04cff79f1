"""Issue 22, spatial and structural operators: ConvTranspose, Slice, Split, Concat along H and W,
DepthToSpace / SpaceToDepth, Resize / Upsample in every mode.

Each op sits in a tiny ONNX model between two convolutions (so plans split through it): the
imported model's reference run equals onnxruntime's, and a reuse plan, a by-parts plan of one
row per phase and a tiled plan (2x2 tiles over the whole model) run on the arena executor equal
the reference run. Import refusals name the node. One model holding every new op exports to
portable C and matches. (The same ops through the PyTorch path: test_ops_spatial_torch.py.)"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tightfit
from tightfit.errors import UnsupportedOpsError
from tightfit.plan.check import check_plan
from tightfit.runtime.executor import ArenaExecutor
from tightfit.reference import run_reference
from tightfit.runtime.reference import random_input
from tightfit.verify import compare

ort.set_default_logger_severity(3)
pytestmark = pytest.mark.usefixtures("one_torch_thread")

I64 = np.int64
BIG = 2**62
RNG = np.random.default_rng(22)


def _randn(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _model(nodes, x_shape, inits: dict, opset: int, outputs=("y",)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "case", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def sandwich(nodes, inits: dict, opset: int = 13, x_shape=(1, 3, 12, 10), mid: int = 8) -> onnx.ModelProto:
    """x -> 3x3 conv to `mid` channels ("a") -> the nodes (reading "a", writing "b") -> 3x3 conv
    to 3 channels ("y")."""
    head = helper.make_node("Conv", ["x", "w_in"], ["a"], pads=[1, 1, 1, 1])
    probe = _model([head] + list(nodes), x_shape, {"w_in": _randn(mid, x_shape[1], 3, 3), **inits}, opset, ("b",))
    inferred = onnx.shape_inference.infer_shapes(probe)
    b = next(v for v in inferred.graph.output if v.name == "b")
    channels = b.type.tensor_type.shape.dim[1].dim_value
    tail = helper.make_node("Conv", ["b", "w_out", "bias_out"], ["y"], pads=[1, 1, 1, 1])
    weights = {"w_in": _randn(mid, x_shape[1], 3, 3), "w_out": _randn(3, channels, 3, 3), "bias_out": _randn(3)}
    return _model([head] + list(nodes) + [tail], x_shape, {**weights, **inits}, opset)


def _onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


PLANS = ({"method": "reuse"}, {"method": "parts", "rows": 1}, {"method": "tiling"})


def check_model(model: onnx.ModelProto, tmp_path: Path, plans=PLANS) -> None:
    path = tmp_path / "case.onnx"
    onnx.save(model, str(path))
    g = tightfit.load(str(path))
    x = random_input(g)
    ref = run_reference(g, x)
    result = compare(ref[g.outputs[0]], _onnxruntime(model, np.asarray(x)))
    assert result.ok, f"reference vs onnxruntime: {result}"
    for kw in plans:
        if kw["method"] == "tiling":
            last = len(g.layers) - 1
            kw = {"method": "tiling", "tiling": f"0-{last}:2x2"}
        p, graphs = tightfit.api.plan(str(path), **kw)
        check_plan(p, graphs)
        outs = ArenaExecutor(p, graphs, fill_nan=True).run([x])[0]
        result = compare(outs[g.outputs[0]], ref[g.outputs[0]])
        assert result.ok, f"{kw}: {result}"


# --- Grouped convolutions ----------------------------------------------------------------------

GROUPED = {  # (input channels, output channels, groups, kernel): block-diagonal dense or the grouped kernel
    "few_channels_per_group": (24, 56, 4, 1),
    "eight_groups_3x3": (32, 32, 8, 3),
    "two_wide_groups": (32, 32, 2, 3),
    "many_wide_groups": (160, 160, 10, 3),
    "depth_multiplier": (8, 16, 8, 3),
}


@pytest.mark.parametrize("name", sorted(GROUPED))
def test_grouped_convolutions_match_onnxruntime(name, tmp_path):
    """Grouped convolutions, on the dense kernel over their block-diagonal weight or on the grouped
    kernel, equal onnxruntime in both layouts and by parts."""
    cin, cout, groups, k = GROUPED[name]
    node = helper.make_node("Conv", ["a", "wg", "bg"], ["b"], group=groups, pads=[k // 2] * 4)
    model = sandwich([node], {"wg": _randn(cout, cin // groups, k, k), "bg": _randn(cout)}, x_shape=(1, 3, 8, 6), mid=cin)
    check_model(model, tmp_path, plans=PLANS + ({"method": "reuse", "layout": "nchw"},))


# --- ConvTranspose ------------------------------------------------------------------------------

CONV_TRANSPOSE = {
    "k3s2p1op1": dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
    "k2s2": dict(kernel=2, strides=[2, 2]),
    "k4s2p1": dict(kernel=4, strides=[2, 2], pads=[1, 1, 1, 1]),
    "k2s3_gaps": dict(kernel=2, strides=[3, 3]),
    "dilated_asym": dict(strides=[2, 1], dilations=[2, 1], pads=[0, 1, 2, 0]),
    "grouped": dict(strides=[2, 2], group=2),
    "depthwise": dict(kernel=4, strides=[2, 2], pads=[1, 1, 1, 1], group=8),
    "same_upper": dict(strides=[2, 2], auto_pad="SAME_UPPER"),
    "same_lower": dict(strides=[2, 2], auto_pad="SAME_LOWER"),
    "output_shape": dict(strides=[2, 2], output_shape=[23, 21]),
    "no_bias_s1": dict(pads=[1, 1, 1, 1], bias=False),
}


@pytest.mark.parametrize("name", sorted(CONV_TRANSPOSE))
def test_conv_transpose(name, tmp_path):
    kw = dict(CONV_TRANSPOSE[name])
    k, group, bias = kw.pop("kernel", 3), kw.get("group", 1), kw.pop("bias", True)
    inits = {"wt": _randn(8, 6 // group if group < 8 else 1, k, k), "bt": _randn(6 if group < 8 else 8)}
    node = helper.make_node("ConvTranspose", ["a", "wt"] + (["bt"] if bias else []), ["b0"], **kw)
    relu = helper.make_node("Relu", ["b0"], ["b"])
    check_model(sandwich([node, relu], inits), tmp_path)


# --- Max pools 3 wide on many channels -------------------------------------------------------------

MAX3 = {  # (channels, rows x columns, stride, pads, ceil_mode): the kernels' row-wise 3-wide max pool
    "s1_pad1_64_and_16": (80, (9, 11), 1, 1, 0),
    "s1_tail_channels": (19, (6, 7), 1, 1, 0),
    "s2_ceil": (32, (8, 9), 2, 0, 1),
    "s2_pad1_ceil": (48, (7, 10), 2, 1, 1),
    "s1_no_pad": (16, (5, 5), 1, 0, 0),
}


@pytest.mark.parametrize("name", sorted(MAX3))
def test_max_pool_three_wide(name, tmp_path):
    """The pool's pixels share input columns' maxima along a row (16 and 64 channels at a time):
    whole, by parts and tiled, equal to onnxruntime's, padding and ceil_mode's overhang included."""
    c, (h, w), s, p, ceil = MAX3[name]
    node = helper.make_node("MaxPool", ["a"], ["b"], kernel_shape=[3, 3], strides=[s, s], pads=[p] * 4, ceil_mode=ceil)
    check_model(sandwich([node], {}, x_shape=(1, 3, h, w), mid=c), tmp_path)


# --- Stems: deep kernels on few channels ----------------------------------------------------------

STEMS = {  # (input channels, output channels, kernel, stride, pad): the kernels' blocks for few channels
    "7x7_s2_3_to_40": (3, 40, 7, 2, 3),
    "5x5_s1_6_to_20": (6, 20, 5, 1, 2),
    "7x7_s2_3_to_64_no_pad": (3, 64, 7, 2, 0),
}


@pytest.mark.parametrize("name", sorted(STEMS))
def test_stem_convolutions(name, tmp_path):
    """A kernel row's taps over few channels summed as one run: whole, by parts and tiled, equal to
    onnxruntime's, padded edges included."""
    cin, cout, k, s, p = STEMS[name]
    node = helper.make_node("Conv", ["a", "w", "bias"], ["b"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)
    inits = {"w": _randn(cout, cin, k, k), "bias": _randn(cout)}
    check_model(sandwich([node], inits, x_shape=(1, 3, 23, 19), mid=cin), tmp_path)


# --- Slice, Split, Concat -------------------------------------------------------------------------

def _slice(starts, ends, axes, steps=None):
    inits = {"st": np.array(starts, I64), "en": np.array(ends, I64), "ax": np.array(axes, I64)}
    names = ["a", "st", "en", "ax"]
    if steps is not None:
        inits["sp"] = np.array(steps, I64)
        names.append("sp")
    return helper.make_node("Slice", names, ["b"]), inits


def test_focus_stem(tmp_path):
    """YOLOv5's Focus: x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]
    joined along channels."""
    nodes, inits = [], {}
    for k, (r, c) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        for name, v in (("st", [r, c]), ("en", [BIG, BIG]), ("ax", [2, 3]), ("sp", [2, 2])):
            inits[f"{name}{k}"] = np.array(v, I64)
        nodes.append(helper.make_node("Slice", ["a", f"st{k}", f"en{k}", f"ax{k}", f"sp{k}"], [f"s{k}"]))
    nodes.append(helper.make_node("Concat", [f"s{k}" for k in range(4)], ["b"], axis=1))
    check_model(sandwich(nodes, inits, x_shape=(1, 3, 16, 12)), tmp_path)


SLICES = {
    "channels": ([2], [7], [1], None),
    "negative_steps": ([-1, 10, 8], [-100, 0, -BIG], [1, 2, 3], [-2, -3, -1]),
    "clamped_ends_crop": ([1, -9], [BIG, -1], [2, 3], None),
    "rows_step3": ([1, 0], [11, BIG], [2, -3], [3, 1]),
}


@pytest.mark.parametrize("name", sorted(SLICES))
def test_slice(name, tmp_path):
    node, inits = _slice(*SLICES[name])
    check_model(sandwich([node], inits), tmp_path)


def test_slice_opset9_attributes(tmp_path):
    node = helper.make_node("Slice", ["a"], ["b"], starts=[1, 2], ends=[7, -1], axes=[1, 2])
    check_model(sandwich([node], {}, opset=9), tmp_path)


SPLITS = {
    "channels_input_13": (13, dict(axis=1), [3, 5]),
    "rows_attr_11": (11, dict(axis=2, split=[5, 7]), None),
    "cols_equal_11": (11, dict(axis=3), None),
    "num_outputs_18": (18, dict(axis=1, num_outputs=3), None),
}


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_split(name, tmp_path):
    """A split into parts joined again in another order (rows and columns along their own axis)."""
    opset, kw, sizes = SPLITS[name]
    parts = kw.get("num_outputs", 2)
    inits = {} if sizes is None else {"sp": np.array(sizes, I64)}
    node = helper.make_node("Split", ["a"] + (["sp"] if sizes else []), [f"p{i}" for i in range(parts)], **kw)
    join = helper.make_node("Concat", [f"p{i}" for i in reversed(range(parts))], ["b"], axis=kw["axis"])
    check_model(sandwich([node, join], inits, opset=opset), tmp_path)


def test_split_output_nothing_reads_has_no_layer(tmp_path):
    node = helper.make_node("Split", ["a", "sp"], ["p0", "p1"], axis=1)
    model = sandwich([node, helper.make_node("Relu", ["p1"], ["b"])], {"sp": np.array([3, 5], I64)})
    check_model(model, tmp_path)
    assert [l.op for l in tightfit.load(str(tmp_path / "case.onnx")).layers] == ["conv", "slice", "activation", "conv"]


@pytest.mark.parametrize("axis", [2, 3, -1])
def test_concat_along_rows_and_columns(axis, tmp_path):
    """A tensor and its pooled copy (half the rows or columns) joined along that axis: a region
    may hold rows of one of them only."""
    k = [2, 1] if axis == 2 else [1, 2]
    pool = helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=k, strides=k)
    first, second = ("a", "p") if axis == 2 else ("p", "a")
    join = helper.make_node("Concat", [first, second], ["b"], axis=axis)
    check_model(sandwich([pool, join], {}), tmp_path)


# --- DepthToSpace / SpaceToDepth ----------------------------------------------------------------

@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode, tmp_path):
    node = helper.make_node("DepthToSpace", ["a"], ["b"], blocksize=2, mode=mode)
    check_model(sandwich([node], {}, x_shape=(1, 3, 6, 5)), tmp_path)


def test_space_to_depth(tmp_path):
    node = helper.make_node("SpaceToDepth", ["a"], ["b"], blocksize=2)
    check_model(sandwich([node], {}, x_shape=(1, 3, 12, 8)), tmp_path)


SIX_D = {  # (split per sample, perm, joined per sample, op it fuses into or None) of 8 x 6 x 4 data
    "dcr_depth_to_space": ((2, 2, 2, 6, 4), (0, 3, 4, 1, 5, 2), (2, 12, 8), "depth_to_space"),
    "crd_depth_to_space": ((2, 2, 2, 6, 4), (0, 1, 4, 2, 5, 3), (2, 12, 8), "depth_to_space"),
    "pixel_unshuffle": ((8, 3, 2, 2, 2), (0, 1, 3, 5, 2, 4), (32, 3, 2), "space_to_depth"),
    "not_a_rearrangement": ((2, 2, 2, 6, 4), (0, 3, 4, 2, 5, 1), (2, 12, 8), None),
}


@pytest.mark.parametrize("name", sorted(SIX_D))
def test_six_d_reshape_transpose_reshape(name, tmp_path):
    """The 6-D spelling of a depth <-> space rearrangement becomes one splittable layer; a
    permutation that is none stays three whole-tensor layers (and still runs)."""
    split, perm, joined, op = SIX_D[name]
    nodes = [helper.make_node("Reshape", ["a", "s6"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=list(perm)),
             helper.make_node("Reshape", ["t", "s4"], ["b"])]
    inits = {"s6": np.array((1,) + split, I64), "s4": np.array((1,) + joined, I64)}
    model = sandwich(nodes, inits, x_shape=(1, 3, 6, 4))
    path = tmp_path / "six.onnx"
    onnx.save(model, str(path))
    ops = [l.op for l in tightfit.load(str(path)).layers]
    assert (ops == ["conv", op, "conv"]) if op else ("transpose" in ops)
    check_model(model, tmp_path, plans=PLANS if op else PLANS[:1])


HIGH_RANK = {  # (split per sample, perm) of 8 x 6 x 4 data, reshaped back to (2, 12, 8)
    "rank5_moves_all": ((2, 4, 6, 4), (0, 4, 2, 3, 1)),
    "rank6_reverse": ((2, 2, 2, 6, 4), (0, 5, 4, 3, 2, 1)),
    "rank6_interleave": ((2, 2, 2, 3, 8), (0, 2, 5, 1, 4, 3)),
    "rank6_merges": ((2, 2, 3, 2, 8), (0, 3, 4, 5, 1, 2)),
}


@pytest.mark.parametrize("name", sorted(HIGH_RANK))
def test_transposes_above_rank_four_run_on_the_kernels(name, tmp_path):
    """The kernels' views hold 4 dims: a 5-D or 6-D transpose runs as 4-D block moves and equals
    onnxruntime under a reuse plan and a by-parts plan (tiling refuses whole-sample layers)."""
    split, perm = HIGH_RANK[name]
    nodes = [helper.make_node("Reshape", ["a", "s6"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=list(perm)),
             helper.make_node("Reshape", ["t", "s4"], ["b"])]
    inits = {"s6": np.array((1,) + split, I64), "s4": np.array((1, 2, 12, 8), I64)}
    check_model(sandwich(nodes, inits, x_shape=(1, 3, 6, 4)), tmp_path, plans=PLANS[:2])


# --- Resize / Upsample ---------------------------------------------------------------------------

RESIZES = {
    "nearest_half_pixel_round_prefer_ceil": ("nearest", "half_pixel", dict(nearest_mode="round_prefer_ceil"), [2.0, 1.5]),
    "nearest_asymmetric_floor": ("nearest", "asymmetric", dict(nearest_mode="floor"), [2.0, 2.0]),
    "nearest_align_corners_ceil_down": ("nearest", "align_corners", dict(nearest_mode="ceil"), [0.5, 0.7]),
    "linear_half_pixel": ("linear", "half_pixel", {}, [2.0, 2.0]),
    "linear_pytorch_half_pixel_down": ("linear", "pytorch_half_pixel", {}, [0.5, 0.8]),
    "linear_align_corners": ("linear", "align_corners", {}, [1.5, 2.5]),
    "linear_asymmetric": ("linear", "asymmetric", {}, [3.0, 1.0]),
    "linear_half_pixel_symmetric": ("linear", "half_pixel_symmetric", {}, [1.7, 0.6]),
    "cubic_half_pixel": ("cubic", "half_pixel", {}, [2.0, 1.5]),
    "cubic_a_exclude_outside": ("cubic", "align_corners", dict(cubic_coeff_a=-0.5, exclude_outside=1), [1.5, 0.7]),
    "cubic_asymmetric_down": ("cubic", "asymmetric", {}, [0.5, 0.5]),
}


@pytest.mark.parametrize("name", sorted(RESIZES))
def test_resize_scales(name, tmp_path):
    mode, coord, kw, (sh, sw) = RESIZES[name]
    node = helper.make_node("Resize", ["a", "", "sc"], ["b"], mode=mode, coordinate_transformation_mode=coord, **kw)
    check_model(sandwich([node], {"sc": np.array([1, 1, sh, sw], np.float32)}, opset=19), tmp_path)


def test_resize_sizes_linear(tmp_path):
    node = helper.make_node("Resize", ["a", "", "", "sz"], ["b"], mode="linear")
    check_model(sandwich([node], {"sz": np.array([1, 8, 17, 7], I64)}), tmp_path)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_keep_aspect_ratio(policy, tmp_path):
    node = helper.make_node("Resize", ["a", "", "", "sz"], ["b"], mode="linear", axes=[2, 3], keep_aspect_ratio_policy=policy)
    check_model(sandwich([node], {"sz": np.array([17, 9], I64)}, opset=18), tmp_path, plans=PLANS[1:2])


def test_resize_opset11_tf_half_pixel_for_nn(tmp_path):
    node = helper.make_node("Resize", ["a", "roi", "sc"], ["b"], mode="nearest",
                            coordinate_transformation_mode="tf_half_pixel_for_nn")
    inits = {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 2, 1.5], np.float32)}
    check_model(sandwich([node], inits, opset=11), tmp_path)


@pytest.mark.parametrize("mode,opset", [("linear", 9), ("nearest", 7), ("linear", 10)])
def test_upsample_and_resize10(mode, opset, tmp_path):
    if opset == 7:
        node = helper.make_node("Upsample", ["a"], ["b"], mode=mode, scales=[1.0, 1.0, 2.0, 3.0])
        inits = {}
    else:
        node = helper.make_node("Upsample" if opset == 9 else "Resize", ["a", "sc"], ["b"], mode=mode)
        inits = {"sc": np.array([1, 1, 2.0, 0.75 if opset == 10 else 3.0], np.float32)}
    check_model(sandwich([node], inits, opset=opset), tmp_path)


# --- refusals --------------------------------------------------------------------------------------

REFUSED = {
    "tf_crop_and_resize": (helper.make_node("Resize", ["a", "roi", "sc"], ["b"], name="crop_node", mode="linear",
                                            coordinate_transformation_mode="tf_crop_and_resize"), "tf_crop_and_resize"),
    "antialias": (helper.make_node("Resize", ["a", "", "sc"], ["b"], name="aa_node", mode="linear", antialias=1),
                  "antialias"),
    "batch_slice": (helper.make_node("Slice", ["a", "st", "en", "ax"], ["b"], name="batch_node"), "batch"),
    "depth_to_space_channels": (helper.make_node("DepthToSpace", ["a"], ["b"], name="d2s_node", blocksize=3),
                                "blocksize"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refusals_name_the_node(name, tmp_path):
    node, words = REFUSED[name]
    inits = {"roi": np.array([0, 0, 0, 0, 1, 1, 1, 1], np.float32), "sc": np.array([1, 1, 2, 2], np.float32),
             "st": np.array([0], I64), "en": np.array([1], I64), "ax": np.array([0], I64)}
    x_shape = (2, 3, 12, 10) if name == "batch_slice" else (1, 3, 12, 10)
    model = _model([helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]), node], x_shape,
                   {"w": _randn(8, 3, 3, 3), **{k: v for k, v in inits.items() if k in node.input}}, 19, ("b",))
    path = tmp_path / "refused.onnx"
    onnx.save(model, str(path))
    with pytest.raises(UnsupportedOpsError) as e:
        tightfit.load(str(path))
    assert node.name in str(e.value) and words in str(e.value)


# --- C export -----------------------------------------------------------------------------------

def all_ops_model() -> onnx.ModelProto:
    """Every new op in one model: Focus slices, a split, DepthToSpace / SpaceToDepth, concat
    along rows, ConvTranspose, linear and cubic resize."""
    nodes, inits = [], {}
    for k, (r, c) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        for name, v in (("st", [r, c]), ("en", [BIG, BIG]), ("ax", [2, 3]), ("sp", [2, 2])):
            inits[f"{name}{k}"] = np.array(v, I64)
        nodes.append(helper.make_node("Slice", ["a", f"st{k}", f"en{k}", f"ax{k}", f"sp{k}"], [f"s{k}"]))
    nodes += [
        helper.make_node("Concat", [f"s{k}" for k in range(4)], ["f"], axis=1),               # 32 x 8 x 6
        helper.make_node("Split", ["f", "split"], ["f0", "f1"], axis=1),                      # 16 + 16
        helper.make_node("DepthToSpace", ["f0"], ["d"], blocksize=2, mode="CRD"),              # 4 x 16 x 12
        helper.make_node("SpaceToDepth", ["d"], ["e"], blocksize=2),                          # 16 x 8 x 6
        helper.make_node("Concat", ["e", "f1"], ["g"], axis=2),                               # 16 x 16 x 6
        helper.make_node("ConvTranspose", ["g", "wt", "bt"], ["t"], strides=[2, 2], pads=[1, 1, 1, 1],
                         output_padding=[1, 1]),                                              # 6 x 32 x 12
        helper.make_node("Resize", ["t", "", "sc1"], ["r"], mode="linear"),                    # 6 x 16 x 9
        helper.make_node("Resize", ["r", "", "", "sz"], ["b0"], mode="cubic", exclude_outside=1),  # 6 x 20 x 10
        helper.make_node("Slice", ["b0", "nst", "nen", "nax", "nsp"], ["b"]),
    ]
    inits.update(split=np.array([16, 16], I64), wt=_randn(16, 6, 3, 3), bt=_randn(6),
                 sc1=np.array([1, 1, 0.5, 0.75], np.float32), sz=np.array([1, 6, 20, 10], I64),
                 nst=np.array([-1], I64), nen=np.array([-BIG], I64), nax=np.array([3], I64), nsp=np.array([-1], I64))
    return sandwich(nodes, inits, opset=13, x_shape=(1, 3, 16, 12))


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
@pytest.mark.parametrize("kw", [pytest.param({"method": "reuse"}, marks=pytest.mark.slow), {"method": "parts", "rows": 1},
                                {"method": "tiling"}], ids=["reuse", "parts", "tiling"])
def test_all_new_ops_export_to_portable_c(kw, tmp_path):
    from tightfit.api import check_export
    from tightfit.export import export

    model = all_ops_model()
    path = tmp_path / "all_ops.onnx"
    onnx.save(model, str(path))
    g = tightfit.load(str(path))
    ops = {l.op for l in g.layers}
    assert {"slice", "concat", "depth_to_space", "space_to_depth", "conv_transpose", "resize"} <= ops
    if kw["method"] == "tiling":
        kw = {"method": "tiling", "tiling": f"0-{len(g.layers) - 1}:2x2"}
    check_model(model, tmp_path, plans=())
    p, graphs = tightfit.api.plan(str(path), **kw)
    sources = export(p, graphs, tmp_path / "out")
    c = check_export(p, graphs, sources, tmp_path / "out", cflags=["-std=c99", "-O2"], runs=1)
    assert c.ok, f"outputs differ: {c.max_abs_diff} > {c.tolerance}"
