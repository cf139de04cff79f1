"""A plan as C99: the same steps the arena executor runs, each a call of a portable kernel
(c/tf_kernels.c) on views of the caller's arena given by buffer offset and strides, weights as
const data. Pure: a plan and its graphs in, file contents out; the same plan gives the same bytes.

The arena holds everything a run touches besides the stack: the C kernels need no temporaries
(border padding is applied inside the kernels, moves run in address order), so the steps'
`scratch` (torch's temporaries in the Python executor) is not needed here."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Sequence

import numpy as np

from tightfit.export.errors import ExportError
from tightfit.graph.ir import Graph, Layer
from tightfit.ops import get_op
from tightfit.ops.conv import clamp_bounds
from tightfit.ops.resize import Resize
from tightfit.plan.lifetimes import output_accesses
from tightfit.plan.schema import Access, Buffer, Plan, Step

C_DIR = Path(__file__).with_name("c")
SIMD_SOURCE = Path(__file__).parents[1] / "ops" / "_conv.c"
# Above this many weights, C initializers compile slowly (3 M floats: ~10 s and 1 GB of gcc):
# the weights go to a file read once by the program instead.
C_WEIGHTS_LIMIT = 4_000_000

ACTS = {"relu": 1, "leakyrelu": 2, "clip": 3, "sigmoid": 4, "tanh": 5, "hardsigmoid": 6, "hardswish": 7, "silu": 8,
        "mish": 9, "gelu": 10, "gelu_tanh": 11, "softplus": 12, "elu": 13, "selu": 14, "sqrt": 15, "exp": 16, "log": 17,
        "neg": 18, "abs": 19, "reciprocal": 20, "erf": 21}
# tf_kernels.h's TF_ELT_*: how an elementwise layer's operands combine.
ELT_FNS = {"add": 0, "mul": 1, "sub": 2, "div": 3, "pow": 4, "min": 5, "max": 6, "prelu": 7, "clip": 8}
MAX_ACTS = 4
MAX_OPERANDS = 8


# --- the values a step's arguments are made of ------------------------------------------------

def c_float(v: float) -> str:
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    return f"{float(np.float32(v))!r}f"


@dataclass(frozen=True)
class View:
    """tf_view: element offset in the arena and a logical (N, C, H, W) block with element strides."""

    off: int
    dims: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]

    def c(self) -> str:
        return "{" + ", ".join(str(v) for v in (self.off,) + self.dims + self.strides) + "}"

    def permuted(self, perm: Sequence[int], dims: tuple[int, int, int, int]) -> "View":
        """This view read in the order of a transpose: output dim k is input dim perm[k]."""
        perm = tuple(perm) + tuple(range(len(perm), 4))
        return View(self.off, dims, tuple(self.strides[p] for p in perm))  # type: ignore[arg-type]


def _dims4(shape: Sequence[int]) -> tuple[int, int, int, int]:
    if len(shape) > 4:
        raise ExportError(f"tensors of rank {len(shape)} are not exported (at most 4)")
    return tuple(shape) + (1,) * (4 - len(shape))  # type: ignore[return-value]


def buffer_strides(b: Buffer) -> tuple[int, int, int, int]:
    if b.layout == "nhwc":
        _, c, h, w = b.shape
        return (h * w * c, 1, w * c, c)
    n, c, h, w = _dims4(b.shape)
    return (c * h * w, h * w, w, 1)


def access_view(b: Buffer, a: Access, copy: int, shape: Sequence[int]) -> View:
    """The executor's access_view as a C view; `shape` is the tensor's logical shape."""
    if b.itemsize != 4:
        raise ExportError(f"buffer {b.id} holds {b.itemsize}-byte items; the C export runs fp32 plans")
    base = b.offsets[copy % b.copies] // 4
    strides = buffer_strides(b)
    r = a.region
    if len(b.shape) == 4:
        n, h, w = a.at
        return View(base + n * strides[0] + h * strides[2] + w * strides[3], (r.n, b.shape[1], r.h, r.w), strides)
    return View(base + a.at[0] * strides[0], (r.n,) + _dims4(shape)[1:], strides)


class Pool:
    """Constant data (weights, index tables) appended once per key; offsets in elements, each
    array starting on a 64-byte boundary (a vector load of 16 floats then never straddles two
    cache lines: unaligned, the dense kernel ran at half speed)."""

    ALIGN = 16

    def __init__(self, dtype: type) -> None:
        self.dtype, self.parts, self.size, self.at = dtype, [], 0, {}

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

    def array(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.zeros(0, self.dtype)


def acts_c(chain: Sequence[tuple]) -> str:
    """A pointer to the chain (a compound literal of static storage), NULL for none."""
    if not chain:
        return "NULL"
    if len(chain) > MAX_ACTS:
        raise ExportError(f"an activation chain of {len(chain)} (at most {MAX_ACTS} are exported)")
    kinds, a, b = [0] * MAX_ACTS, [0.0] * MAX_ACTS, [0.0] * MAX_ACTS
    for i, (kind, *args) in enumerate(chain):
        if kind not in ACTS:
            raise ExportError(f"activation {kind!r} has no C kernel")
        kinds[i] = ACTS[kind]
        a[i], b[i] = (list(args) + [0.0, 0.0])[:2]
    return ("&(const tf_acts){{" + ", ".join(map(str, kinds)) + "}, {" + ", ".join(map(c_float, a)) + "}, {"
            + ", ".join(map(c_float, b)) + "}}")


# --- one step ---------------------------------------------------------------------------------

@dataclass
class Emitted:
    kind: str     # TF_STEP_*
    ctype: str    # the argument struct's type
    init: str     # its initializer
    comment: str


@dataclass
class Context:
    plan: Plan
    graphs: Sequence[Graph]
    copy: int
    weights: Pool = field(default_factory=lambda: Pool(np.float32))
    indices: Pool = field(default_factory=lambda: Pool(np.int32))

    def view(self, model: int, a: Access) -> View:
        return access_view(self.plan.buffers[a.buffer], a, self.copy, self.graphs[model].shape(a.tensor))


def emit_step(ctx: Context, s: Step) -> Emitted:
    r = s.out.region
    where = f"samples {r.n0}-{r.n1} rows {r.h0}-{r.h1} cols {r.w0}-{r.w1} of {s.out.tensor!r} -> buffer {s.out.buffer}"
    y = ctx.view(s.model, s.out)
    if s.kind == "input":
        return Emitted("TF_STEP_INPUT", "tf_input_args", f"{{{y.c()}, {r.n0}, {r.h0}, {r.w0}}}", f"input: {where}")
    if s.kind == "copy":
        x = ctx.view(s.model, s.inputs[0])
        return Emitted("TF_STEP_COPY", "tf_copy_args", f"{{{x.c()}, {y.c()}}}", f"copy from buffer {s.inputs[0].buffer}: {where}")
    g = ctx.graphs[s.model]
    layer = g.layers[s.layer]
    if layer.op not in EMITTERS:
        raise ExportError(f"layer {layer.id} ({layer.name}): op {layer.op!r} has no C kernel")
    xs = [ctx.view(s.model, a) for a in s.inputs]
    kind, ctype, init = EMITTERS[layer.op](ctx, s, g, layer, xs, y)
    return Emitted(kind, ctype, init, f"L{layer.id} {layer.op} {layer.name!r}: {where}")


def _windows(s: Step, g: Graph, layer: Layer, batch: int):
    in_shapes = [(batch,) + g.shape(t)[1:] for t in layer.inputs]
    return get_op(layer.op).input_windows(layer, s.out.region, in_shapes)


def _conv(ctx: Context, s: Step, g: Graph, layer: Layer, xs: list[View], y: View):
    a = layer.attrs
    win = _windows(s, g, layer, ctx.plan.models[s.model].batch)[0]
    w = g.params[layer.params[0]]
    cout, cin_g, kh, kw = w.shape
    groups = a["groups"]
    # The C kernel reads the weight for the views' channels: they must agree (import checks it).
    _expect(cin_g * groups == g.shape(layer.inputs[0])[1] and cout == g.shape(layer.output)[1] and (kh, kw) == tuple(a["kernel"]),
            layer, f"weight {w.shape} for {g.shape(layer.inputs[0])[1]} -> {g.shape(layer.output)[1]} channels")
    kind = ("TF_CONV_DENSE" if groups == 1 and tuple(a["dilation"]) == (1, 1) else
            "TF_CONV_DEPTHWISE" if groups == cout == cin_g * groups and cin_g == 1 else "TF_CONV_GROUPED")
    bias = g.params[layer.params[1]] if len(layer.params) > 1 else np.zeros(cout, np.float32)
    if kind == "TF_CONV_DENSE":
        panels = -(-cout // 16)
        taps = np.zeros((kh * kw * cin_g, panels * 16), np.float32)
        taps[:, :cout] = w.transpose(2, 3, 1, 0).reshape(-1, cout)
        w_off = ctx.weights.add((s.model, layer.id, "w"), lambda: taps.reshape(-1, panels, 16).transpose(1, 0, 2))
        b_off = ctx.weights.add((s.model, layer.id, "b"), lambda: np.pad(bias, (0, panels * 16 - cout)))
    elif kind == "TF_CONV_DEPTHWISE":
        w_off = ctx.weights.add((s.model, layer.id, "w"), lambda: w.transpose(2, 3, 1, 0).reshape(kh * kw, cout))
        b_off = ctx.weights.add((s.model, layer.id, "b"), lambda: bias)
    else:
        cog = cout // groups
        w_off = ctx.weights.add((s.model, layer.id, "w"), lambda: w.reshape(groups, cog, cin_g, kh, kw).transpose(0, 3, 4, 2, 1))
        b_off = ctx.weights.add((s.model, layer.id, "b"), lambda: bias)
    clamp = clamp_bounds(a["act"])
    lo, hi = clamp if clamp is not None else (-math.inf, math.inf)
    rest = () if clamp is not None else a["act"]
    fields = [xs[0].c(), y.c(), w_off, b_off, kind, groups, kh, kw, *a["stride"], *a["dilation"], win.pad[0], win.pad[2],
              c_float(lo), c_float(hi), acts_c(rest)]
    return "TF_STEP_CONV", "tf_conv_args", "{" + ", ".join(map(str, fields)) + "}"


def _expect(condition: bool, layer: Layer, what: str) -> None:
    if not condition:
        raise ExportError(f"layer {layer.id} ({layer.name}): {what} do not agree (an inconsistent graph)")


def _pool(ctx: Context, s: Step, g: Graph, layer: Layer, xs: list[View], y: View):
    a = layer.attrs
    win = _windows(s, g, layer, ctx.plan.models[s.model].batch)[0]
    r = s.out.region
    pt, pl, pb, pr = a["pads"]
    in_h, in_w = g.shape(layer.inputs[0])[2:]
    fields = [xs[0].c(), y.c(), "TF_POOL_MAX" if layer.op == "maxpool" else "TF_POOL_AVG", int(a.get("count_include_pad", False)),
              *a["kernel"], *a["stride"], *a.get("dilation", (1, 1)), win.pad[0], win.pad[2], r.h0, r.w0, in_h, in_w,
              pt, pl, pb, pr, acts_c(a["act"])]
    return "TF_STEP_POOL", "tf_pool_args", "{" + ", ".join(map(str, fields)) + "}"


def _global(ctx, s, g, layer, xs, y):
    kind = "TF_GLOBAL_MAX" if layer.attrs["kind"] == "max" else "TF_GLOBAL_MEAN"
    return "TF_STEP_GLOBAL", "tf_global_args", f"{{{xs[0].c()}, {y.c()}, {kind}, {acts_c(layer.attrs['act'])}}}"


def _gemm(ctx, s, g, layer, xs, y):
    w = g.params[layer.params[0]]
    features = int(np.prod(g.shape(layer.inputs[0])[1:]))
    _expect(w.shape == (g.shape(layer.output)[1], features), layer, f"weight {w.shape} for {features} input features")
    w_off = ctx.weights.add((s.model, layer.id, "w"), lambda: w)
    b_off = ctx.weights.add((s.model, layer.id, "b"), lambda: g.params[layer.params[1]]) if len(layer.params) > 1 else -1
    fields = [xs[0].c(), y.c(), w_off, b_off, w.shape[1], acts_c(layer.attrs["act"])]
    return "TF_STEP_GEMM", "tf_gemm_args", "{" + ", ".join(map(str, fields)) + "}"


def _softmax(ctx, s, g, layer, xs, y):
    return "TF_STEP_SOFTMAX", "tf_softmax_args", f"{{{xs[0].c()}, {y.c()}, {int(bool(layer.attrs.get('log')))}}}"


def _norm(ctx, s, g, layer, xs, y):
    s_off = ctx.weights.add((s.model, layer.id, "scale"), lambda: g.params[layer.params[0]])
    b_off = ctx.weights.add((s.model, layer.id, "bias"), lambda: g.params[layer.params[1]])
    kind = "TF_STEP_CHANNEL_NORM" if layer.op == "channel_norm" else "TF_STEP_INSTANCE_NORM"
    return kind, "tf_norm_args", (f"{{{xs[0].c()}, {y.c()}, {s_off}, {b_off}, {c_float(layer.attrs['epsilon'])}, "
                                  f"{acts_c(layer.attrs['act'])}}}")


def _channel_reduce(ctx, s, g, layer, xs, y):
    kind = "TF_GLOBAL_MAX" if layer.attrs["kind"] == "max" else "TF_GLOBAL_MEAN"
    return "TF_STEP_CHANNEL_REDUCE", "tf_global_args", f"{{{xs[0].c()}, {y.c()}, {kind}, {acts_c(layer.attrs['act'])}}}"


def _eltwise(ctx, s, g, layer, xs, y):
    r = s.out.region
    operands = [f"{{0, {x.c()}, 0, 0, 0, 0, 0, 0}}" for x in xs]
    for p in layer.params:
        arr = g.params[p]
        _, c, h, w = _dims4(arr.shape)
        off = ctx.weights.add((s.model, layer.id, p), lambda arr=arr: arr)
        operands.append(f"{{1, {{0}}, {off}, {c}, {h}, {w}, {r.h0 if h > 1 else 0}, {r.w0 if w > 1 else 0}}}")
    if len(operands) > MAX_OPERANDS:
        raise ExportError(f"layer {layer.id}: {len(operands)} operands (at most {MAX_OPERANDS} are exported)")
    if "order" in layer.attrs:  # data input i >= 0, constant -1 - j: the node's own operand order
        operands = [operands[i] if i >= 0 else operands[len(xs) - 1 - i] for i in layer.attrs["order"]]
    fn = ELT_FNS[layer.attrs.get("fn", layer.op)]
    return ("TF_STEP_ELTWISE", "tf_eltwise_args",
            f"{{{y.c()}, {fn}, {len(operands)}, (const tf_operand[]){{{', '.join(operands)}}}, {acts_c(layer.attrs['act'])}}}")


def _activation(ctx, s, g, layer, xs, y):
    return "TF_STEP_AFFINE", "tf_affine_args", f"{{{xs[0].c()}, {y.c()}, -1, -1, {acts_c(layer.attrs['act'])}}}"


def _batchnorm(ctx, s, g, layer, xs, y):
    gamma, beta, mean, var = (g.params[p].astype(np.float64) for p in layer.params)
    scale = gamma / np.sqrt(var + layer.attrs["epsilon"])
    s_off = ctx.weights.add((s.model, layer.id, "scale"), lambda: scale.astype(np.float32))
    t_off = ctx.weights.add((s.model, layer.id, "shift"), lambda: (beta - mean * scale).astype(np.float32))
    return "TF_STEP_AFFINE", "tf_affine_args", f"{{{xs[0].c()}, {y.c()}, {s_off}, {t_off}, {acts_c(layer.attrs['act'])}}}"


def _lrn(ctx, s, g, layer, xs, y):
    a = layer.attrs
    return ("TF_STEP_LRN", "tf_lrn_args",
            f"{{{xs[0].c()}, {y.c()}, {a['size']}, {c_float(a['alpha'])}, {c_float(a['beta'])}, {c_float(a['bias'])}}}")


def _concat(ctx, s, g, layer, xs, y):
    """The inputs' views in an array of their own (DenseNet joins dozens), named after the step."""
    views = f"(const tf_view[]){{{', '.join(x.c() for x in xs)}}}"
    return "TF_STEP_CONCAT", "tf_concat_args", f"{{{y.c()}, {len(xs)}, {views}, {acts_c(layer.attrs['act'])}}}"


def _pad(ctx, s, g, layer, xs, y):
    a = layer.attrs
    win = _windows(s, g, layer, ctx.plan.models[s.model].batch)[0]
    t, l, _, _ = a["pads_hw"]
    in_h, in_w = g.shape(layer.inputs[0])[2:]
    mode = {"constant": "TF_PAD_CONSTANT", "edge": "TF_PAD_EDGE", "reflect": "TF_PAD_REFLECT"}[a["mode"]]
    r = s.out.region
    fields = [xs[0].c(), y.c(), mode, c_float(a["value"]), r.h0, r.w0, win.region.h0, win.region.w0, in_h, in_w, t, l]
    return "TF_STEP_PAD", "tf_pad_args", "{" + ", ".join(map(str, fields)) + "}"


def _resize(ctx, s, g, layer, xs, y):
    op: Resize = get_op("resize")  # type: ignore[assignment]
    win = _windows(s, g, layer, ctx.plan.models[s.model].batch)[0].region
    r = s.out.region
    rows = ctx.indices.add(("rows", s.model, layer.id, r.h0, r.h1, win.h0),
                           lambda: [i - win.h0 for i in op._indices(layer, 0, r.h0, r.h1)])
    cols = ctx.indices.add(("cols", s.model, layer.id, r.w0, r.w1, win.w0),
                           lambda: [i - win.w0 for i in op._indices(layer, 1, r.w0, r.w1)])
    return "TF_STEP_RESIZE", "tf_resize_args", f"{{{xs[0].c()}, {y.c()}, {rows}, {cols}}}"


def _moved(v: View, spans) -> View:
    """The block of view `v` a Move's (C, H, W) spans name (a negative step: a negative stride)."""
    (c0, cc, sc), (h0, hc, sh), (w0, wc, sw) = spans
    sn, s_c, s_h, s_w = v.strides
    return View(v.off + c0 * s_c + h0 * s_h + w0 * s_w, (v.dims[0], cc, hc, wc), (sn, s_c * sc, s_h * sh, s_w * sw))


def _block_moves(xs: list[View], y: View, moves, act=()):
    """Block moves (ops/moves.py) as two arrays of views of their own, named after the step."""
    moves = [m for m in moves if not m.is_empty()]
    src = f"(const tf_view[]){{{', '.join(_moved(xs[m.src], m.x).c() for m in moves) or '{0}'}}}"
    dst = f"(const tf_view[]){{{', '.join(_moved(y, m.y).c() for m in moves) or '{0}'}}}"
    return "TF_STEP_MOVES", "tf_moves_args", f"{{{y.c()}, {len(moves)}, {src}, {dst}, {acts_c(act)}}}"


def _slice(ctx, s, g, layer, xs, y):
    win = _windows(s, g, layer, ctx.plan.models[s.model].batch)
    return _block_moves(xs, y, get_op("slice").moves(layer, s.out.region, win))  # type: ignore[attr-defined]


def _depth_space(ctx, s, g, layer, xs, y):
    win = _windows(s, g, layer, ctx.plan.models[s.model].batch)
    depth = g.shape(layer.inputs[0])[1]
    return _block_moves(xs, y, get_op(layer.op).moves(layer, s.out.region, win, depth))  # type: ignore[attr-defined]


def _concat_any(ctx, s, g, layer, xs, y):
    if layer.attrs.get("axis", 1) == 1:
        return _concat(ctx, s, g, layer, xs, y)
    moves = get_op("concat").moves(layer, s.out.region, g.shape(layer.inputs[0])[1])  # type: ignore[attr-defined]
    return _block_moves(xs, y, moves, layer.attrs["act"])


def _conv_transpose(ctx, s, g, layer, xs, y):
    a = layer.attrs
    win = _windows(s, g, layer, ctx.plan.models[s.model].batch)[0].region
    w = g.params[layer.params[0]]
    cin, cog, kh, kw = w.shape
    groups = a["groups"]
    w_off = ctx.weights.add((s.model, layer.id, "w"),
                            lambda: w.reshape(groups, cin // groups, cog, kh, kw).transpose(0, 3, 4, 1, 2))
    bias = g.params[layer.params[1]] if len(layer.params) > 1 else np.zeros(cog * groups, np.float32)
    b_off = ctx.weights.add((s.model, layer.id, "b"), lambda: bias)
    r = s.out.region
    fields = [xs[0].c(), y.c(), w_off, b_off, groups, kh, kw, *a["stride"], *a["dilation"],
              r.h0 + a["pads"][0], r.w0 + a["pads"][1], win.h0, win.w0, acts_c(a["act"])]
    return "TF_STEP_DECONV", "tf_deconv_args", "{" + ", ".join(map(str, fields)) + "}"


def _resize_any(ctx, s, g, layer, xs, y):
    """Nearest: an index table per axis; linear and cubic: index and weight tables of their taps."""
    if layer.attrs.get("mode", "nearest") == "nearest":
        return _resize(ctx, s, g, layer, xs, y)
    op: Resize = get_op("resize")  # type: ignore[assignment]
    win = _windows(s, g, layer, ctx.plan.models[s.model].batch)[0].region
    r = s.out.region
    (row_at, row_w), (col_at, col_w) = op.taps(layer, 0, r.h0, r.h1), op.taps(layer, 1, r.w0, r.w1)
    key = (s.model, layer.id, r.h0, r.h1, r.w0, r.w1)
    rows = ctx.indices.add(("interp rows", *key), lambda: np.asarray(row_at) - win.h0)
    cols = ctx.indices.add(("interp cols", *key), lambda: np.asarray(col_at) - win.w0)
    rw = ctx.weights.add(("interp row weights", *key), lambda: np.asarray(row_w))
    cw = ctx.weights.add(("interp col weights", *key), lambda: np.asarray(col_w))
    fields = [xs[0].c(), y.c(), len(row_at[0]), rows, cols, rw, cw]
    return "TF_STEP_INTERP", "tf_interp_args", "{" + ", ".join(map(str, fields)) + "}"


def _reshape(ctx, s, g, layer, xs, y):
    return "TF_STEP_COPY", "tf_copy_args", f"{{{xs[0].c()}, {y.c()}}}"


def _transpose(ctx, s, g, layer, xs, y):
    return "TF_STEP_COPY", "tf_copy_args", f"{{{xs[0].permuted(layer.attrs['perm'], y.dims).c()}, {y.c()}}}"


def _shuffle(ctx, s, g, layer, xs, y):
    return "TF_STEP_SHUFFLE", "tf_shuffle_args", f"{{{xs[0].c()}, {y.c()}, {layer.attrs['groups']}}}"


EMITTERS = {
    "conv": _conv, "maxpool": _pool, "avgpool": _pool, "global_pool": _global, "gemm": _gemm, "softmax": _softmax,
    "add": _eltwise, "mul": _eltwise, "eltwise": _eltwise, "activation": _activation, "batchnorm": _batchnorm, "lrn": _lrn,
    "concat": _concat, "pad": _pad, "resize": _resize, "flatten": _reshape, "reshape": _reshape,
    "transpose": _transpose, "channel_shuffle": _shuffle,
    "channel_norm": _norm, "instancenorm": _norm, "channel_reduce": _channel_reduce,
}
# Issue 22's spatial and structural ops (concat along H and W, resize's linear and cubic modes).
EMITTERS.update({
    "concat": _concat_any, "resize": _resize_any, "slice": _slice, "depth_to_space": _depth_space,
    "space_to_depth": _depth_space, "conv_transpose": _conv_transpose,
})


# --- the files --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sources:
    """The exported files (name -> bytes) and what the program needs."""

    name: str
    files: dict
    weights_in_file: bool
    weight_bytes: int
    arena_bytes: int
    steps: int


def c_name(name: str) -> str:
    out = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name).strip("_").lower() or "model"
    return out if not out[0].isdigit() else "m_" + out


def _floats_c(arr: np.ndarray, per_line: int = 8) -> str:
    """Float32 values as C literals that read back exactly (9 significant digits)."""
    if not np.isfinite(arr).all():
        raise ExportError("a weight is not finite (NaN or infinity)")
    values = arr.astype(np.float64).tolist()
    full, rest = divmod(len(values), per_line)
    line = "    " + ", ".join(["%.8ef"] * per_line)
    lines = [line % tuple(values[i : i + per_line]) for i in range(0, full * per_line, per_line)]
    if rest:
        lines.append("    " + ", ".join(["%.8ef"] * rest) % tuple(values[full * per_line :]))
    return ",\n".join(lines)


def _ints_c(arr: np.ndarray, per_line: int = 16) -> str:
    vals = [str(int(v)) for v in arr.tolist()] or ["0"]
    return ",\n".join("    " + ", ".join(vals[i : i + per_line]) for i in range(0, len(vals), per_line))


def generate(plan: Plan, graphs: Sequence[Graph], name: str = "model", weights: str = "auto") -> Sources:
    """The C sources of `plan`: `{name}.h`, `{name}.c`, the kernels, `main.c`, a Makefile, and with
    weights "file" (or "auto" and more than C_WEIGHTS_LIMIT of them) `weights.bin`."""
    if plan.dtype != "fp32":
        raise ExportError(f"the C export runs fp32 plans; this plan is {plan.dtype}")
    if weights not in ("auto", "c", "file"):
        raise ExportError(f"weights {weights!r}: choose c, file or auto")
    name = c_name(name)
    upper = name.upper()
    copies = max((b.copies for b in plan.buffers), default=1)
    ctxs = [Context(plan, graphs, c) for c in range(copies)]
    for c in ctxs[1:]:  # one pool of constants for every frame copy
        c.weights, c.indices = ctxs[0].weights, ctxs[0].indices
    body: list[str] = []
    tables: list[str] = []
    for p in plan.partitions:
        g = graphs[p.model]
        lays = f"layers {p.layers[0]}-{p.layers[-1]}" if p.layers else "no layers"
        for c, ctx in enumerate(ctxs):
            label = f"p{p.id}" + (f"_f{c}" if copies > 1 else "")
            body.append(f"\n/* partition {p.id}: model {p.model} ({g.name}), {lays}"
                        + (f", frame copy {c}" if copies > 1 else "") + f", {len(p.steps)} steps */")
            rows = []
            for i, s in enumerate(p.steps):
                e = emit_step(ctx, s)
                body.append(f"/* step {i}: {e.comment.replace('*/', '* /')} */\n"
                            f"static const {e.ctype} {label}_s{i} = {e.init};")
                rows.append(f"    {{{e.kind}, &{label}_s{i}}}")
            tables.append(f"static const tf_step {label}[] = {{\n" + (",\n".join(rows) or "    {0, NULL}") + "\n};")
    weights_arr = ctxs[0].weights.array()
    _check_index_range(plan.arena_bytes // 4, weights_arr.size, ctxs[0].indices.array().size)
    in_file = weights == "file" or (weights == "auto" and weights_arr.size > C_WEIGHTS_LIMIT)
    outputs = _outputs(plan, graphs, ctxs)
    files = {
        f"{name}.h": _header(plan, graphs, name, upper, in_file, weights_arr.size * 4).encode(),
        f"{name}.c": _model_c(plan, graphs, name, upper, in_file, weights_arr, ctxs[0].indices.array(), body, tables,
                              outputs, copies).encode(),
        "tf_kernels.h": (C_DIR / "tf_kernels.h").read_bytes(),
        "tf_kernels.c": (C_DIR / "tf_kernels.c").read_bytes(),
        "tf_simd.inc": SIMD_SOURCE.read_bytes(),
        "main.c": (C_DIR / "main.c").read_text().replace("MODEL_", upper + "_").replace("model_", name + "_")
                   .replace('"model.h"', f'"{name}.h"').encode(),
        "Makefile": (C_DIR / "Makefile").read_text().replace("@NAME@", name).encode(),
    }
    if in_file:
        files["weights.bin"] = weights_arr.astype("<f4").tobytes()
    return Sources(name, files, in_file, int(weights_arr.size) * 4, plan.arena_bytes, sum(len(p.steps) for p in plan.partitions))


INDEX_LIMIT = 2**31  # tf_int, the step tables' offsets, sizes and strides: int32_t


def _check_index_range(arena_floats: int, weight_floats: int, index_count: int) -> None:
    """Every offset a step table holds is below INDEX_LIMIT when the arrays it indexes are."""
    for what, count in (("arena", arena_floats), ("weights", weight_floats), ("index tables", index_count)):
        if count >= INDEX_LIMIT:
            raise ExportError(f"the {what} hold {count} elements; the C step tables index with 32 bits "
                              f"(at most {INDEX_LIMIT - 1})")


def _outputs(plan: Plan, graphs: Sequence[Graph], ctxs: list[Context]) -> list[list[tuple[int, str, View]]]:
    """Per frame copy: (model, tensor, view) of every model output, in model and output order."""
    accesses = output_accesses(plan, graphs)
    return [[(m, a.tensor, ctx.view(m, a)) for m, a in accesses] for ctx in ctxs]


def _header(plan: Plan, graphs: Sequence[Graph], name: str, upper: str, in_file: bool, weight_bytes: int) -> str:
    w = "const float *weights, " if in_file else ""
    lines = [
        f"/* {name}.h: generated by tightfit from a plan. The caller owns the arena: {upper}_ARENA_BYTES bytes,",
        " * aligned to 4 (16 for vector loads); nothing else is allocated. No global state: two arenas run two",
        " * independent inferences. */",
        f"#ifndef {upper}_H", f"#define {upper}_H", "", '#include "tf_kernels.h"', "",
        f"#define {upper}_ARENA_BYTES {plan.arena_bytes}u",
        f"#define {upper}_WEIGHT_BYTES {weight_bytes}u",
        f"#define {upper}_CNNS {len(graphs)}",
    ]
    if in_file:
        lines.append(f"#define {upper}_WEIGHTS_FILE 1 /* the weights are read from weights.bin and passed in */")
    for m, (g, ref) in enumerate(zip(graphs, plan.models)):
        shape = (ref.batch,) + g.shape(g.inputs[0])[1:]
        lines.append(f"/* CNN {m}: {ref.spec}, input {'x'.join(map(str, shape))} (NCHW float32) */")
        lines.append(f"#define {upper}_CNN{m}_INPUT_ELEMS {prod(shape)}")
        lines.append(f"#define {upper}_CNN{m}_OUTPUTS {len(g.outputs)}")
        lines.append(f"#define {upper}_CNN{m}_INPUT_SHAPE {{{', '.join(map(str, _dims4(shape)))}}}")
        for k, t in enumerate(g.outputs):
            oshape = (ref.batch,) + g.shape(t)[1:]
            lines.append(f"#define {upper}_CNN{m}_OUTPUT{k}_ELEMS {prod(oshape)} /* {t}: {'x'.join(map(str, oshape))} */")
    g0, ref0 = graphs[0], plan.models[0]
    n, c, h, wd = _dims4((ref0.batch,) + g0.shape(g0.inputs[0])[1:])
    lines += [
        f"#define {upper}_INPUT_ELEMS {n * c * h * wd} /* CNN 0's */",
        f"#define {upper}_OUTPUT_ELEMS {prod((ref0.batch,) + g0.shape(g0.outputs[0])[1:])} /* CNN 0's first output */",
        f"#define {upper}_INPUT_N {n}", f"#define {upper}_INPUT_C {c}", f"#define {upper}_INPUT_H {h}", f"#define {upper}_INPUT_W {wd}",
        "",
        "/* CNN 0 on a whole NCHW input; 0 on success. */",
        f"int {name}_run(void *arena, {w}const float *input);",
        "/* CNN 0 on an input delivered by parts: `fill` is asked for the rows (and columns) each step needs. */",
        f"int {name}_run_rows(void *arena, {w}tf_input_fn fill, void *ctx);",
        "/* CNN `cnn`'s partitions in order, on frame `frame` (pipelined partitions alternate frame copies). */",
        f"int {name}_run_cnn(void *arena, {w}int cnn, long frame, tf_input_fn fill, void *ctx);",
        "/* One partition: partitions of a pipeline may run in threads of their own, one frame apart. */",
        f"int {name}_run_partition(void *arena, {w}int partition, long frame, tf_input_fn fill, void *ctx);",
        f"/* Elements [first, first + count) of output `k` of CNN `cnn` (NCHW order) after frame `frame`. */",
        f"void {name}_read(const void *arena, int cnn, int k, long frame, long first, long count, float *dst);",
        f"/* CNN `cnn`'s input shape (N, C, H, W), its number of outputs, and output `k`'s elements. */",
        f"const long *{name}_input_shape(int cnn);",
        f"int {name}_outputs(int cnn);",
        f"long {name}_output_elems(int cnn, int k);",
        f"/* The first output of CNN 0, whole. */",
        f"void {name}_read_output(const void *arena, float *dst);",
        "/* CNN `cnn` on a whole NCHW input (the frame picks the copies pipelined partitions use). */",
        f"int {name}_run_tensor(void *arena, {w}int cnn, long frame, const float *input);",
        "", "#endif", "",
    ]
    return "\n".join(lines)


def _model_c(plan: Plan, graphs: Sequence[Graph], name: str, upper: str, in_file: bool, weights_arr: np.ndarray,
             indices: np.ndarray, body: list[str], tables: list[str], outputs, copies: int) -> str:
    w_param, w_arg, w_use = ("const float *weights, ", "weights, ", "weights") if in_file else ("", "", "model_weights")
    head = [
        f"/* {name}.c: generated by tightfit. Do not edit: export the plan again. */",
        f"/* {len(plan.partitions)} partition(s), {sum(len(p.steps) for p in plan.partitions)} steps, arena {plan.arena_bytes} bytes,",
        f" * weights {weights_arr.size * 4} bytes {'(weights.bin)' if in_file else '(const, in this file)'}. Models:",
        *[f" *   {m}: {ref.spec} (fingerprint {ref.fingerprint}, batch {ref.batch})" for m, ref in enumerate(plan.models)],
        " */",
        "#include <math.h>", "#include <stddef.h>", "", f'#include "{name}.h"', "",
    ]
    if not in_file:
        head.append(f"static const float model_weights[{max(weights_arr.size, 1)}] TF_ALIGNED = {{\n{_floats_c(weights_arr) or '    0.0f'}\n}};")
    head.append(f"static const int32_t model_indices[{max(indices.size, 1)}] = {{\n{_ints_c(indices)}\n}};")
    parts = ",\n".join(
        f"    {{{p.model}, {len(p.steps)}, {{{', '.join(f'p{p.id}' + (f'_f{c}' if copies > 1 else '') for c in range(copies))}}}}}"
        for p in plan.partitions)
    order = sorted(range(len(plan.partitions)), key=lambda i: plan.partitions[i].id)
    outs = ",\n".join("    {" + ", ".join(v.c() for _, _, v in frame) + "}" for frame in outputs)
    first_out = [0]
    for m in range(len(graphs)):
        first_out.append(first_out[-1] + len(graphs[m].outputs))
    tail = [
        "", f"typedef struct {{ int model; long count; const tf_step *steps[{copies}]; }} model_partition;",
        f"static const model_partition model_partitions[{len(plan.partitions)}] = {{\n{parts}\n}};",
        f"static const int model_order[{len(order)}] = {{{', '.join(map(str, order))}}};",
        f"static const tf_view model_outputs[{copies}][{len(outputs[0])}] = {{\n{outs}\n}};",
        f"static const int model_first_output[{len(first_out)}] = {{{', '.join(map(str, first_out))}}};",
        "",
        f"int {name}_run_partition(void *arena, {w_param}int partition, long frame, tf_input_fn fill, void *ctx) {{",
        f"    if (partition < 0 || partition >= {len(plan.partitions)}) return -1;",
        f"    const model_partition *p = &model_partitions[partition];",
        f"    return tf_run((float *)arena, {w_use}, model_indices, p->steps[frame % {copies}], p->count, fill, ctx);",
        "}", "",
        f"int {name}_run_cnn(void *arena, {w_param}int cnn, long frame, tf_input_fn fill, void *ctx) {{",
        f"    for (int i = 0; i < {len(order)}; i++) {{",
        f"        const int k = model_order[i];",
        f"        if (model_partitions[k].model != cnn) continue;",
        f"        const int status = {name}_run_partition(arena, {w_arg}k, frame, fill, ctx);",
        f"        if (status) return status;",
        "    }",
        "    return 0;", "}", "",
        "typedef struct { const float *x; long c, h, w; } tensor_source;", "",
        "static int tensor_rows(void *ctx, long n0, long n1, long h0, long h1, long w0, long w1, float *dst, long sn, long sc, long sh, long sw) {",
        "    const tensor_source *t = (const tensor_source *)ctx;",
        "    for (long n = n0; n < n1; n++)",
        "    for (long c = 0; c < t->c; c++)",
        "    for (long h = h0; h < h1; h++) {",
        "        const float *src = t->x + ((n * t->c + c) * t->h + h) * t->w;",
        "        float *out = dst + (n - n0) * sn + c * sc + (h - h0) * sh;",
        "        for (long w = w0; w < w1; w++) out[(w - w0) * sw] = src[w];",
        "    }",
        "    return 0;", "}", "",
        f"static const long model_input_shapes[{len(graphs)}][4] = {{"
        + ", ".join(f"{upper}_CNN{m}_INPUT_SHAPE" for m in range(len(graphs))) + "};", "",
        f"int {name}_run_tensor(void *arena, {w_param}int cnn, long frame, const float *input) {{",
        f"    if (cnn < 0 || cnn >= {len(graphs)}) return -1;",
        "    tensor_source t = {input, model_input_shapes[cnn][1], model_input_shapes[cnn][2], model_input_shapes[cnn][3]};",
        f"    return {name}_run_cnn(arena, {w_arg}cnn, frame, tensor_rows, &t);", "}", "",
        f"int {name}_run(void *arena, {w_param}const float *input) {{",
        f"    return {name}_run_tensor(arena, {w_arg}0, 0, input);", "}", "",
        f"int {name}_run_rows(void *arena, {w_param}tf_input_fn fill, void *ctx) {{",
        f"    return {name}_run_cnn(arena, {w_arg}0, 0, fill, ctx);", "}", "",
        f"void {name}_read(const void *arena, int cnn, int k, long frame, long first, long count, float *dst) {{",
        f"    tf_read((const float *)arena, &model_outputs[frame % {copies}][model_first_output[cnn] + k], first, count, dst);", "}", "",
        f"static const long model_output_elems[{max(len(outputs[0]), 1)}] = {{"
        + ", ".join(str(v.dims[0] * v.dims[1] * v.dims[2] * v.dims[3]) for _, _, v in outputs[0]) + "};",
        f"const long *{name}_input_shape(int cnn) {{ return model_input_shapes[cnn]; }}",
        f"int {name}_outputs(int cnn) {{ return model_first_output[cnn + 1] - model_first_output[cnn]; }}",
        f"long {name}_output_elems(int cnn, int k) {{ return model_output_elems[model_first_output[cnn] + k]; }}", "",
        f"void {name}_read_output(const void *arena, float *dst) {{",
        f"    {name}_read(arena, 0, 0, 0, 0, {upper}_OUTPUT_ELEMS, dst);", "}", "",
    ]
    return "\n".join(head + body + [""] + tables + tail)
