"""The one table of the kernel library's interface: its codes (activation kinds, elementwise
functions, step kinds, ...) and its argument structs. The C declarations in kernels/tf_kernels.h
(between the GENERATED markers) are written from it by `c_declarations`, and the executor's ctypes
structures (kernels/library.py) are made from it, so the two sides cannot drift;
tests/test_kernel_abi.py fails when the header's text is not what this table gives.

A struct is a list of (field, type): "tf_int" (int32_t: offsets, sizes, strides), "int", "float",
another struct's name (held inline), ("int", n) / ("float", n) (an array of n), or a pointer
"const NAME *" (to one NAME, or to an array of them)."""
from __future__ import annotations

import re
from typing import Sequence

# Activation kinds (a chain of up to MAX_ACTS runs after a layer; 0 ends it): name -> code.
ACT_NAMES = ("relu", "leakyrelu", "clip", "sigmoid", "tanh", "hardsigmoid", "hardswish", "silu", "mish", "gelu",
             "gelu_tanh", "softplus", "elu", "selu", "sqrt", "exp", "log", "neg", "abs", "reciprocal", "erf")
ACTS = {name: i for i, name in enumerate(ACT_NAMES, 1)}
# How an elementwise layer's operands combine, folded left to right.
ELT_NAMES = ("sum", "product", "sub", "div", "pow", "min", "max", "prelu", "clip")
# The ops' `fn` attribute (ops/binary.py) -> the code of its fold.
ELT_FNS = {"add": 0, "mul": 1, "sub": 2, "div": 3, "pow": 4, "min": 5, "max": 6, "prelu": 7, "clip": 8}
MAX_ACTS = 10  # a fused chain (the importer fuses up to this many; the test chains reach 9)
MAX_OPERANDS = 8

STEP_KINDS = ("conv", "pool", "global", "gemm", "softmax", "eltwise", "affine", "lrn", "concat", "pad", "resize",
              "copy", "shuffle", "input", "moves", "deconv", "interp", "channel_norm", "instance_norm",
              "channel_reduce")
# issue 38 (attention blocks): products of two activations, reductions over any axes.
STEP_KINDS += ("matmul", "reduce", "linear")
# --- int8 (quantized layers, issue 40): their step kinds follow the float ones ------------------
INT8_STEP_KINDS = ("qconv", "qgemm", "qadd", "qpool", "qglobal", "qconcat", "quantize", "dequantize", "qcopy", "qsoftmax",
                   "qmul")
STEP_KINDS = STEP_KINDS + INT8_STEP_KINDS
# --- end int8 ------------------------------------------------------------------------------------
# A table row that is not a kernel: the rows after it repeated (kernels/loops.py, issue 39 point 8).
STEP_KINDS = STEP_KINDS + ("repeat",)
# A model output handed to the caller's sink by rows as it is computed (issue 39 point 8).
STEP_KINDS = STEP_KINDS + ("output",)
STEP = {k: i for i, k in enumerate(STEP_KINDS)}
CONV_KINDS = ("dense", "depthwise", "grouped")
POOL_KINDS = ("max", "avg")
GLOBAL_KINDS = ("mean", "max")
PAD_MODES = ("constant", "edge", "reflect")
REDUCE_KINDS = ("mean", "sum", "max", "l2")  # issue 38
# How an int8 step rounds: as onnxruntime's CPU kernels (float multipliers, half to even) or as
# TFLite's reference kernels and TFLite Micro (fixed-point multiplier and shift, its own roundings).
ROUNDINGS = ("onnxruntime", "tflite")

# enum prefix -> names, in code order (C: TF_<PREFIX>_<NAME>).
ENUMS: dict[str, Sequence[str]] = {
    "ACT": ("none",) + ACT_NAMES, "ELT": ELT_NAMES, "CONV": CONV_KINDS, "POOL": POOL_KINDS, "GLOBAL": GLOBAL_KINDS,
    "PAD": PAD_MODES, "STEP": STEP_KINDS, "REDUCE": REDUCE_KINDS, "ROUND": ROUNDINGS,
}


def code(prefix: str, name: str) -> int:
    return list(ENUMS[prefix]).index(name)


I, F, N = "tf_int", "float", "int"
VIEW = "tf_view"
ACT_P = "const tf_acts *"

# name -> (fields, comment). Order matters: a struct is declared after those it holds.
STRUCTS: dict[str, tuple[list[tuple[str, object]], str]] = {
    "tf_view": ([(f, I) for f in ("off", "n", "c", "h", "w", "sn", "sc", "sh", "sw")],
                "A logical (N, C, H, W) block of the arena: `off` is its first element (floats from the arena's\n"
                " * start) and s* are element strides; any layout (NCHW, NHWC, a window, a tile) is a view."),
    "tf_acts": ([("kind", (N, MAX_ACTS)), ("a", (F, MAX_ACTS)), ("b", (F, MAX_ACTS))],
                "An activation chain applied in order after a layer (kind 0 ends it). Steps point to one (NULL:\n"
                " * none) rather than hold it: a finely tiled plan has thousands of steps and few chains."),
    "tf_conv_args": ([("x", VIEW), ("y", VIEW), ("w", I), ("b", I), ("kind", N), ("groups", I), ("kh", I), ("kw", I),
                      ("sh", I), ("sw", I), ("dh", I), ("dw", I), ("pt", I), ("pl", I), ("lo", F), ("hi", F),
                      ("act", ACT_P)],
                     "Convolution. x: the input window without its zero padding (pt, pl: zero rows / columns above\n"
                     " * and left of it); w, b: float offsets in the weights; kind by weight layout: DENSE (groups 1,\n"
                     " * dilation 1): panels of 16 output channels, (ceil(C_out/16), kh*kw*C_in, 16), bias padded to\n"
                     " * the panels; DEPTHWISE: taps (kh*kw) x C; GROUPED: per group (kh*kw*C_in/g) x (C_out/g).\n"
                     " * lo, hi: a clamp fused into the kernel (ReLU, ReLU6, Clip); act: any other activations."),
    "tf_pool_args": ([("x", VIEW), ("y", VIEW), ("kind", N), ("count_include_pad", N), ("kh", I), ("kw", I),
                      ("sh", I), ("sw", I), ("dh", I), ("dw", I), ("pt", I), ("pl", I), ("oy0", I), ("ox0", I),
                      ("in_h", I), ("in_w", I), ("pad_t", I), ("pad_l", I), ("pad_b", I), ("pad_r", I),
                      ("act", ACT_P)],
                     "Pooling. pt, pl: padding above and left of the window x; oy0, ox0: the output region's first\n"
                     " * row and column; in_*, pad_*: the whole input and the layer's padding (averages' divisors)."),
    "tf_global_args": ([("x", VIEW), ("y", VIEW), ("kind", N), ("act", ACT_P)],
                       "Mean or max over H x W (STEP_GLOBAL) or over C at each pixel (STEP_CHANNEL_REDUCE)."),
    "tf_gemm_args": ([("x", VIEW), ("y", VIEW), ("w", I), ("b", I), ("in_features", I), ("act", ACT_P)],
                     "y = x W^T + b; w: (out, in); b < 0: none."),
    "tf_operand": ([("is_const", N), ("v", VIEW), ("w", I), ("c", I), ("h", I), ("w_", I), ("h0", I), ("w0", I)],
                   "An operand of an elementwise fold: a view (a dimension of size 1 broadcast), or a constant of\n"
                   " * (1, c, h, w_) at offset w in the weights, its rows and columns from (h0, w0)."),
    "tf_eltwise_args": ([("y", VIEW), ("fn", N), ("count", N), ("op", "const tf_operand *"), ("act", ACT_P)],
                        "y = acts(op[0] fn op[1] fn ...), folded left to right; PRELU: op1 is the slope; CLIP: op1\n"
                        " * the lower bound, op2 the upper."),
    "tf_affine_args": ([("x", VIEW), ("y", VIEW), ("scale", I), ("shift", I), ("act", ACT_P)],
                       "Batch norm: y = acts(x * scale[c] + shift[c]); scale < 0: acts(x)."),
    "tf_norm_args": ([("x", VIEW), ("y", VIEW), ("scale", I), ("bias", I), ("eps", F), ("act", ACT_P)],
                     "(x - mean) / sqrt(var + eps) * scale[c] + bias[c]; CHANNEL_NORM: statistics over C at each\n"
                     " * pixel (LayerNorm over channels), INSTANCE_NORM: over H x W of each sample and channel."),
    "tf_softmax_args": ([("x", VIEW), ("y", VIEW), ("log", N)], "Over C at every pixel; log: LogSoftmax."),
    "tf_lrn_args": ([("x", VIEW), ("y", VIEW), ("size", I), ("alpha", F), ("beta", F), ("bias", F)],
                    "ONNX LRN over channels."),
    "tf_concat_args": ([("y", VIEW), ("count", N), ("x", "const tf_view *"), ("act", ACT_P)],
                       "Concatenation along C of `count` views x."),
    "tf_pad_args": ([("x", VIEW), ("y", VIEW), ("mode", N), ("value", F), ("oy0", I), ("ox0", I), ("iy0", I),
                     ("ix0", I), ("in_h", I), ("in_w", I), ("t", I), ("l", I)],
                    "Pad: the output region's origin (oy0, ox0), the input window's (iy0, ix0), the whole input\n"
                    " * and the padding above and left."),
    "tf_resize_args": ([("x", VIEW), ("y", VIEW), ("rows", I), ("cols", I)],
                       "Nearest resize; rows, cols: int offsets of the index tables."),
    "tf_copy_args": ([("x", VIEW), ("y", VIEW)],
                     "y = x in logical order (a reshape when the shapes differ; a transpose is x with permuted\n"
                     " * strides); x and y may overlap in one buffer with the same shape and strides (a shift)."),
    "tf_shuffle_args": ([("x", VIEW), ("y", VIEW), ("groups", I)], "Channel shuffle in `groups`."),
    "tf_input_args": ([("y", VIEW), ("n0", I), ("h0", I), ("w0", I), ("input", N), ("item", N)],
                      "Model input `input`'s region from (n0, h0, w0), of y's size, into y (that input's tf_source);\n"
                      " * item: bytes per element (4 float32, 1 int8: y's offset counts such elements)."),
    "tf_moves_args": ([("y", VIEW), ("count", N), ("x", "const tf_view *"), ("to", "const tf_view *"),
                       ("act", ACT_P)],
                      "Block moves (slice, split, concatenation along H or W, depth <-> space): x[i] to to[i]\n"
                      " * for each of `count` pairs (negative strides walk backwards), then the activations over y."),
    "tf_deconv_args": ([("x", VIEW), ("y", VIEW), ("w", I), ("b", I), ("groups", I), ("kh", I), ("kw", I),
                        ("sh", I), ("sw", I), ("dh", I), ("dw", I), ("oy0", I), ("ox0", I), ("iy0", I), ("ix0", I),
                        ("act", ACT_P)],
                       "Transposed convolution: weight (groups, kh, kw, C_in/g, C_out/g); y's first row and\n"
                       " * column are padded output places (oy0, ox0); x's are input places (iy0, ix0). Input place\n"
                       " * i adds into padded output places i * s + k * d."),
    "tf_interp_args": ([("x", VIEW), ("y", VIEW), ("taps", I), ("rows", I), ("cols", I), ("row_w", I),
                        ("col_w", I)],
                       "Separable interpolation (linear, cubic): output row oy reads rows idx[rows + oy * taps + t]\n"
                       " * of x with weights wts[row_w + oy * taps + t]; columns likewise."),
    # --- int8 (issue 40): views of int8 tensors count bytes; w, b, m are offsets in 4-byte words of
    # the weights, which hold int8 weights (4 to a word), int32 biases and float multipliers.
    "tf_qparams": ([("xs", F), ("xz", N), ("ys", F), ("yz", N)],
                   "An int8 step's input (x) and output (y) scale and zero point: real = (q - z) * s."),
    "tf_qconv_args": ([("x", VIEW), ("y", VIEW), ("w", I), ("b", I), ("m", I), ("groups", I), ("kh", I), ("kw", I),
                       ("sh", I), ("sw", I), ("dh", I), ("dw", I), ("pt", I), ("pl", I), ("xz", N), ("yz", N),
                       ("lo", N), ("hi", N), ("round", N)],
                      "int8 convolution (dense, depthwise, grouped): weight (C_out, kh, kw, C_in/groups) int8,\n"
                      " * bias int32 (b < 0: none); acc = bias + sum (x - xz) * w in int32. TF_ROUND_ONNXRUNTIME: m is\n"
                      " * one float multiplier per output channel (x_scale * w_scale / y_scale), y = clamp(round_even(\n"
                      " * acc * m) + yz, lo, hi); TF_ROUND_TFLITE: m is two int32 words per output channel (TFLite's\n"
                      " * fixed-point multiplier and shift), y = clamp(MultiplyByQuantizedMultiplier(acc) + yz, lo, hi)."),
    "tf_qgemm_args": ([("x", VIEW), ("y", VIEW), ("w", I), ("b", I), ("m", I), ("in_features", I), ("xz", N),
                       ("yz", N), ("lo", N), ("hi", N), ("round", N)],
                      "int8 y = x W^T + b: W (out, in) int8, requantized as tf_qconv_args."),
    "tf_qadd_args": ([("a", VIEW), ("b", VIEW), ("y", VIEW), ("sa", F), ("za", N), ("sb", F), ("zb", N), ("sy", F),
                      ("zy", N), ("lo", N), ("hi", N), ("round", N), ("am", N), ("ash", N), ("bm", N),
                      ("bsh", N), ("ym", N), ("ysh", N)],
                     "int8 sum (a dimension of size 1 broadcast): TF_ROUND_ONNXRUNTIME: both dequantized to float,\n"
                     " * added, quantized; TF_ROUND_TFLITE: TFLite's integer ADD (inputs shifted left 20, each scaled\n"
                     " * by its fixed-point multiplier and shift am, ash / bm, bsh, the sum by ym, ysh). A qmul step\n"
                     " * (TFLite's int8 MUL) takes the same arguments: (a - za)(b - zb) scaled by ym, ysh, + zy, clamped."),
    "tf_qpool_args": ([("p", "tf_pool_args"), ("q", "tf_qparams"), ("mode", N)],
                      "int8 pooling: max over int8 (requantized if y's scale differs); average of the dequantized values\n"
                      " * in onnxruntime's order: mode 0 its float AveragePool between DQ and Q (column sums), 1 its\n"
                      " * QLinearAveragePool, 2 its float AveragePool summing rows (global, or NCHWc channel blocks);\n"
                      " * mode 3: TFLite's int8 AVERAGE_POOL_2D (an int32 sum over the window's inputs, divided by their\n"
                      " * count rounding half away from zero; x and y quantized alike)."),
    "tf_qglobal_args": ([("x", VIEW), ("y", VIEW), ("kind", N), ("m", F), ("q", "tf_qparams"), ("round", N),
                         ("qm", N), ("qs", N)],
                        "int8 global pooling: mean as an int32 sum requantized by m = xs / (ys * H * W) (TF_ROUND_TFLITE:\n"
                        " * TFLite's MEAN, the sum less H * W * xz scaled by the fixed-point multiplier qm and shift qs); max."),
    "tf_qconcat_args": ([("y", VIEW), ("count", N), ("x", "const tf_view *"), ("q", "const tf_qparams *")],
                        "int8 concatenation along C; input i requantized by q[i] where its scale differs."),
    "tf_quant_args": ([("x", VIEW), ("y", VIEW), ("q", "tf_qparams"), ("lo", N), ("hi", N), ("round", N)],
                      "QUANTIZE: fp32 x -> int8 y (ys, yz); DEQUANTIZE: int8 x (xs, xz) -> fp32 y; QCOPY: int8 y = x in\n"
                      " * logical order (a reshape, a transpose by strides), requantized where q's scales differ and\n"
                      " * clamped to [lo, hi] (a ReLU or Clip between DequantizeLinear and QuantizeLinear). QUANTIZE rounds\n"
                      " * half to even (TF_ROUND_ONNXRUNTIME) or half away from zero (TF_ROUND_TFLITE)."),
    "tf_qsoftmax_args": ([("x", VIEW), ("y", VIEW), ("m", N), ("shift", N), ("diff_min", N)],
                         "TFLite's int8 SOFTMAX over C (y's scale 1/256, zero point -128): the differences from the\n"
                         " * largest input scaled by the multiplier m << shift into Q5.26, gemmlowp's fixed-point exp,\n"
                         " * the sum's reciprocal; differences below diff_min give -128."),
    # --- end int8 ----------------------------------------------------------------------------------
    "tf_step": ([("kind", N), ("args", "const void *")], "One step: its kind (TF_STEP_*) and argument struct."),
}
# --- step loops (issue 39 point 8): repeated runs of steps as one row ---------------------------
STRUCTS |= {
    "tf_delta": ([("row", I), ("size", I), ("at", I), ("step", I)],
                 "In a loop, body row `row` (its argument struct `size` bytes) has the tf_int at byte `at` of its\n"
                 " * struct moved by `step` per iteration."),
    "tf_repeat_args": ([("body", I), ("count", I), ("deltas", I), ("delta", "const tf_delta *")],
                       "TF_STEP_REPEAT: the `body` rows after this one run `count` times, iteration r with each\n"
                       " * moving field (deltas, in body row order) at its first value + r * step."),
}
# --- streamed outputs (issue 39 point 8): a model output leaves by rows, never whole in the arena ---
STRUCTS |= {
    "tf_output_args": ([("x", VIEW), ("n0", I), ("h0", I), ("w0", I), ("output", N), ("item", N)],
                       "Model output `output`'s region from (n0, h0, w0), of x's size, handed from x to that output's\n"
                       " * tf_sink; item: bytes per element (4 float32, 1 int8: x's offset counts such elements)."),
}
# --- issue 38: attention blocks -----------------------------------------------------------------
STRUCTS |= {
    "tf_matmul_args": ([("a", VIEW), ("b", VIEW), ("y", VIEW), ("act", ACT_P)],
                       "y[n][c] = a[n][c] b[n][c]: (h x w) matrices over the batch dims n, c of the views\n"
                       " * (a: M x K, b: K x N, y: M x N; a batch dim of size 1 broadcast with stride 0)."),
    "tf_linear_args": ([("x", VIEW), ("y", VIEW), ("w", I), ("b", I), ("act", ACT_P)],
                       "A Linear over the last dim (W) of any view: y[n][c][h] = x[n][c][h] W^T + b; w: (y.w, x.w),\n"
                       " * b < 0: none (tokens N x T x C, windows N x G x P x C)."),
    "tf_reduce_args": ([("x", VIEW), ("y", VIEW), ("kind", N), ("act", ACT_P)],
                       "Reduction (TF_REDUCE_*) over the dims where y has 1 and x more: y is x's shape with\n"
                       " * the reduced dims 1."),
}

BEGIN = "/* BEGIN GENERATED by tightfit.ops.abi: edit the table there, then `python -m tightfit.ops.abi` */"
END = "/* END GENERATED */"


def _c_field_type(t: object) -> tuple[str, str]:
    """(type, suffix) of a field's C declaration."""
    if isinstance(t, tuple):
        return t[0], f"[{t[1]}]"  # type: ignore[index]
    return str(t), ""


def _c_struct(name: str) -> str:
    fields, comment = STRUCTS[name]
    groups: list[tuple[str, list[str]]] = []
    for f, t in fields:
        ctype, suffix = _c_field_type(t)
        decl = f"*{f}" if ctype.endswith("*") else f + suffix
        base = ctype[:-1].rstrip() if ctype.endswith("*") else ctype
        if groups and groups[-1][0] == base:
            groups[-1][1].append(decl)
        else:
            groups.append((base, [decl]))
    body = " ".join(f"{t} {', '.join(ds)};" for t, ds in groups)
    return f"/* {comment} */\n" + _wrap(f"typedef struct {{ {body} }} {name};")


def c_declarations() -> str:
    """The header's generated part: the enums and the argument structs."""
    out = [BEGIN, f"#define TF_MAX_ACTS {MAX_ACTS}", f"#define TF_MAX_OPERANDS {MAX_OPERANDS}"]
    for prefix, names in ENUMS.items():
        items = [f"TF_{prefix}_{n.upper()} = {i}" for i, n in enumerate(names) if not (prefix == "ACT" and i == 0)]
        out.append(_wrap(f"enum {{ {', '.join(items)} }};"))
    out += [_c_struct(name) for name in STRUCTS]
    members = " ".join(f"{name} {name[3:-5]};" for name in STRUCTS if name.endswith("_args"))
    out.append("/* Room for any step's arguments (a loop's iteration runs a moved copy of them). */\n"
               + _wrap(f"typedef union {{ {members} }} tf_any_args;"))
    out.append(END)
    return "\n".join(out) + "\n"


def _wrap(line: str, width: int = 110) -> str:
    """One declaration over lines of at most `width`, broken after its commas and semicolons."""
    words, lines, cur = re.split(r"(?<=[,;]) ", line), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = "       " + w
        else:
            cur = f"{cur} {w}" if cur else w
    return "\n".join(lines + [cur])


def header_with_declarations(text: str) -> str:
    """`text` (tf_kernels.h) with its generated part replaced by this table's."""
    a, b = text.index(BEGIN), text.index(END) + len(END) + 1
    return text[:a] + c_declarations() + text[b:]


if __name__ == "__main__":  # rewrites the header's generated part
    from pathlib import Path

    path = Path(__file__).parents[1] / "kernels" / "tf_kernels.h"
    path.write_text(header_with_declarations(path.read_text()))
