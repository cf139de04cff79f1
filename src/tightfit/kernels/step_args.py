"""A plan's step as the argument values of its kernel in the C library (kernels/tf_kernels.h): the
one place that turns a step into a kernel call. The C generator (codegen.py) writes these values as
initializers of static structs; the executor (kernels/library.py) packs the same values into ctypes
structures of the same layout (both made from ops/abi.py's table). Pure: a step, its plan and graph
in; values, plus the constants they point to appended to the context's pools, out."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tightfit.errors import KernelError
from tightfit.graph.ir import Graph, Layer
from tightfit.ops import abi, get_op
from tightfit.ops.base import Region
from tightfit.ops.binary import merged_dims
from tightfit.ops.conv import clamp_bounds
from tightfit.ops.quant import INT8_RANGE, quantized
from tightfit.plan.schema import Access, Buffer, Plan, Step


@dataclass(frozen=True)
class View:
    """tf_view: element offset in the arena and a logical (N, C, H, W) block with element strides."""

    off: int
    dims: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]

    def permuted(self, perm: Sequence[int], dims: tuple[int, int, int, int]) -> "View":
        """This view read in the order of a transpose: output dim k is input dim perm[k]."""
        perm = tuple(perm) + tuple(range(len(perm), 4))
        return View(self.off, dims, tuple(self.strides[p] for p in perm))  # type: ignore[arg-type]

    def values(self) -> tuple[int, ...]:
        return (self.off,) + self.dims + self.strides


@dataclass(frozen=True)
class Code:
    """An enum constant of the library: its C name and value (abi.ENUMS)."""

    prefix: str
    name: str

    @property
    def value(self) -> int:
        return abi.code(self.prefix, self.name)

    @property
    def c_name(self) -> str:
        return f"TF_{self.prefix}_{self.name.upper()}"


@dataclass(frozen=True)
class Acts:
    """A pointer to an activation chain (tf_acts), NULL where the chain is empty."""

    chain: tuple

    def __post_init__(self) -> None:
        if len(self.chain) > abi.MAX_ACTS:
            raise KernelError(f"an activation chain of {len(self.chain)} (at most {abi.MAX_ACTS} run in the kernels)")
        for kind, *_ in self.chain:
            if kind not in abi.ACTS:
                raise KernelError(f"activation {kind!r} has no C kernel")

    def fields(self) -> tuple[list[int], list[float], list[float]]:
        kinds, a, b = [0] * abi.MAX_ACTS, [0.0] * abi.MAX_ACTS, [0.0] * abi.MAX_ACTS
        for i, (kind, *args) in enumerate(self.chain):
            kinds[i] = abi.ACTS[kind]
            a[i], b[i] = (float(v) for v in (list(args) + [0.0, 0.0])[:2])
        return kinds, a, b


@dataclass(frozen=True)
class Struct:
    """A struct held inline or in an array (tf_operand)."""

    ctype: str
    fields: tuple


@dataclass(frozen=True)
class Array:
    """A pointer to `items` (structs or views) of C type `ctype`."""

    ctype: str
    items: tuple


@dataclass(frozen=True)
class Args:
    """One step: its kind (TF_STEP_*), its argument struct's type and field values in order."""

    kind: str
    ctype: str
    fields: tuple
    comment: str = ""


class Pool:
    """Constant data (weights, index tables) appended once per key; offsets in elements, each
    array starting on a 64-byte boundary (a vector load of 16 floats then never straddles two
    cache lines: unaligned, the dense kernel ran at half speed)."""

    ALIGN = 16

    def __init__(self, dtype: type) -> None:
        self.dtype, self.parts, self.size, self.at = dtype, [], 0, {}
        self.words = False  # holds add_words' data: its words are bits, not all finite floats

    def add(self, key: object, make) -> int:
        if key not in self.at:
            arr = np.ascontiguousarray(make(), dtype=self.dtype).reshape(-1)
            pad = -self.size % self.ALIGN
            if pad:
                self.parts.append(np.zeros(pad, self.dtype))
                self.size += pad
            self.at[key] = self.size
            self.parts.append(arr)
            self.size += arr.size
        return self.at[key]

    def add_words(self, key: object, make) -> int:
        """An array of any type (int8 weights, int32 biases) stored bit for bit in the pool's
        4-byte words, zero-padded to whole words; its offset in words."""
        def words() -> np.ndarray:
            raw = np.ascontiguousarray(make()).reshape(-1).view(np.uint8)
            return np.concatenate([raw, np.zeros(-raw.size % 4, np.uint8)]).view(self.dtype)

        self.words = True
        return self.add(key, words)

    def array(self) -> np.ndarray:
        """The pool as one array, 64-byte aligned in memory."""
        out = _aligned_empty(self.size, self.dtype)
        at = 0
        for part in self.parts:
            out[at : at + part.size] = part
            at += part.size
        return out


def _aligned_empty(count: int, dtype: type) -> np.ndarray:
    """An uninitialised array whose data starts on a 64-byte boundary."""
    nbytes = max(count, 1) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + nbytes].view(dtype)[:count]


# Reshape / transpose chains (pixel shuffle spelled in 6-D) reach rank 6; numpy's views stop at 64.
MAX_RANK = 6


def _dims4(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """A shape as the kernels' (N, C, H, W): lower ranks padded with 1s; higher ranks (a 6-D reshape
    between layers, only ever held contiguous) fold their trailing dims into W, which keeps the
    elements' logical order, all that a reshape's copy reads (a transpose is split in _transpose)."""
    if len(shape) > MAX_RANK:
        raise KernelError(f"tensors of rank {len(shape)} are not run by the kernels (at most {MAX_RANK})")
    if len(shape) > 4:
        return (shape[0], shape[1], shape[2], math.prod(shape[3:]))
    return tuple(shape) + (1,) * (4 - len(shape))  # type: ignore[return-value]


def buffer_strides(b: Buffer) -> tuple[int, int, int, int]:
    if b.layout == "nhwc":
        _, c, h, w = b.shape
        return (h * w * c, 1, w * c, c)
    n, c, h, w = _dims4(b.shape)
    return (c * h * w, h * w, w, 1)


def access_view(b: Buffer, a: Access, copy: int, shape: Sequence[int]) -> View:
    """Access `a` of buffer `b` (frame copy `copy`) as a view; `shape` is the tensor's logical shape."""
    if b.itemsize not in (1, 4):
        raise KernelError(f"buffer {b.id} holds {b.itemsize}-byte items; the kernels run fp32 and int8 tensors")
    base = b.offsets[copy % b.copies] // b.itemsize  # an int8 view counts bytes, an fp32 one floats
    strides = buffer_strides(b)
    r = a.region
    if len(b.shape) == 4:
        n, h, w = a.at
        return View(base + n * strides[0] + h * strides[2] + w * strides[3], (r.n, b.shape[1], r.h, r.w), strides)
    return View(base + a.at[0] * strides[0], (r.n,) + _dims4(shape)[1:], strides)


@dataclass
class Context:
    plan: Plan
    graphs: Sequence[Graph]
    copy: int
    weights: Pool = field(default_factory=lambda: Pool(np.float32))
    indices: Pool = field(default_factory=lambda: Pool(np.int32))

    def view(self, model: int, a: Access) -> View:
        return access_view(self.plan.buffers[a.buffer], a, self.copy, self.graphs[model].shape(a.tensor))


def step_args(ctx: Context, s: Step) -> Args:
    """The kernel call of step `s`: its kind and argument values."""
    r = s.out.region
    where = f"samples {r.n0}-{r.n1} rows {r.h0}-{r.h1} cols {r.w0}-{r.w1} of {s.out.tensor!r} -> buffer {s.out.buffer}"
    y = ctx.view(s.model, s.out)
    if s.kind == "input":
        index = ctx.graphs[s.model].inputs.index(s.out.tensor)  # which of the model's sources fills it
        item = ctx.plan.buffers[s.out.buffer].itemsize  # an int8 input arrives as its int8 elements
        return Args("input", "tf_input_args", (y, r.n0, r.h0, r.w0, index, item), f"input: {where}")
    if s.kind == "output":
        index = ctx.graphs[s.model].outputs.index(s.out.tensor)  # which of the model's sinks takes it
        item = ctx.plan.buffers[s.out.buffer].itemsize
        return Args("output", "tf_output_args", (y, r.n0, r.h0, r.w0, index, item), f"output: {where}")
    if s.kind == "copy":
        x = ctx.view(s.model, s.inputs[0])
        if ctx.plan.buffers[s.out.buffer].itemsize == 1:  # an int8 tensor's region: bytes moved
            return Args("qcopy", "tf_quant_args", (x, y, Struct("tf_qparams", (1.0, 0, 1.0, 0)), *INT8_RANGE, _ROUND_ORT),
                        f"int8 copy from buffer {s.inputs[0].buffer}: {where}")
        return Args("copy", "tf_copy_args", (x, y), f"copy from buffer {s.inputs[0].buffer}: {where}")
    g = ctx.graphs[s.model]
    layer = g.layers[s.layer]
    xs = [ctx.view(s.model, a) for a in s.inputs]
    b = Bind(g, r, ctx.plan.models[s.model].batch, s.model, ctx.weights, ctx.indices)
    return layer_args(b, layer, xs, y, f"L{layer.id} {layer.op} {layer.name!r}: {where}")


def layer_args(b: Bind, layer: Layer, xs: Sequence[View], y: View, comment: str = "") -> Args:
    """The kernel call computing region `b.region` of `layer` into view `y` from input views `xs`."""
    table = INT8_BINDERS if quantized(layer) else BINDERS
    if layer.op not in table:
        raise KernelError(f"layer {layer.id} ({layer.name}): op {layer.op!r} has no {'int8 ' if table is INT8_BINDERS else ''}C kernel")
    kind, ctype, fields = table[layer.op](b, layer, list(xs), y)
    return Args(kind, ctype, tuple(fields), comment)


@dataclass(frozen=True)
class Bind:
    """What a binder needs besides the layer and its views: the graph, the output region, the
    batch, the model's index (keys of its constants) and the pools its constants go to."""

    g: Graph
    region: Region
    batch: int
    model: int
    weights: Pool
    indices: Pool


def _win(b: Bind, layer: Layer):
    in_shapes = [(b.batch,) + tuple(b.g.shape(t)[1:]) for t in layer.inputs]
    return get_op(layer.op).input_windows(layer, b.region, in_shapes)


def _expect(condition: bool, layer: Layer, what: str) -> None:
    if not condition:
        raise KernelError(f"layer {layer.id} ({layer.name}): {what} do not agree (an inconsistent graph)")


def _conv_weights(b: "Bind", layer: Layer, w: np.ndarray, bias: np.ndarray, kind: str) -> tuple[int, int]:
    """The weight and bias in the layout of the kernel `kind` (tf_conv_args), pooled once per layer."""
    cout, cin_g, kh, kw = w.shape
    groups = layer.attrs["groups"]
    if kind == "dense":
        panels = -(-cout // 16)

        def panel_taps() -> np.ndarray:
            taps = np.zeros((kh * kw * cin_g, panels * 16), np.float32)
            taps[:, :cout] = w.transpose(2, 3, 1, 0).reshape(-1, cout)
            return taps.reshape(-1, panels, 16).transpose(1, 0, 2)

        return (b.weights.add((b.model, layer.id, "w"), panel_taps),
                b.weights.add((b.model, layer.id, "b"), lambda: np.pad(bias, (0, panels * 16 - cout))))
    if kind == "depthwise":
        w_off = b.weights.add((b.model, layer.id, "w"), lambda: w.transpose(2, 3, 1, 0).reshape(kh * kw, cout))
    else:
        cog = cout // groups
        w_off = b.weights.add((b.model, layer.id, "w"), lambda: w.reshape(groups, cog, cin_g, kh, kw).transpose(0, 3, 4, 2, 1))
    return w_off, b.weights.add((b.model, layer.id, "b"), lambda: bias)


# A grouped convolution in at most this many groups, or with fewer channels per group than
# GROUP_CHANNELS_MIN, runs on the dense vector kernel over its block-diagonal weight: `groups` times
# the multiply-adds, yet 2-20x faster than the scalar grouped kernel (bench: 64 -> 128 in 4 groups,
# 3x3 on 28x28; onnxzoo-shufflenet's 24 -> 112 in 4 groups).
GROUPS_BLOCK_DIAGONAL = 8
GROUP_CHANNELS_MIN = 16


def block_diagonal(groups: int, cin_g: int, cout: int) -> bool:
    """Whether a grouped convolution (not a depthwise one) runs as dense over its block-diagonal weight."""
    return groups > 1 and cin_g > 1 and (groups <= GROUPS_BLOCK_DIAGONAL or min(cin_g, cout // groups) < GROUP_CHANNELS_MIN)


def _block_diagonal_weight(w: np.ndarray, groups: int) -> np.ndarray:
    """The (C_out, C_in, kh, kw) dense weight whose diagonal blocks are the groups' weights."""
    cout, cin_g, kh, kw = w.shape
    cog = cout // groups
    full = np.zeros((cout, cin_g * groups, kh, kw), np.float32)
    for g in range(groups):
        full[g * cog : (g + 1) * cog, g * cin_g : (g + 1) * cin_g] = w[g * cog : (g + 1) * cog]
    return full


def _conv(b, layer, xs, y):
    a = layer.attrs
    win = _win(b, layer)[0]
    w = b.g.params[layer.params[0]]
    cout, cin_g, kh, kw = w.shape
    groups = a["groups"]
    # The kernel reads the weight for the views' channels: they must agree (import checks it).
    _expect(cin_g * groups == b.g.shape(layer.inputs[0])[1] and cout == b.g.shape(layer.output)[1] and (kh, kw) == tuple(a["kernel"]),
            layer, f"weight {w.shape} for {b.g.shape(layer.inputs[0])[1]} -> {b.g.shape(layer.output)[1]} channels")
    kind = ("dense" if (groups == 1 or block_diagonal(groups, cin_g, cout)) and tuple(a["dilation"]) == (1, 1) else
            "depthwise" if groups == cout == cin_g * groups and cin_g == 1 else "grouped")
    if kind == "dense" and groups > 1 and (b.model, layer.id, "w") not in b.weights.at:
        w = _block_diagonal_weight(w, groups)  # made once per layer: the pool then holds its panels
    bias = b.g.params[layer.params[1]] if len(layer.params) > 1 else np.zeros(cout, np.float32)
    w_off, b_off = _conv_weights(b, layer, w, bias, kind)
    clamp = clamp_bounds(a["act"])
    lo, hi = clamp if clamp is not None else (-math.inf, math.inf)
    rest = () if clamp is not None else a["act"]
    return ("conv", "tf_conv_args", [xs[0], y, w_off, b_off, Code("CONV", kind), groups, kh, kw, *a["stride"],
                                     *a["dilation"], win.pad[0], win.pad[2], float(lo), float(hi), Acts(tuple(rest))])


def _pool(b, layer, xs, y):
    a = layer.attrs
    win = _win(b, layer)[0]
    r = b.region
    pt, pl, pb, pr = a["pads"]
    in_h, in_w = b.g.shape(layer.inputs[0])[2:]
    return ("pool", "tf_pool_args", [
        xs[0], y, Code("POOL", "max" if layer.op == "maxpool" else "avg"), int(a.get("count_include_pad", False)),
        *a["kernel"], *a["stride"], *a.get("dilation", (1, 1)), win.pad[0], win.pad[2], r.h0, r.w0, in_h, in_w,
        pt, pl, pb, pr, Acts(tuple(a["act"]))])


def _global(b, layer, xs, y):
    kind = Code("GLOBAL", "max" if layer.attrs["kind"] == "max" else "mean")
    return "global", "tf_global_args", [xs[0], y, kind, Acts(tuple(layer.attrs["act"]))]


def _channel_reduce(b, layer, xs, y):
    return ("channel_reduce",) + _global(b, layer, xs, y)[1:]


def _gemm(b, layer, xs, y):
    w = b.g.params[layer.params[0]]
    if layer.attrs.get("last_axis"):
        return _linear(b, layer, xs, y)
    features = int(np.prod(b.g.shape(layer.inputs[0])[1:]))
    _expect(w.shape == (layer.attrs["out_features"], features), layer, f"weight {w.shape} for {features} input features")
    w_off = b.weights.add((b.model, layer.id, "w"), lambda: w)
    b_off = b.weights.add((b.model, layer.id, "b"), lambda: b.g.params[layer.params[1]]) if len(layer.params) > 1 else -1
    return "gemm", "tf_gemm_args", [xs[0], y, w_off, b_off, w.shape[1], Acts(tuple(layer.attrs["act"]))]


def _softmax(b, layer, xs, y):
    return "softmax", "tf_softmax_args", [xs[0], y, int(bool(layer.attrs.get("log")))]


def _norm(b, layer, xs, y):
    s_off = b.weights.add((b.model, layer.id, "scale"), lambda: b.g.params[layer.params[0]])
    b_off = b.weights.add((b.model, layer.id, "bias"), lambda: b.g.params[layer.params[1]])
    kind = "channel_norm" if layer.op == "channel_norm" else "instance_norm"
    return kind, "tf_norm_args", [xs[0], y, s_off, b_off, float(layer.attrs["epsilon"]), Acts(tuple(layer.attrs["act"]))]


def _eltwise(b, layer, xs, y):
    r = b.region
    consts = [(p, b.g.params[p]) for p in layer.params]
    if len(b.g.shape(layer.output)) > 4:  # issue 38: (N, windows, heads, T, T) scores and their bias
        xs, y, consts = _eltwise_merged(b, layer, xs, y)
    operands = [Struct("tf_operand", (0, x, 0, 0, 0, 0, 0, 0)) for x in xs]
    for p, arr in consts:
        _, c, h, w = _dims4(arr.shape)
        off = b.weights.add((b.model, layer.id, p), lambda arr=arr: arr)
        operands.append(Struct("tf_operand", (1, View(0, (0, 0, 0, 0), (0, 0, 0, 0)), off, c, h, w,
                                              r.h0 if h > 1 else 0, r.w0 if w > 1 else 0)))
    if len(operands) > abi.MAX_OPERANDS:
        raise KernelError(f"layer {layer.id}: {len(operands)} operands (at most {abi.MAX_OPERANDS} run in the kernels)")
    if "order" in layer.attrs:  # data input i >= 0, constant -1 - j: the node's own operand order
        operands = [operands[i] if i >= 0 else operands[len(xs) - 1 - i] for i in layer.attrs["order"]]
    fn = abi.ELT_FNS[layer.attrs.get("fn", layer.op)]
    return ("eltwise", "tf_eltwise_args",
            [y, Code("ELT", abi.ELT_NAMES[fn]), len(operands), Array("tf_operand", tuple(operands)),
             Acts(tuple(layer.attrs["act"]))])


def _activation(b, layer, xs, y):
    return "affine", "tf_affine_args", [xs[0], y, -1, -1, Acts(tuple(layer.attrs["act"]))]


def _batchnorm(b, layer, xs, y):
    gamma, beta, mean, var = (b.g.params[p].astype(np.float64) for p in layer.params)
    scale = gamma / np.sqrt(var + layer.attrs["epsilon"])
    s_off = b.weights.add((b.model, layer.id, "scale"), lambda: scale.astype(np.float32))
    t_off = b.weights.add((b.model, layer.id, "shift"), lambda: (beta - mean * scale).astype(np.float32))
    return "affine", "tf_affine_args", [xs[0], y, s_off, t_off, Acts(tuple(layer.attrs["act"]))]


def _lrn(b, layer, xs, y):
    a = layer.attrs
    return "lrn", "tf_lrn_args", [xs[0], y, a["size"], float(a["alpha"]), float(a["beta"]), float(a["bias"])]


def _concat(b, layer, xs, y):
    """The inputs' views in an array of their own (DenseNet joins dozens)."""
    return "concat", "tf_concat_args", [y, len(xs), Array("tf_view", tuple(xs)), Acts(tuple(layer.attrs["act"]))]


def _pad(b, layer, xs, y):
    a = layer.attrs
    win = _win(b, layer)[0]
    t, l, _, _ = a["pads_hw"]
    in_h, in_w = b.g.shape(layer.inputs[0])[2:]
    r = b.region
    return ("pad", "tf_pad_args", [xs[0], y, Code("PAD", a["mode"]), float(a["value"]), r.h0, r.w0, win.region.h0,
                                   win.region.w0, in_h, in_w, t, l])


def _resize_nearest(b, layer, xs, y):
    op = get_op("resize")
    win = _win(b, layer)[0].region
    r = b.region
    rows = b.indices.add(("rows", b.model, layer.id, r.h0, r.h1, win.h0),
                           lambda: [i - win.h0 for i in op._indices(layer, 0, r.h0, r.h1)])  # type: ignore[attr-defined]
    cols = b.indices.add(("cols", b.model, layer.id, r.w0, r.w1, win.w0),
                           lambda: [i - win.w0 for i in op._indices(layer, 1, r.w0, r.w1)])  # type: ignore[attr-defined]
    return "resize", "tf_resize_args", [xs[0], y, rows, cols]


def _resize(b, layer, xs, y):
    """Nearest: an index table per axis; linear and cubic: index and weight tables of their taps."""
    if layer.attrs.get("mode", "nearest") == "nearest":
        return _resize_nearest(b, layer, xs, y)
    op = get_op("resize")
    win = _win(b, layer)[0].region
    r = b.region
    (row_at, row_w), (col_at, col_w) = op.taps(layer, 0, r.h0, r.h1), op.taps(layer, 1, r.w0, r.w1)  # type: ignore[attr-defined]
    key = (b.model, layer.id, r.h0, r.h1, r.w0, r.w1)
    rows = b.indices.add(("interp rows", *key), lambda: np.asarray(row_at) - win.h0)
    cols = b.indices.add(("interp cols", *key), lambda: np.asarray(col_at) - win.w0)
    rw = b.weights.add(("interp row weights", *key), lambda: np.asarray(row_w))
    cw = b.weights.add(("interp col weights", *key), lambda: np.asarray(col_w))
    return "interp", "tf_interp_args", [xs[0], y, len(row_at[0]), rows, cols, rw, cw]


def _moved(v: View, spans) -> View:
    """The block of view `v` a Move's (C, H, W) spans name (a negative step: a negative stride)."""
    (c0, cc, sc), (h0, hc, sh), (w0, wc, sw) = spans
    sn, s_c, s_h, s_w = v.strides
    return View(v.off + c0 * s_c + h0 * s_h + w0 * s_w, (v.dims[0], cc, hc, wc), (sn, s_c * sc, s_h * sh, s_w * sw))


def _block_moves(xs: list[View], y: View, moves, act=()):
    """Block moves (ops/moves.py) as two arrays of views."""
    moves = [m for m in moves if not m.is_empty()]
    src = Array("tf_view", tuple(_moved(xs[m.src], m.x) for m in moves))
    dst = Array("tf_view", tuple(_moved(y, m.y) for m in moves))
    return "moves", "tf_moves_args", [y, len(moves), src, dst, Acts(tuple(act))]


def _slice(b, layer, xs, y):
    return _block_moves(xs, y, get_op("slice").moves(layer, b.region, _win(b, layer)))  # type: ignore[attr-defined]


def _depth_space(b, layer, xs, y):
    depth = b.g.shape(layer.inputs[0])[1]
    return _block_moves(xs, y, get_op(layer.op).moves(layer, b.region, _win(b, layer), depth))  # type: ignore[attr-defined]


def _concat_any(b, layer, xs, y):
    if layer.attrs.get("axis", 1) == 1:
        return _concat(b, layer, xs, y)
    moves = get_op("concat").moves(layer, b.region, b.g.shape(layer.inputs[0])[1])  # type: ignore[attr-defined]
    return _block_moves(xs, y, moves, layer.attrs["act"])


def _conv_transpose(b, layer, xs, y):
    a = layer.attrs
    win = _win(b, layer)[0].region
    w = b.g.params[layer.params[0]]
    cin, cog, kh, kw = w.shape
    groups = a["groups"]
    w_off = b.weights.add((b.model, layer.id, "w"),
                            lambda: w.reshape(groups, cin // groups, cog, kh, kw).transpose(0, 3, 4, 1, 2))
    bias = b.g.params[layer.params[1]] if len(layer.params) > 1 else np.zeros(cog * groups, np.float32)
    b_off = b.weights.add((b.model, layer.id, "b"), lambda: bias)
    r = b.region
    return ("deconv", "tf_deconv_args", [xs[0], y, w_off, b_off, groups, kh, kw, *a["stride"], *a["dilation"],
                                         r.h0 + a["pads"][0], r.w0 + a["pads"][1], win.h0, win.w0,
                                         Acts(tuple(a["act"]))])


def _reshape(b, layer, xs, y):
    return "copy", "tf_copy_args", [xs[0], y]


def _transpose(b, layer, xs, y):
    perm = tuple(layer.attrs["perm"])
    if len(perm) <= 4:
        return "copy", "tf_copy_args", [xs[0].permuted(perm, y.dims), y]
    return _transpose_moves(b, layer, xs[0], y, perm)


def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    return strides


def _transpose_moves(b, layer, x: View, y: View, perm: tuple[int, ...]):
    """A transpose of rank above 4 (views hold 4 dims) as block moves: dims that stay adjacent in
    both tensors merge; the smallest of those left beyond 4 are walked here, one 4-D move each."""
    shape = (b.region.n,) + tuple(b.g.shape(layer.inputs[0])[1:])
    xst, out = _contiguous_strides(shape), [shape[p] for p in perm]
    yst = _contiguous_strides(out)
    dims = [(out[k], xst[perm[k]], yst[k]) for k in range(len(perm)) if out[k] > 1]
    merged: list[tuple[int, int, int]] = []
    for size, xs_, ys_ in dims:
        if merged and merged[-1][1] == xs_ * size and merged[-1][2] == ys_ * size:
            merged[-1] = (merged[-1][0] * size, xs_, ys_)
        else:
            merged.append((size, xs_, ys_))
    walked = sorted(range(len(merged)), key=lambda k: merged[k][0])[: max(0, len(merged) - 4)]
    kept = [merged[k] for k in range(len(merged)) if k not in walked] + [(1, 0, 0)] * (4 - len(merged) + len(walked))
    src, dst = [], []
    for idx in np.ndindex(*[merged[k][0] for k in walked]):
        dx = sum(i * merged[k][1] for i, k in zip(idx, walked))
        dy = sum(i * merged[k][2] for i, k in zip(idx, walked))
        src.append(View(x.off + dx, tuple(d[0] for d in kept), tuple(d[1] for d in kept)))  # type: ignore[arg-type]
        dst.append(View(y.off + dy, tuple(d[0] for d in kept), tuple(d[2] for d in kept)))  # type: ignore[arg-type]
    act = tuple(layer.attrs.get("act", ()))
    return "moves", "tf_moves_args", [y, len(src), Array("tf_view", tuple(src)), Array("tf_view", tuple(dst)), Acts(act)]


def _shuffle(b, layer, xs, y):
    return "shuffle", "tf_shuffle_args", [xs[0], y, layer.attrs["groups"]]


# Registered op -> its binder: (kind, argument struct, values) of one step.
BINDERS = {
    "conv": _conv, "maxpool": _pool, "avgpool": _pool, "global_pool": _global, "gemm": _gemm, "softmax": _softmax,
    "add": _eltwise, "mul": _eltwise, "eltwise": _eltwise, "activation": _activation, "batchnorm": _batchnorm,
    "lrn": _lrn, "concat": _concat_any, "pad": _pad, "resize": _resize, "flatten": _reshape, "reshape": _reshape,
    "transpose": _transpose, "channel_shuffle": _shuffle, "channel_norm": _norm, "instancenorm": _norm,
    "channel_reduce": _channel_reduce, "slice": _slice, "depth_to_space": _depth_space,
    "space_to_depth": _depth_space, "conv_transpose": _conv_transpose,
}


# --- int8 (quantized layers, issue 40) -------------------------------------------------------------
# Multipliers are computed in float32 in onnxruntime's order (x_scale * w_scale / y_scale), so the
# kernels' requantization rounds the very float that onnxruntime's QLinearConv / QGemm rounds. A layer
# imported from a .tflite file (attrs["rounding"] == "tflite") requantizes as TFLite's reference
# kernels and TFLite Micro do: a fixed-point multiplier and shift made by QuantizeMultiplier from the
# scales in double precision, in the order TFLite Micro's Prepare functions multiply them.
_ROUND_ORT = Code("ROUND", "onnxruntime")


def _tflite(layer: Layer) -> bool:
    return layer.attrs.get("rounding") == "tflite"


def _rounding(layer: Layer) -> Code:
    return Code("ROUND", "tflite" if _tflite(layer) else "onnxruntime")


def quantize_multiplier(real: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier: real = q * 2^(shift - 31), q a Q31 fraction in [2^30, 2^31)
    rounded half away from zero (std::round); below 2^-31 it flushes to zero."""
    if real == 0.0:
        return 0, 0
    frac, shift = math.frexp(real)
    q = math.floor(abs(frac) * (1 << 31) + 0.5) * (1 if frac >= 0 else -1)  # exact: frac * 2^31 is a double
    if q == 1 << 31:
        q, shift = q // 2, shift + 1
    if shift < -31:
        return 0, 0
    return int(q), int(shift)

def _tq(b: Bind, tensor: str) -> tuple[float, int]:
    """An int8 tensor's (scale, zero point)."""
    q = b.g.tensors[tensor].quant
    if q is None or not q.per_tensor:
        raise KernelError(f"tensor {tensor!r} has no per-tensor quantization (an int8 kernel reads it)")
    return q.scale[0], q.zero_point[0]


def _qparams(b: Bind, x: str, y: str) -> Struct:
    (xs, xz), (ys, yz) = _tq(b, x), _tq(b, y)
    return Struct("tf_qparams", (xs, xz, ys, yz))


def _qclamp(layer: Layer, ys: float, yz: int) -> tuple[int, int]:
    """A fused ReLU / Clip as bounds on the int8 output: the quantization is monotone, so
    clamping the quantized value at Q(lo), Q(hi) is quantizing the clamped real."""
    lo, hi = INT8_RANGE
    bounds = clamp_bounds(tuple(layer.attrs.get("act", ())))
    if bounds is None:
        if layer.attrs.get("act"):
            raise KernelError(f"layer {layer.id} ({layer.name}): activations {layer.attrs['act']} have no int8 kernel")
        return lo, hi
    f32 = np.float32

    def q(v: float) -> int:
        if not math.isfinite(v):
            return lo if v < 0 else hi
        r = f32(v) / f32(ys)  # TFLite's CalculateActivationRangeQuantized rounds half away from zero
        rounded = math.copysign(math.floor(abs(float(r)) + 0.5), float(r)) if _tflite(layer) else float(np.rint(r))
        return int(np.clip(rounded + yz, lo, hi))

    return max(lo, q(bounds[0])), min(hi, q(bounds[1]))


def _multipliers(b: Bind, layer: Layer, outs: int) -> int:
    (xs, _), (ys, _) = _tq(b, layer.inputs[0]), _tq(b, layer.output)
    if _tflite(layer):
        return b.weights.add_words((b.model, layer.id, "m"), lambda: _tflite_multipliers(layer, xs, ys, outs))
    ws = np.broadcast_to(np.asarray(layer.attrs["w_scale"], np.float32), (outs,))
    return b.weights.add((b.model, layer.id, "m"), lambda: (np.float32(xs) * ws) / np.float32(ys))


def _tflite_multipliers(layer: Layer, xs: float, ys: float, outs: int) -> np.ndarray:
    """(multiplier, shift) int32 pairs per output channel. Per channel, TFLite Micro multiplies the
    scales in double (x * w / y); a per-tensor FULLY_CONNECTED multiplies x * w in float first
    (GetQuantizedConvolutionMultipler)."""
    ws = layer.attrs["w_scale"]
    if layer.op == "gemm" and len(ws) == 1:
        reals = [float(np.float32(xs) * np.float32(ws[0])) / float(np.float32(ys))] * outs
    else:
        wb = np.broadcast_to(np.asarray(ws, np.float32), (outs,))
        reals = [float(np.float32(xs)) * float(w) / float(np.float32(ys)) for w in wb]
    return np.asarray([quantize_multiplier(r) for r in reals], np.int32).reshape(-1)


def _qbias(b: Bind, layer: Layer) -> int:
    if len(layer.params) < 2:
        return -1
    return b.weights.add_words((b.model, layer.id, "b"), lambda: b.g.params[layer.params[1]].astype(np.int32))


def _qconv_weights(w: np.ndarray, groups: int) -> np.ndarray:
    """An int8 convolution's weights (C_out, C_in / groups, kh, kw) as its kernel reads them (tf_kernels.c,
    qconv): dense, the GEMM's (K4 / 4, C_out, 4) bytes (K = kh * kw * C_in tap-major, zero-padded to a
    multiple of 4) then each output channel's int32 weight sum; depthwise, (kh * kw, C); grouped,
    (C_out, kh, kw, C_in / groups)."""
    cout, cin_g, kh, kw = w.shape
    if groups == 1:
        k = kh * kw * cin_g
        rows = np.zeros((cout, -(-k // 4) * 4), np.int8)
        rows[:, :k] = w.transpose(0, 2, 3, 1).reshape(cout, k)
        packed = rows.reshape(cout, -1, 4).transpose(1, 0, 2).reshape(-1)
        wsum = w.reshape(cout, -1).astype(np.int32).sum(axis=1).astype(np.int32)
        return np.concatenate([packed.view(np.uint8), wsum.view(np.uint8)])
    if cin_g == 1 and groups == cout:
        return w.reshape(cout, kh * kw).T
    return w.transpose(0, 2, 3, 1)


def _qconv(b, layer, xs, y):
    a = layer.attrs
    win = _win(b, layer)[0]
    w = b.g.params[layer.params[0]]
    cout, cin_g, kh, kw = w.shape
    _expect(cin_g * a["groups"] == b.g.shape(layer.inputs[0])[1] and cout == b.g.shape(layer.output)[1], layer,
            f"weight {w.shape} for {b.g.shape(layer.inputs[0])[1]} -> {b.g.shape(layer.output)[1]} channels")
    w_off = b.weights.add_words((b.model, layer.id, "w"), lambda: _qconv_weights(w.astype(np.int8), a["groups"]))
    (_, xz), (ys, yz) = _tq(b, layer.inputs[0]), _tq(b, layer.output)
    lo, hi = _qclamp(layer, ys, yz)
    return ("qconv", "tf_qconv_args", [xs[0], y, w_off, _qbias(b, layer), _multipliers(b, layer, cout), a["groups"], kh, kw,
                                       *a["stride"], *a["dilation"], win.pad[0], win.pad[2], xz, yz, lo, hi,
                                       _rounding(layer)])


def _qgemm(b, layer, xs, y):
    w = b.g.params[layer.params[0]]
    features = int(np.prod(b.g.shape(layer.inputs[0])[1:]))
    _expect(w.shape == (b.g.shape(layer.output)[1], features), layer, f"weight {w.shape} for {features} input features")
    w_off = b.weights.add_words((b.model, layer.id, "w"), lambda: w.astype(np.int8))
    (_, xz), (ys, yz) = _tq(b, layer.inputs[0]), _tq(b, layer.output)
    lo, hi = _qclamp(layer, ys, yz)
    return ("qgemm", "tf_qgemm_args", [xs[0], y, w_off, _qbias(b, layer), _multipliers(b, layer, w.shape[0]), features,
                                       xz, yz, lo, hi, _rounding(layer)])


def _qadd(b, layer, xs, y):
    (sa, za), (sb, zb), (sy, zy) = (_tq(b, t) for t in (*layer.inputs, layer.output))
    lo, hi = _qclamp(layer, sy, zy)
    return "qadd", "tf_qadd_args", [xs[0], xs[1], y, sa, za, sb, zb, sy, zy, lo, hi, _rounding(layer),
                                    *(_tflite_add(sa, sb, sy) if _tflite(layer) else (0,) * 6)]


def _tflite_add(sa: float, sb: float, sy: float) -> tuple[int, ...]:
    """TFLite Micro's ADD multipliers (add_common.cc): inputs scaled to twice the larger input
    scale after a left shift of 20, the sum to the output's scale."""
    twice = 2.0 * float(max(np.float32(sa), np.float32(sb)))
    reals = (float(np.float32(sa)) / twice, float(np.float32(sb)) / twice, twice / ((1 << 20) * float(np.float32(sy))))
    return tuple(v for r in reals for v in quantize_multiplier(r))


def _qmul(b, layer, xs, y):
    """TFLite's int8 MUL: the multiplier of sa * sb / sy in double (TFLite Micro's mul Prepare)."""
    if not _tflite(layer):
        raise KernelError(f"layer {layer.id} ({layer.name}): an int8 mul runs as TFLite's only (rounding tflite)")
    (sa, za), (sb, zb), (sy, zy) = (_tq(b, t) for t in (*layer.inputs, layer.output))
    lo, hi = _qclamp(layer, sy, zy)
    m, shift = quantize_multiplier(float(np.float32(sa)) * float(np.float32(sb)) / float(np.float32(sy)))
    return "qmul", "tf_qadd_args", [xs[0], xs[1], y, sa, za, sb, zb, sy, zy, lo, hi, _rounding(layer),
                                    0, 0, 0, 0, m, shift]


NCHWC_BLOCK = 16


def _qpool(b, layer, xs, y):
    """onnxruntime fuses an average pool into QLinearAveragePool where its QDQ selector takes it
    (the importer's `ort_fused`): its arithmetic differs from the float AveragePool's, and both
    are followed; a fused pool over the whole input without padding is its global average."""
    a = layer.attrs
    fused = bool(a.get("ort_fused"))
    h, w = b.g.shape(layer.inputs[0])[2:]
    if _tflite(layer):  # TFLite's pools: x and y quantized alike (the importer checks), an integer average
        fields = _pool(b, layer, xs, y)[2]
        fields[-1] = Acts(())
        return ("qpool", "tf_qpool_args", [Struct("tf_pool_args", tuple(fields)),
                                           _qparams(b, layer.inputs[0], layer.output), 3])
    if fused and layer.op == "avgpool" and tuple(a["kernel"]) == (h, w) and not any(a["pads"]):
        return _qglobal(b, layer, xs, y)
    # onnxruntime's float AveragePool (ORT_ENABLE_ALL, AVX-512 x86; found by experiment) sums a window
    # row by row over the whole input (its global path) or where its NCHWc transformer takes the pool
    # (channels a multiple of the block, 16 on AVX-512), else column by column (its NCHW kernel; a
    # window two columns wide was seen summed either way).
    whole = layer.op == "avgpool" and (tuple(a["kernel"]) == (h, w) and not any(a["pads"])
                                       or b.g.shape(layer.inputs[0])[1] % NCHWC_BLOCK == 0)
    fields = _pool(b, layer, xs, y)[2]
    fields[-1] = Acts(())
    return ("qpool", "tf_qpool_args", [Struct("tf_pool_args", tuple(fields)), _qparams(b, layer.inputs[0], layer.output),
                                       1 if fused else 2 if whole else 0])


def _qglobal(b, layer, xs, y):
    (xs_, _), (ys, _) = _tq(b, layer.inputs[0]), _tq(b, layer.output)
    h, w = b.g.shape(layer.inputs[0])[2:]
    m = float(np.float32(xs_) / (np.float32(ys) * np.float32(h * w)))  # MLAS: ScaleInput / (ScaleOutput * ImageSize)
    kind = Code("GLOBAL", "max" if layer.attrs.get("kind") == "max" else "mean")
    qm, qs = _tflite_mean(xs_, ys, h * w) if _tflite(layer) else (0, 0)
    return "qglobal", "tf_qglobal_args", [xs[0], y, kind, m, _qparams(b, layer.inputs[0], layer.output),
                                          _rounding(layer), qm, qs]


def _tflite_mean(xs: float, ys: float, count: int) -> tuple[int, int]:
    """TFLite's MEAN (reference_ops::QuantizedMeanOrSum): the multiplier of xs / ys shifted left by
    floor(log2 count) (at most 32 and 31 + its shift) and divided by the count, truncating."""
    m, s = quantize_multiplier(float(np.float32(xs)) / float(np.float32(ys)))
    shift = min(count.bit_length() - 1, 32, 31 + s)
    return int((m << shift) // count) if m >= 0 else -int((-m << shift) // count), s - shift


def _qconcat(b, layer, xs, y):
    qs = tuple(_qparams(b, t, layer.output) for t in layer.inputs)
    return "qconcat", "tf_qconcat_args", [y, len(xs), Array("tf_view", tuple(xs)), Array("tf_qparams", qs)]


def _qcopy(b, layer, xs, y):
    x = xs[0]
    if layer.op == "transpose":
        perm = tuple(layer.attrs["perm"])
        if len(perm) > 4:
            raise KernelError(f"layer {layer.id} ({layer.name}): an int8 transpose of rank {len(perm)} (at most 4)")
        x = x.permuted(perm, y.dims)
    return "qcopy", "tf_quant_args", [x, y, Struct("tf_qparams", (1.0, 0, 1.0, 0)), *INT8_RANGE, _ROUND_ORT]


def _quantize(b, layer, xs, y):
    q = (1.0, 0, layer.attrs["scale"], layer.attrs["zero_point"])
    return "quantize", "tf_quant_args", [xs[0], y, Struct("tf_qparams", q), *INT8_RANGE, _rounding(layer)]


def _dequantize(b, layer, xs, y):
    q = (layer.attrs["scale"], layer.attrs["zero_point"], 1.0, 0)
    return "dequantize", "tf_quant_args", [xs[0], y, Struct("tf_qparams", q), *INT8_RANGE, _ROUND_ORT]


def _qactivation(b, layer, xs, y):
    """A ReLU or Clip between DequantizeLinear and QuantizeLinear: onnxruntime dequantizes, clamps
    in float and quantizes; the quantization is monotone, so that is requantizing and clamping at
    the bounds' quantized values."""
    (_, _), (ys, yz) = _tq(b, layer.inputs[0]), _tq(b, layer.output)
    return "qcopy", "tf_quant_args", [xs[0], y, _qparams(b, layer.inputs[0], layer.output), *_qclamp(layer, ys, yz),
                                      _ROUND_ORT]


def _qsoftmax(b, layer, xs, y):
    """TFLite's int8 SOFTMAX (softmax_common.cc's CalculateSoftmaxParams, beta 1): the input scale
    times 2^26 (differences in Q5.26) as a multiplier and left shift, and the smallest difference
    that still counts."""
    if not _tflite(layer):
        raise KernelError(f"layer {layer.id} ({layer.name}): an int8 softmax runs as TFLite's only (rounding tflite)")
    (xs_, _), (ys, yz) = _tq(b, layer.inputs[0]), _tq(b, layer.output)
    _expect(ys == 1.0 / 256 and yz == -128, layer, f"an int8 softmax output of scale {ys}, zero point {yz} "
                                                   "(TFLite's is 1/256, -128)")
    real = min(float(layer.attrs.get("beta", 1.0)) * float(np.float32(xs_)) * (1 << 26), (1 << 31) - 1.0)
    m, shift = quantize_multiplier(real)
    diff_min = -math.floor(31.0 * (1 << 26) / (1 << shift))  # CalculateInputRadius(5, shift)
    return "qsoftmax", "tf_qsoftmax_args", [xs[0], y, m, shift, int(diff_min)]


BINDERS.update({"quantize": _quantize, "dequantize": _dequantize})
# Ops with an int8 kernel: a layer the importer marked quantized (ops/quant.quantized) binds here.
INT8_BINDERS = {
    "conv": _qconv, "gemm": _qgemm, "add": _qadd, "maxpool": _qpool, "avgpool": _qpool, "global_pool": _qglobal,
    "concat": _qconcat, "flatten": _qcopy, "reshape": _qcopy, "transpose": _qcopy, "activation": _qactivation,
    "softmax": _qsoftmax, "mul": _qmul,
}
# --- end int8 ---------------------------------------------------------------------------------------

# --- issue 38: attention blocks (ops/attention.py) ------------------------------------------------
# A view holds 4 dims; tensors of rank 2-4 map their dims onto it in order (lower ranks padded with
# trailing 1s, as _dims4 does), so a binder sees every dim of the tensor with its stride and may
# put the axis a kernel works along where that kernel reads it (C for softmax and norms).

def _dims_strides(v: View, shape: Sequence[int]) -> tuple[list[int], list[int]]:
    """The dims of a tensor of logical `shape` as view `v` holds them (its batch the view's) and
    their element strides; a tensor above rank 4 is held contiguous (folded into W)."""
    dims = [v.dims[0], *shape[1:]]
    if len(shape) == 4:  # a region's view: a band of rows of a rank-4 tensor (ops over its last axis)
        return list(v.dims), list(v.strides)
    if len(shape) < 4:
        return dims, list(v.strides[: len(shape)])
    return dims, _contiguous_strides(dims)


def _view4(off: int, dims: Sequence[int], strides: Sequence[int]) -> View:
    """dims of any rank as a 4-dim view in the same logical order: dims of 1 dropped, dims that
    lie one after the other in memory merged, 1s in front."""
    kept: list[tuple[int, int]] = []
    for d, s in zip(dims, strides):
        if d == 1:
            continue
        if kept and kept[-1][1] == s * d:
            kept[-1] = (kept[-1][0] * d, s)
        else:
            kept.append((d, s))
    if len(kept) > 4:
        raise KernelError(f"a block of dims {tuple(dims)} and strides {tuple(strides)} needs more than 4 view dims")
    kept = [(1, 0)] * (4 - len(kept)) + kept
    return View(off, tuple(d for d, _ in kept), tuple(s for _, s in kept))  # type: ignore[arg-type]


def _padded(dims: list[int], strides: list[int]) -> tuple[list[int], list[int]]:
    return dims + [1] * (4 - len(dims)), strides + [0] * (4 - len(strides))


def _axis_as_channels(v: View, shape: Sequence[int], axis: int) -> View:
    """View `v` of a tensor with `axis` moved to C (kernels over C at every place: softmax, norm);
    above rank 4 (contiguous), the dims before and those after the axis each merged into one."""
    dims, strides = _dims_strides(v, shape)
    if len(dims) > 4:
        others = _view4(v.off, dims[:axis] + dims[axis + 1 :], strides[:axis] + strides[axis + 1 :])
        if others.dims[0] != 1:
            raise KernelError(f"dims {tuple(dims)} of strides {tuple(strides)} around axis {axis} do not merge")
        return View(v.off, (others.dims[1], dims[axis]) + others.dims[2:], (others.strides[1], strides[axis]) + others.strides[2:])  # type: ignore[arg-type]
    dims, strides = _padded(dims, strides)
    order = [0, axis] + [k for k in range(1, 4) if k != axis]
    return View(v.off, tuple(dims[k] for k in order), tuple(strides[k] for k in order))  # type: ignore[arg-type]


def _softmax_axis(b, layer, xs, y):
    shape, axis = b.g.shape(layer.inputs[0]), layer.attrs["axis"]
    return "softmax", "tf_softmax_args", [_axis_as_channels(xs[0], shape, axis), _axis_as_channels(y, shape, axis),
                                          int(bool(layer.attrs.get("log")))]


def _layer_norm(b, layer, xs, y):
    shape = b.g.shape(layer.inputs[0])
    s_off = b.weights.add((b.model, layer.id, "scale"), lambda: b.g.params[layer.params[0]])
    b_off = b.weights.add((b.model, layer.id, "bias"), lambda: b.g.params[layer.params[1]])
    axis = len(shape) - 1
    return "channel_norm", "tf_norm_args", [_axis_as_channels(xs[0], shape, axis), _axis_as_channels(y, shape, axis),
                                            s_off, b_off, float(layer.attrs["epsilon"]), Acts(tuple(layer.attrs["act"]))]


def _matmul(b, layer, xs, y):
    """a, b and y as (batch, batch, rows, cols) views, the inputs' batch dims broadcast to y's (a
    transposed operand: its last two dims swapped)."""
    out = b.g.shape(layer.output)
    ydims, ystrides = _dims_strides(y, out)
    views = []
    for x, t, trans in zip(xs, layer.inputs, (layer.attrs.get("trans_a"), layer.attrs.get("trans_b"))):
        dims, strides = _dims_strides(x, b.g.shape(t))
        if trans:
            dims, strides = dims[:-2] + dims[:-3:-1], strides[:-2] + strides[:-3:-1]
        lead = len(out) - len(dims)
        dims, strides = dims[:1] + [1] * lead + dims[1:], strides[:1] + [0] * lead + strides[1:]
        strides = [0 if d == 1 else s for d, s in zip(dims, strides)]
        dims = [ydims[k] if k < len(out) - 2 else d for k, d in enumerate(dims)]
        views.append((dims, strides))
    views.append((ydims, ystrides))
    views = _merged_batch(layer, views)
    four = []
    for (dims, strides), v in zip(views, list(xs) + [y]):
        lead = 4 - len(dims)  # batch dims padded after N: (N, 1, M, K) for rank 3
        four.append(View(v.off, tuple(dims[:1] + [1] * lead + dims[1:]), tuple(strides[:1] + [0] * lead + strides[1:])))  # type: ignore[arg-type]
    return "matmul", "tf_matmul_args", [*four, Acts(tuple(layer.attrs["act"]))]


def _merged_batch(layer: Layer, views: list[tuple[list[int], list[int]]]) -> list[tuple[list[int], list[int]]]:
    """(dims, strides) of a, b, y with the batch dims after N merged into one where there are
    more than one (rank-5 attention: (N, windows, heads, T, d)): each pair merged must lie one
    after the other in every view (a broadcast pair: stride 0 in both dims)."""
    while len(views[0][0]) > 4:
        k = 1  # merge dims 1 and 2
        for dims, strides in views:
            _expect(1 in dims[k : k + 2] or strides[k] == strides[k + 1] * dims[k + 1], layer,
                    f"batch dims {dims} of strides {strides} (not contiguous)")
        views = [(d[:k] + [d[k] * d[k + 1]] + d[k + 2 :], s[:k] + [s[k] if d[k + 1] == 1 else s[k + 1]] + s[k + 2 :])
                 for d, s in views]
    return views


def _linear(b, layer, xs, y):
    """A Linear over the last axis of data of rank 3-6 (issue 38): x and y with that axis as W and
    the others before it (above 3 of them, merged: tensors above rank 4 are contiguous, and x and
    y have the same dims there, so they merge alike)."""
    w = b.g.params[layer.params[0]]
    views = []
    for v, t in ((xs[0], layer.inputs[0]), (y, layer.output)):
        dims, strides = _dims_strides(v, b.g.shape(t))
        if len(dims) <= 4:
            rows, row_strides = [1] * (4 - len(dims)) + dims[:-1], [0] * (4 - len(dims)) + strides[:-1]
        else:
            lead = _view4(v.off, dims[:-1], strides[:-1])
            _expect(lead.dims[0] == 1, layer, f"rows of dims {dims} and strides {strides}")
            rows, row_strides = list(lead.dims[1:]), list(lead.strides[1:])
        views.append(View(v.off, tuple(rows) + (dims[-1],), tuple(row_strides) + (strides[-1],)))  # type: ignore[arg-type]
    _expect(w.shape == (layer.attrs["out_features"], views[0].dims[3]), layer, f"weight {w.shape} for {views[0].dims[3]} features")
    w_off = b.weights.add((b.model, layer.id, "w"), lambda: w)
    b_off = b.weights.add((b.model, layer.id, "b"), lambda: b.g.params[layer.params[1]]) if len(layer.params) > 1 else -1
    return "linear", "tf_linear_args", [views[0], views[1], w_off, b_off, Acts(tuple(layer.attrs["act"]))]


def _eltwise_merged(b, layer, xs, y):
    """Operands of rank 5-6 (held contiguous) with the dims merged that every operand holds whole
    or broadcasts alike (ops.binary.merged_dims), as 4-dim views and constants."""
    out = b.g.shape(layer.output)
    shapes = [b.g.shape(t) for t in layer.inputs] + [b.g.params[p].shape for p in layer.params]
    groups = merged_dims(out, shapes)
    _expect(len(groups) <= 4, layer, f"operands {shapes} ({len(groups)} dims after merging)")

    def merged(v: View, shape) -> View:
        dims, strides = _dims_strides(v, shape)
        md = [math.prod(dims[k] for k in g) for g in groups]
        ms = [0 if d == 1 else strides[g[-1]] for d, g in zip(md, groups)]
        return View(v.off, tuple(md + [1] * (4 - len(md))), tuple(ms + [0] * (4 - len(ms))))  # type: ignore[arg-type]

    views = [merged(x, b.g.shape(t)) for x, t in zip(xs, layer.inputs)]
    consts = [(p, b.g.params[p].reshape([math.prod(b.g.params[p].shape[k] for k in g) for g in groups])) for p in layer.params]
    return views, merged(y, out), consts


def _reduce(b, layer, xs, y):
    """x as it is; y with the reduced axes put back as dims of 1 (stride 0) where keepdims dropped them."""
    shape, axes = b.g.shape(layer.inputs[0]), set(layer.attrs["axes"])
    xd, xst = _dims_strides(xs[0], shape)
    yd, yst = _dims_strides(y, b.g.shape(layer.output))
    if not layer.attrs["keepdims"]:
        kept = iter(zip(yd, yst))
        yd, yst = map(list, zip(*[(1, 0) if k in axes else next(kept) for k in range(len(shape))]))
    if len(xd) > 4:  # dims reduced alike or kept alike, one after the other in x and in y, merge
        (xd, xst), (yd, yst) = _merge_joint(layer, [(list(xd), list(xst)), (list(yd), list(yst))])
    xd, xst = _padded(list(xd), list(xst))
    yd, yst = _padded(list(yd), list(yst))
    x4 = View(xs[0].off, tuple(xd), tuple(xst))  # type: ignore[arg-type]
    y4 = View(y.off, tuple(yd), tuple(yst))  # type: ignore[arg-type]
    return "reduce", "tf_reduce_args", [x4, y4, Code("REDUCE", layer.attrs["kind"]), Acts(tuple(layer.attrs["act"]))]


def _merge_joint(layer: Layer, views: list[tuple[list[int], list[int]]]) -> list[tuple[list[int], list[int]]]:
    """Views of one rank with their dims merged into at most 4 (the batch alone first; dims of 1 in
    every view dropped): dim k joins the dim before it where every view has both of size 1 or
    both whole and k's block right after the previous one's elements (stride * size)."""
    rank = len(views[0][0])
    keep = [0] + [k for k in range(1, rank) if any(d[k] > 1 for d, _ in views)]
    groups: list[list[int]] = []
    for k in keep:
        prev = groups[-1][-1] if groups and groups[-1][0] > 0 else None
        if prev is not None and all((d[prev] == 1) == (d[k] == 1) and (d[k] == 1 or s[prev] == s[k] * d[k]) for d, s in views):
            groups[-1].append(k)
        else:
            groups.append([k])
    _expect(len(groups) <= 4, layer, f"dims {[d for d, _ in views]} ({len(groups)} after merging)")
    return [([math.prod(d[k] for k in g) for g in groups], [s[g[-1]] if d[g[-1]] > 1 else 0 for g in groups])
            for d, s in views]


def _gather(b, layer, xs, y):
    """A copy of the block at the index: x's view without the axis, moved to the index."""
    axis, index = layer.attrs["axis"], layer.attrs["index"]
    dims, strides = _dims_strides(xs[0], b.g.shape(layer.inputs[0]))
    off = xs[0].off + index * strides[axis]
    x = _view4(off, dims[:axis] + dims[axis + 1 :], strides[:axis] + strides[axis + 1 :])
    ydims, ystrides = _dims_strides(y, b.g.shape(layer.output))
    return "copy", "tf_copy_args", [x, _view4(y.off, ydims, ystrides)]


def _pad_axes(b, layer, xs, y):
    """pad's kernel, whole, over views whose H and W are the padded axes (a third, if any, as C)."""
    a1, a2 = layer.attrs["axes"]
    t, l, _, _ = layer.attrs["pads"]
    views = []
    for v, name in ((xs[0], layer.inputs[0]), (y, layer.output)):
        dims, strides = _padded(*_dims_strides(v, b.g.shape(name)))
        other = next(k for k in (1, 2, 3) if k not in (a1, a2))
        order = (0, other, a1, a2)
        views.append(View(v.off, tuple(dims[k] for k in order), tuple(strides[k] for k in order)))  # type: ignore[arg-type]
    x4, y4 = views
    return ("pad", "tf_pad_args", [x4, y4, Code("PAD", layer.attrs["mode"]), float(layer.attrs["value"]), 0, 0, 0, 0,
                                   x4.dims[2], x4.dims[3], t, l])


BINDERS.update({"pad_axes": _pad_axes, "matmul": _matmul, "softmax_axis": _softmax_axis, "layer_norm": _layer_norm, "reduce": _reduce,
                "gather": _gather})
