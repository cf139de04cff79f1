"""A plan as C99: the same steps the arena executor runs, each a call of a kernel of the library
(kernels/tf_kernels.c, copied as it is; the values of each call from kernels/step_args.py) on views of the caller's arena given by buffer offset and strides, weights as
const data. Pure: a plan and its graphs in, file contents out; the same plan gives the same bytes.

The arena holds everything a run touches besides the stack: the C kernels need no temporaries
(border padding is applied inside the kernels, moves run in address order), so the steps'
`scratch` is not needed here."""
from __future__ import annotations

import math
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Sequence

import numpy as np

from tightfit.export.errors import ExportError
from tightfit.kernels.loops import CValue, table_rows
from tightfit.kernels.step_args import (BINDERS, Acts, Args, Array, Code, Context, Struct, View, _dims4,  # noqa: F401
                                       access_view, buffer_strides, step_args)
from tightfit.graph.forms import file_shape, nhwc_input, nhwc_output
from tightfit.graph.ir import Graph
from tightfit.plan.lifetimes import output_accesses, streamed_outputs
from tightfit.plan.schema import Plan, Step

C_DIR = Path(__file__).with_name("c")
KERNELS_DIR = Path(__file__).parents[1] / "kernels"
# The kernel library's files, copied into every export as they are.
KERNEL_FILES = ("tf_kernels.h", "tf_kernels.c")
# Above this many weights, C initializers compile slowly (3 M floats: ~10 s and 1 GB of gcc):
# the weights go to a file read once by the program instead.
C_WEIGHTS_LIMIT = 4_000_000
EMITTERS = BINDERS  # the registered ops the C program runs (one binder each, shared with the executor)


# --- values as C text --------------------------------------------------------------------------

def c_float(v: float) -> str:
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    return f"{float(np.float32(v))!r}f"


def view_c(v: View) -> str:
    return "{" + ", ".join(str(int(x)) for x in v.values()) + "}"


def acts_c(acts: Acts) -> str:
    """A pointer to the chain (a compound literal of static storage), NULL for none."""
    if not acts.chain:
        return "NULL"
    kinds, a, b = acts.fields()
    return ("&(const tf_acts){{" + ", ".join(map(str, kinds)) + "}, {" + ", ".join(map(c_float, a)) + "}, {"
            + ", ".join(map(c_float, b)) + "}}")


def value_c(v: object) -> str:
    """One field's initializer."""
    if isinstance(v, CValue):  # sizeof / offsetof: the target's layout, not the host's
        return v.c
    if isinstance(v, View):
        return view_c(v)
    if isinstance(v, Code):
        return v.c_name
    if isinstance(v, Acts):
        return acts_c(v)
    if isinstance(v, Struct):
        return "{" + ", ".join(value_c(f) for f in v.fields) + "}"
    if isinstance(v, Array):
        return f"(const {v.ctype}[]){{{', '.join(value_c(i) for i in v.items) or '{0}'}}}"
    if isinstance(v, (float, np.floating)):
        return c_float(float(v))
    return str(int(v))  # type: ignore[call-overload]


@dataclass
class Emitted:
    kind: str     # TF_STEP_*
    ctype: str    # the argument struct's type
    init: str     # its initializer
    comment: str


def emit_step(ctx: Context, s: Step) -> Emitted:
    return emit_args(step_args(ctx, s))


def emit_args(args: Args) -> Emitted:
    """A table row: its kind's code, its struct's type and initializer."""
    return Emitted(Code("STEP", args.kind).c_name, args.ctype, "{" + ", ".join(value_c(f) for f in args.fields) + "}",
                   args.comment)


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
    streams_outputs: bool = False  # outputs handed to sinks by rows (the host program writes them as they come)
    # The -D flags the program is built with: its plan's step kinds (TF_KINDS, tf_kernels.c), so that
    # the kernels of the others are left out of its code.
    defines: tuple[str, ...] = ()


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


def _words_c(arr: np.ndarray, per_line: int = 8) -> str:
    """The float32 array's words as hex literals (bit for bit, whatever they hold)."""
    vals = [f"0x{int(v):08x}u" for v in np.ascontiguousarray(arr, np.float32).view("<u4").tolist()]
    return ",\n".join("    " + ", ".join(vals[i : i + per_line]) for i in range(0, len(vals), per_line))


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
    body, tables, counts, mask = _step_tables(plan, graphs, ctxs)
    kinds = f"-DTF_KINDS={mask:#x}ULL"
    weights_arr = ctxs[0].weights.array()
    _check_index_range(plan.arena_bytes // 4, weights_arr.size, ctxs[0].indices.array().size)
    in_file = weights == "file" or (weights == "auto" and weights_arr.size > C_WEIGHTS_LIMIT)
    outputs = _outputs(plan, graphs, ctxs)
    files = {
        f"{name}.h": _header(plan, graphs, name, upper, in_file, weights_arr.size * 4).encode(),
        f"{name}.c": _model_c(plan, graphs, name, upper, in_file, weights_arr, ctxs[0].indices.array(), body, tables,
                              outputs, copies, ctxs[0].weights.words, counts).encode(),
        **{f: (KERNELS_DIR / f).read_bytes() for f in KERNEL_FILES},
        "main.c": (C_DIR / "main.c").read_text().replace("MODEL_", upper + "_").replace("model_", name + "_")
                   .replace('"model.h"', f'"{name}.h"').encode(),
        "Makefile": (C_DIR / "Makefile").read_text().replace("@NAME@", name).replace("@KINDS@", kinds).encode(),
    }
    if in_file:
        files["weights.bin"] = weights_arr.astype("<f4").tobytes()
    return Sources(name, files, in_file, int(weights_arr.size) * 4, plan.arena_bytes, sum(len(p.steps) for p in plan.partitions),
                   bool(streamed_outputs(plan)), (kinds,))


INDEX_LIMIT = 2**31  # tf_int, the step tables' offsets, sizes and strides: int32_t


def _step_tables(plan: Plan, graphs: Sequence[Graph], ctxs: Sequence[Context]) -> tuple[list[str], list[str], dict, int]:
    """Each partition's step table (kernels/loops.py's rows: a {kind, args} row a step, a run of
    steps repeated over bands or tiles as one REPEAT row and its first iteration) and the argument
    structs they point to, each distinct struct once, so that the program's constants grow with
    the layers and the plan's period, not with every step. Also each table's row count, by
    partition id and frame copy, and the TF_KINDS bits of the step kinds the tables hold."""
    body: list[str] = []
    counts: dict[int, list[int]] = {}
    tables: list[str] = []
    shared: dict[tuple[str, str], str] = {}
    copies, mask = len(ctxs), 0
    for p in plan.partitions:
        g = graphs[p.model]
        lays = f"layers {p.layers[0]}-{p.layers[-1]}" if p.layers else "no layers"
        for c, ctx in enumerate(ctxs):
            label = f"p{p.id}" + (f"_f{c}" if copies > 1 else "")
            body.append(f"\n/* partition {p.id}: model {p.model} ({g.name}), {lays}"
                        + (f", frame copy {c}" if copies > 1 else "") + f", {len(p.steps)} steps */")
            rows = []
            for i, a in enumerate(table_rows([s.layer for s in p.steps], [step_args(ctx, s) for s in p.steps])):
                e = emit_args(a)
                mask |= 1 << Code("STEP", a.kind).value
                name = shared.get((e.ctype, e.init))
                if name is None:
                    name = shared[(e.ctype, e.init)] = f"{label}_s{i}"
                    body.append(f"/* row {i}: {e.comment.replace('*/', '* /')} */\n"
                                f"static const {e.ctype} {name} = {e.init};")
                rows.append(f"    {{{e.kind}, &{name}}}")
            tables.append(f"static const tf_step {label}[] = {{\n" + (",\n".join(rows) or "    {0, NULL}") + "\n};")
            counts.setdefault(p.id, []).append(len(rows))
    return body, tables, counts, mask


def _check_index_range(arena_floats: int, weight_floats: int, index_count: int) -> None:
    """Every offset a step table holds is below INDEX_LIMIT when the arrays it indexes are."""
    for what, count in (("arena", arena_floats), ("weights", weight_floats), ("index tables", index_count)):
        if count >= INDEX_LIMIT:
            raise ExportError(f"the {what} hold {count} elements; the C step tables index with 32 bits "
                              f"(at most {INDEX_LIMIT - 1})")


def _outputs(plan: Plan, graphs: Sequence[Graph], ctxs: list[Context]) -> list[list[tuple[int, str, View | None]]]:
    """Per frame copy: (model, tensor, view) of every model output, in model and output order; an
    output the model file gives channels-last is read in that order (its view's dims permuted); a
    streamed output (handed to a sink by rows, never whole in the arena) has no view (None)."""
    accesses = {(m, a.tensor): a for m, a in output_accesses(plan, graphs)}
    every = [(m, t) for m, g in enumerate(graphs) for t in g.outputs]
    return [[(m, t, _file_order(graphs[m], t, ctx.view(m, accesses[(m, t)])) if (m, t) in accesses else None)
             for m, t in every] for ctx in ctxs]


def _file_order(g: Graph, tensor: str, v: View) -> View:
    """A 4-D output's view in the order the model file gives it: (N, H, W, C) in the view's four
    slots where the file's output is NHWC (tf_read walks the slots in order)."""
    if not nhwc_output(g, tensor) or len(g.shape(tensor)) != 4:
        return v
    return v.permuted((0, 2, 3, 1), (v.dims[0], v.dims[2], v.dims[3], v.dims[1]))


def _layout(g: Graph, tensor: str) -> str:
    """How the program takes an input or gives an output: the model file's layout."""
    shape = g.shape(tensor)
    if len(shape) != 4:
        return "flat" if len(shape) <= 2 else "as the file has it"
    return "NHWC" if (nhwc_input(g, tensor) if tensor in g.inputs else nhwc_output(g, tensor)) else "NCHW"


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
        lines += _cnn_defines(g, ref, m, upper)
    g0, ref0 = graphs[0], plan.models[0]
    n, c, h, wd = _dims4((ref0.batch,) + g0.shape(g0.inputs[0])[1:])
    rows = len(g0.inputs) == 1  # streaming by one callback: a CNN 0 of one input
    lines += [
        f"#define {upper}_INPUT_ELEMS {sum(prod((ref0.batch,) + g0.shape(t)[1:]) for t in g0.inputs)} /* CNN 0's, every input */",
        f"#define {upper}_MAX_INPUTS {max(len(g.inputs) for g in graphs)}",
        f"#define {upper}_MAX_OUTPUTS {max(len(g.outputs) for g in graphs)}",
        f"#define {upper}_OUTPUT_ELEMS {prod((ref0.batch,) + g0.shape(g0.outputs[0])[1:])} /* CNN 0's first output */",
        f"#define {upper}_INPUT_N {n}", f"#define {upper}_INPUT_C {c}", f"#define {upper}_INPUT_H {h}", f"#define {upper}_INPUT_W {wd}",
        f"#define {upper}_INPUT_ITEM {_input_item(g0, g0.inputs[0])} /* CNN 0's first input: bytes a value "
        f"({_input_kind(g0, g0.inputs[0])}) */",
        f"#define {upper}_INPUT_NHWC {int(_nhwc_in(g0, g0.inputs[0]))} /* CNN 0's first input: 1 channels-last "
        "(N, H, W, C), 0 NCHW */",
        "",
        "/* CNN 0 on its whole input(s) (several: one after another, each of its own type: float32, or",
        " * int8 for an int8 input; each in the model file's layout: NCHW, or NHWC where _input_nhwc says),",
        " * on the caller's thread; 0 on success. */",
        f"int {name}_run(void *arena, {w}const void *input);",
        *(["/* CNN 0 on an input delivered by parts: `fill` is asked for the rows (and columns) each step needs. */",
            f"int {name}_run_rows(void *arena, {w}tf_input_fn fill, void *ctx);"] if rows else []),
        "/* CNN `cnn`'s partitions in order, on frame `frame` (pipelined partitions alternate frame copies),",
        " * on `threads` threads (tf_run: a convolution's rows are shared; the same outputs for any count);",
        " * `inputs`: one source per input of the CNN, in its input order (each asked for the rows it delivers). */",
        f"int {name}_run_cnn(void *arena, {w}int cnn, long frame, const tf_source *inputs, int threads);",
        "/* One partition: partitions of a pipeline may run in threads of their own, one frame apart. */",
        f"int {name}_run_partition(void *arena, {w}int partition, long frame, const tf_source *inputs, int threads);",
        *_streaming_declarations(name, w),
        f"/* Elements [first, first + count) of output `k` of CNN `cnn` (in the model file's order: NCHW, or",
        " * NHWC for an output the file gives channels-last, as _OUTPUTk_ELEMS says) after frame `frame`, as",
        " * floats (an int8 output's integers); _read_int8: an int8 output's int8 values (output_item 1). */",
        f"void {name}_read(const void *arena, int cnn, int k, long frame, long first, long count, float *dst);",
        f"void {name}_read_int8(const void *arena, int cnn, int k, long frame, long first, long count, int8_t *dst);",
        f"/* Bytes a value of CNN `cnn`'s output `k`: 4 (float32), or 1 (int8). */",
        f"int {name}_output_item(int cnn, int k);",
        f"/* CNN `cnn`'s first input's shape (N, C, H, W), its number of inputs, input `k`'s shape, its",
        " * number of outputs, and output `k`'s elements. */",
        f"const long *{name}_input_shape(int cnn);",
        f"int {name}_inputs(int cnn);",
        f"const long *{name}_input_shape_of(int cnn, int k);",
        f"/* Bytes a value of CNN `cnn`'s input `k`: 4 (float32), or 1 (int8: a fill callback writes int8_t). */",
        f"int {name}_input_item(int cnn, int k);",
        f"/* 1 where CNN `cnn`'s input `k` is taken channels-last (N, H, W, C), as the model file takes it. */",
        f"int {name}_input_nhwc(int cnn, int k);",
        f"int {name}_outputs(int cnn);",
        f"long {name}_output_elems(int cnn, int k);",
        f"/* The first output of CNN 0, whole. */",
        f"void {name}_read_output(const void *arena, float *dst);",
        "/* CNN `cnn` on its whole input(s), one after another, as _run takes them (the frame picks the copies pipelined",
        " * partitions use). */",
        f"int {name}_run_tensor(void *arena, {w}int cnn, long frame, const void *input, int threads);",
        "", "#endif", "",
    ]
    return "\n".join(lines)


def _cnn_defines(g: Graph, ref, m: int, upper: str) -> list[str]:
    """CNN `m`'s defines: its inputs' shapes, bytes a value and layouts, its outputs' elements."""
    lines: list[str] = []
    shapes = [(ref.batch,) + g.shape(t)[1:] for t in g.inputs]
    shown = ", ".join(f"{t} {'x'.join(map(str, file_shape(g, t, sh)))} {_layout(g, t)}" for t, sh in zip(g.inputs, shapes))
    kinds = ", ".join(_input_kind(g, t) for t in g.inputs)
    lines.append(f"/* CNN {m}: {ref.spec}, input{'s' if len(shapes) > 1 else ''} {shown} ({kinds}); the _SHAPE "
                 "defines say (N, C, H, W) */")
    lines.append(f"#define {upper}_CNN{m}_INPUTS {len(shapes)}")
    lines.append(f"#define {upper}_CNN{m}_INPUT_ELEMS {sum(prod(sh) for sh in shapes)} /* every input, one after another */")
    lines.append(f"#define {upper}_CNN{m}_OUTPUTS {len(g.outputs)}")
    lines.append(f"#define {upper}_CNN{m}_INPUT_SHAPE {{{', '.join(map(str, _dims4(shapes[0])))}}}")
    for k, sh in enumerate(shapes):
        lines.append(f"#define {upper}_CNN{m}_INPUT{k}_SHAPE {{{', '.join(map(str, _dims4(sh)))}}} /* {g.inputs[k]} */")
        lines.append(f"#define {upper}_CNN{m}_INPUT{k}_ITEM {_input_item(g, g.inputs[k])} /* bytes a value: "
                     f"{_input_kind(g, g.inputs[k])} */")
        lines.append(f"#define {upper}_CNN{m}_INPUT{k}_NHWC {int(_nhwc_in(g, g.inputs[k]))} /* 1: given channels-last "
                     f"(N, H, W, C), as the model file takes it */")
    for k, t in enumerate(g.outputs):
        oshape = file_shape(g, t, (ref.batch,) + g.shape(t)[1:])
        lines.append(f"#define {upper}_CNN{m}_OUTPUT{k}_ELEMS {prod(oshape)} /* {t}: {'x'.join(map(str, oshape))} "
                     f"{_layout(g, t)} */")
    return lines


def _streaming_declarations(name: str, w: str) -> list[str]:
    """The header's runs with output sinks, for a plan that streams outputs."""
    return [
        "/* The same with `outputs`: one sink per output of the CNN, in its output order, for a plan that streams",
        f" * outputs ({name}_output_streamed: handed over by rows as they are computed, never whole in the arena;",
        " * _read does not read those); NULL where it streams none (the _run functions above pass NULL: a run of",
        " * a plan that streams outputs then stops with status -2). */",
        f"int {name}_run_cnn_io(void *arena, {w}int cnn, long frame, const tf_source *inputs, const tf_sink *outputs,",
        "                      int threads);",
        f"int {name}_run_partition_io(void *arena, {w}int partition, long frame, const tf_source *inputs,",
        "                            const tf_sink *outputs, int threads);",
        f"/* 1 when output `k` of CNN `cnn` is streamed (to the sink of run_cnn_io), 0 when read from the arena;",
        " * its shape (N, C, H, W). */",
        f"int {name}_output_streamed(int cnn, int k);",
        f"const long *{name}_output_shape_of(int cnn, int k);",
    ]


def _reads_c(graphs: Sequence[Graph], outputs: list, name: str, copies: int) -> list[str]:
    """Reading outputs: as floats (an int8 output's integers exactly), or an int8 output's int8 values."""
    items = ", ".join(str(_input_item(graphs[m], t)) for m, t, _ in outputs[0]) or "4"
    view = f"&model_outputs[frame % {copies}][model_first_output[cnn] + k]"
    return [
        f"static const int model_output_items[{max(len(outputs[0]), 1)}] = {{{items}}};",
        f"int {name}_output_item(int cnn, int k) {{ return model_output_items[model_first_output[cnn] + k]; }}",
        f"void {name}_read(const void *arena, int cnn, int k, long frame, long first, long count, float *dst) {{",
        f"    if ({name}_output_item(cnn, k) == 4) {{",
        f"        tf_read((const float *)arena, {view}, first, count, dst);",
        "        return;", "    }",
        "    int8_t q[64]; /* an int8 output: its integers as floats */",
        "    for (long i = 0; i < count; i += 64) {",
        "        const long m = count - i < 64 ? count - i : 64;",
        f"        tf_read_int8((const float *)arena, {view}, first + i, m, q);",
        "        for (long j = 0; j < m; j++) dst[i + j] = (float)q[j];",
        "    }", "}", "",
        f"void {name}_read_int8(const void *arena, int cnn, int k, long frame, long first, long count, int8_t *dst) {{",
        f"    tf_read_int8((const float *)arena, {view}, first, count, dst);", "}", "",
    ]


def _input_item(g: Graph, tensor: str) -> int:
    """Bytes a value of a model input as the program takes it: 1 for an int8 graph input, else 4."""
    return 1 if g.tensors[tensor].dtype == "int8" else 4


def _nhwc_in(g: Graph, tensor: str) -> bool:
    """The program takes this input channels-last (the model file's NHWC image)."""
    return nhwc_input(g, tensor) and len(g.shape(tensor)) == 4


def _input_kind(g: Graph, tensor: str) -> str:
    return "int8" if _input_item(g, tensor) == 1 else "float32"


def _inputs_c(graphs: Sequence[Graph], name: str, upper: str, w_param: str, w_arg: str) -> list[str]:
    """Every CNN's inputs: their shapes, and the runs on whole inputs (each input a source of its own)."""
    first = [0]
    for g in graphs:
        first.append(first[-1] + len(g.inputs))
    shapes = ", ".join(f"{upper}_CNN{m}_INPUT{k}_SHAPE" for m, g in enumerate(graphs) for k in range(len(g.inputs)))
    items = ", ".join(f"{upper}_CNN{m}_INPUT{k}_ITEM" for m, g in enumerate(graphs) for k in range(len(g.inputs)))
    nhwc = ", ".join(f"{upper}_CNN{m}_INPUT{k}_NHWC" for m, g in enumerate(graphs) for k in range(len(g.inputs)))
    rows = [
        f"int {name}_run_rows(void *arena, {w_param}tf_input_fn fill, void *ctx) {{",
        "    const tf_source source = {fill, ctx};",
        f"    return {name}_run_cnn(arena, {w_arg}0, 0, &source, 1);", "}", ""] if len(graphs[0].inputs) == 1 else []
    return [
        f"static const long model_input_shapes[{first[-1]}][4] = {{{shapes}}};",
        f"static const int model_first_input[{len(first)}] = {{{', '.join(map(str, first))}}};",
        f"int {name}_inputs(int cnn) {{ return model_first_input[cnn + 1] - model_first_input[cnn]; }}",
        f"const long *{name}_input_shape_of(int cnn, int k) {{ return model_input_shapes[model_first_input[cnn] + k]; }}",
        f"const long *{name}_input_shape(int cnn) {{ return model_input_shapes[model_first_input[cnn]]; }}",
        f"static const int model_input_items[{first[-1]}] = {{{items}}};",
        f"int {name}_input_item(int cnn, int k) {{ return model_input_items[model_first_input[cnn] + k]; }}",
        f"static const int model_input_nhwc[{first[-1]}] = {{{nhwc}}};",
        f"int {name}_input_nhwc(int cnn, int k) {{ return model_input_nhwc[model_first_input[cnn] + k]; }}", "",
        f"int {name}_run_tensor(void *arena, {w_param}int cnn, long frame, const void *input, int threads) {{",
        f"    if (cnn < 0 || cnn >= {len(graphs)}) return -1;",
        f"    tf_tensor tensors[{upper}_MAX_INPUTS];",
        f"    tf_source sources[{upper}_MAX_INPUTS];",
        f"    for (int k = 0; k < {name}_inputs(cnn); k++) {{",
        f"        const long *s = {name}_input_shape_of(cnn, k);",
        f"        const int item = {name}_input_item(cnn, k);",
        f"        tensors[k] = (tf_tensor){{input, s[1], s[2], s[3], item, {name}_input_nhwc(cnn, k)}};",
        "        sources[k] = (tf_source){tf_tensor_rows, &tensors[k]};",
        "        input = (const char *)input + s[0] * s[1] * s[2] * s[3] * item;",
        "    }",
        f"    return {name}_run_cnn(arena, {w_arg}cnn, frame, sources, threads);", "}", "",
        f"int {name}_run(void *arena, {w_param}const void *input) {{",
        f"    return {name}_run_tensor(arena, {w_arg}0, 0, input, 1);", "}", "",
        *rows,
    ]


def _model_c(plan: Plan, graphs: Sequence[Graph], name: str, upper: str, in_file: bool, weights_arr: np.ndarray,
             indices: np.ndarray, body: list[str], tables: list[str], outputs, copies: int, raw_words: bool = False,
             counts: dict | None = None) -> str:
    w_param, w_arg, w_use = ("const float *weights, ", "weights, ", "weights") if in_file else ("", "", "model_weights")
    head = [
        f"/* {name}.c: generated by tightfit. Do not edit: export the plan again. */",
        f"/* {len(plan.partitions)} partition(s), {sum(len(p.steps) for p in plan.partitions)} steps, arena {plan.arena_bytes} bytes,",
        f" * weights {weights_arr.size * 4} bytes {'(weights.bin)' if in_file else '(const, in this file)'}. Models:",
        *[f" *   {m}: {ref.spec} (fingerprint {ref.fingerprint}, batch {ref.batch})" for m, ref in enumerate(plan.models)],
        " */",
        "#include <math.h>", "#include <stddef.h>", "", f'#include "{name}.h"', "",
    ]
    if not in_file and raw_words:
        # int8 weights and int32 biases share the 4-byte words with floats: written as their bits
        # (a word of four int8 weights may read as a NaN float), read through the union's floats.
        head.append(f"static const union {{ uint32_t bits[{max(weights_arr.size, 1)}]; float f[{max(weights_arr.size, 1)}]; }} "
                    f"model_weight_words TF_ALIGNED = {{{{\n{_words_c(weights_arr) or '    0u'}\n}}}};")
        head.append("#define model_weights (model_weight_words.f)")
    elif not in_file:
        head.append(f"static const float model_weights[{max(weights_arr.size, 1)}] TF_ALIGNED = {{\n{_floats_c(weights_arr) or '    0.0f'}\n}};")
    head.append(f"static const int32_t model_indices[{max(indices.size, 1)}] = {{\n{_ints_c(indices)}\n}};")
    parts = ",\n".join(
        f"    {{{p.model}, {{{', '.join(map(str, counts[p.id]))}}}, {{{', '.join(f'p{p.id}' + (f'_f{c}' if copies > 1 else '') for c in range(copies))}}}}}"
        for p in plan.partitions)
    order = sorted(range(len(plan.partitions)), key=lambda i: plan.partitions[i].id)
    outs = ",\n".join("    {" + ", ".join("{0}" if v is None else view_c(v) for _, _, v in frame) + "}" for frame in outputs)
    streamed = streamed_outputs(plan)
    flags = ", ".join("1" if (m, t) in streamed else "0" for m, t, _ in outputs[0])
    first_out = [0]
    for m in range(len(graphs)):
        first_out.append(first_out[-1] + len(graphs[m].outputs))
    tail = [
        "", f"typedef struct {{ int model; long count[{copies}]; const tf_step *steps[{copies}]; }} model_partition;",
        f"static const model_partition model_partitions[{len(plan.partitions)}] = {{\n{parts}\n}};",
        f"static const int model_order[{len(order)}] = {{{', '.join(map(str, order))}}};",
        f"static const tf_view model_outputs[{copies}][{len(outputs[0])}] = {{\n{outs}\n}};",
        f"static const int model_first_output[{len(first_out)}] = {{{', '.join(map(str, first_out))}}};",
        "",
        f"int {name}_run_partition_io(void *arena, {w_param}int partition, long frame, const tf_source *inputs,",
        "                            const tf_sink *outputs, int threads) {",
        f"    if (partition < 0 || partition >= {len(plan.partitions)}) return -1;",
        f"    const model_partition *p = &model_partitions[partition];",
        f"    return tf_run((float *)arena, {w_use}, model_indices, p->steps[frame % {copies}], p->count[frame % {copies}], inputs,",
        "                  outputs, threads);",
        "}", "",
        f"int {name}_run_partition(void *arena, {w_param}int partition, long frame, const tf_source *inputs, int threads) {{",
        f"    return {name}_run_partition_io(arena, {w_arg}partition, frame, inputs, NULL, threads);", "}", "",
        f"int {name}_run_cnn_io(void *arena, {w_param}int cnn, long frame, const tf_source *inputs, const tf_sink *outputs,",
        "                      int threads) {",
        f"    for (int i = 0; i < {len(order)}; i++) {{",
        f"        const int k = model_order[i];",
        f"        if (model_partitions[k].model != cnn) continue;",
        f"        const int status = {name}_run_partition_io(arena, {w_arg}k, frame, inputs, outputs, threads);",
        f"        if (status) return status;",
        "    }",
        "    return 0;", "}", "",
        f"int {name}_run_cnn(void *arena, {w_param}int cnn, long frame, const tf_source *inputs, int threads) {{",
        f"    return {name}_run_cnn_io(arena, {w_arg}cnn, frame, inputs, NULL, threads);", "}", "",
        *_inputs_c(graphs, name, upper, w_param, w_arg),
        *_reads_c(graphs, outputs, name, copies),
        f"static const long model_output_elems[{max(len(outputs[0]), 1)}] = {{"
        + ", ".join(str(prod((plan.models[m].batch,) + graphs[m].shape(t)[1:])) for m, t, _ in outputs[0]) + "};",
        f"static const int model_output_streams[{max(len(outputs[0]), 1)}] = {{{flags or '0'}}};",
        f"int {name}_output_streamed(int cnn, int k) {{ return model_output_streams[model_first_output[cnn] + k]; }}",
        f"static const long model_output_shapes[{max(len(outputs[0]), 1)}][4] = {{"
        + ", ".join("{" + ", ".join(map(str, _dims4((plan.models[m].batch,) + graphs[m].shape(t)[1:]))) + "}"
                    for m, t, _ in outputs[0]) + "};",
        f"const long *{name}_output_shape_of(int cnn, int k) {{ return model_output_shapes[model_first_output[cnn] + k]; }}",
        f"int {name}_outputs(int cnn) {{ return model_first_output[cnn + 1] - model_first_output[cnn]; }}",
        f"long {name}_output_elems(int cnn, int k) {{ return model_output_elems[model_first_output[cnn] + k]; }}", "",
        f"void {name}_read_output(const void *arena, float *dst) {{",
        f"    {name}_read(arena, 0, 0, 0, 0, {upper}_OUTPUT_ELEMS, dst);", "}", "",
    ]
    return "\n".join(head + body + [""] + tables + tail)
