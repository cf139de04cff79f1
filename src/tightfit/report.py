"""Tables and JSON the CLI prints. Units are stated in every header."""
from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from tightfit.analysis.memory import ModelMemory
from tightfit.plan.lifetimes import buffer_tensors, lifetimes, live_at
from tightfit.graph.forms import file_shape, nhwc_output, nhwc_shape
from tightfit.plan.offsets import format_layout
from tightfit.plan.schema import Plan
from tightfit.runtime.measure import PAGE_BYTES
from tightfit.units import human, mib, round_half_up

if TYPE_CHECKING:
    from tightfit.stages import FitOutcome

MB = 1e6


def dims(shape: tuple[int, ...]) -> str:
    """MAFAT writes input dims as H x W x C."""
    if len(shape) == 4:
        return f"{shape[2]}x{shape[3]}x{shape[1]}"
    return "x".join(str(d) for d in shape[1:])


def _mib2(n: int) -> str:
    """MiB to 2 decimals, halves rounded up as MAFAT Table 2.1 prints them (45.125 -> 45.13)."""
    return f"{round_half_up(mib(n), 2):.2f}"


def inspect_json(mem: ModelMemory) -> dict[str, Any]:
    return {
        "model": mem.model, "dtype": mem.dtype, "workspace": mem.workspace, "batch": mem.batch,
        "layers": [{
            "id": r.id, "name": r.name, "op": r.op, "input_shapes": [list(s) for s in r.input_shapes],
            "output_shape": list(r.output_shape), "kernel_bytes": r.kernel_bytes, "param_bytes": r.param_bytes,
            "input_bytes": r.input_bytes, "output_bytes": r.output_bytes, "workspace_bytes": r.workspace_bytes,
        } for r in mem.layers],
        "totals": {"param_bytes": mem.param_bytes, "original_param_bytes": mem.original_param_bytes,
                   "naive_bytes": mem.naive_bytes, "layer_peak_bytes": mem.layer_peak_bytes},
    }


def inspect_table(mem: ModelMemory) -> str:
    name_w = min(40, max(4, *(len(r.name) for r in mem.layers)))
    head = (f"{'id':>3}  {'name':<{name_w}}  {'type':<14} {'input dims':>16} {'weights B':>10} "
            f"{'input':>9} {'output':>9} {'scratch':>9} {'total':>9}")
    lines = [f"{mem.model}  dtype {mem.dtype}  workspace model {mem.workspace}  batch {mem.batch}  "
             "(sizes in MiB = 2^20 bytes; weights in bytes)", head, "-" * len(head)]
    for r in mem.layers:
        name = r.name if len(r.name) <= name_w else "…" + r.name[-(name_w - 1):]
        lines.append(
            f"{r.id:>3}  {name:<{name_w}}  {r.op:<14} {dims(r.input_shapes[0]) if r.input_shapes else '':>16} "
            f"{r.kernel_bytes:>10} {_mib2(r.input_bytes):>9} {_mib2(r.output_bytes):>9} "
            f"{_mib2(r.workspace_bytes):>9} {_mib2(r.total_bytes):>9}")
    lines += ["-" * len(head),
              f"parameters (run time, batch norms folded): {human(mem.param_bytes)}; imported model: {human(mem.original_param_bytes)}",
              f"naive (every tensor of the imported model its own buffer + parameters): {human(mem.naive_bytes)} ({mem.naive_bytes / 1e6:.1f} MB)",
              f"layer-by-layer peak (live tensors + scratch, parameters excluded): {human(mem.layer_peak_bytes)}"]
    return "\n".join(lines)


def int8_lines(graph) -> list[str]:
    """What an int8 model runs in int8 and what in fp32 (between a dequantize and a quantize
    layer, having no int8 kernel); nothing for a float model."""
    if all(t.dtype == "fp32" for t in graph.tensors.values()):
        return []
    int8 = [l for l in graph.layers if l.attrs.get("quant") == "int8"]
    moves = [l for l in graph.layers if l.op in ("quantize", "dequantize")]
    floats = [l for l in graph.layers if l not in int8 and l not in moves]
    tflite = int8 and all(l.attrs.get("rounding") == "tflite" for l in int8)
    lines = [f"int8 model: {len(int8)} int8 layers, {len(moves)} quantize/dequantize layers, "
             f"{len(floats)} fp32 layers; int8 tensors take 1 byte per element"
             + ("; requantized as TFLite Micro does (its fixed-point multipliers and roundings)" if tflite else "")]
    lines += [f"  fp32 (no int8 kernel; runs between a dequantize and a quantize): {l.id} {l.op} {l.name!r}" for l in floats]
    forms = {t: shape for t, form, shape in graph.input_forms if form == "nhwc"}
    for t in graph.inputs:
        q = graph.tensors[t].quant
        if graph.tensors[t].dtype == "int8" and q is not None:  # what `run --input` and the C program take
            layout = (f"the file's NHWC {'x'.join(map(str, forms[t]))}, raw or in a .npy (a .npy of the NCHW shape "
                      "is taken as NCHW)" if t in forms else "NCHW")
            lines.append(f"  input {t} is int8 (scale {q.scale[0]:.6g}, zero point {q.zero_point[0]}): give its int8 "
                         f"values ({layout}), 1 byte each")
    for t in graph.outputs:
        q = graph.tensors[t].quant
        if graph.tensors[t].dtype == "int8" and q is not None:
            lines.append(f"  output {t} is int8 (scale {q.scale[0]:.6g}, zero point {q.zero_point[0]}), "
                         f"{_output_layout(graph, t)}")
    return lines


def _output_layout(graph, t: str) -> str:
    """How `run --output` and the exported program give an output: the model file's layout."""
    if len(graph.shape(t)) != 4:
        return "as the file has it"
    return f"NHWC {'x'.join(map(str, nhwc_shape(graph.shape(t))))}, as the file gives it" if nhwc_output(graph, t) else "NCHW"


def model_io(graph, batch: int | None = None) -> dict[str, dict[str, list[int]]]:
    """The model's inputs and outputs by name, each with its NCHW shape (`batch` samples)."""
    def shape(t: str) -> list[int]:
        s = graph.shape(t)
        return list(s) if batch is None else [batch, *s[1:]]

    return {"inputs": {t: shape(t) for t in graph.inputs}, "outputs": {t: shape(t) for t in graph.outputs}}


def io_line(io: dict[str, dict[str, list[int]]]) -> str:
    """`inputs: a 1x3x96x192, b ...; outputs: ...` in one line."""
    def named(d: dict[str, list[int]]) -> str:
        return ", ".join(f"{t} {'x'.join(map(str, s))}" for t, s in d.items())

    return f"inputs: {named(io['inputs'])}; outputs: {named(io['outputs'])}"


def run_report(graph, result) -> dict[str, Any]:
    outs = {}
    for name, t in result.outputs.items():
        outs[name] = {"shape": list(t.shape), "mean": float(t.mean()), "std": float(t.std()) if t.size > 1 else 0.0,
                      "argmax": int(t.reshape(t.shape[0], -1).argmax(1)[0])}
    return {"model": graph.name, "layers": len(graph.layers), "seconds": result.seconds, "outputs": outs,
            "inputs": {t: list(file_shape(graph, t, s)) for t, s in model_io(graph)["inputs"].items()}}  # as the file takes them


def run_text(report: dict[str, Any]) -> str:
    lines = [f"{report['model']}: {report['layers']} layers, reference executor {report['seconds'] * 1e3:.1f} ms"]
    for name, shape in report.get("inputs", {}).items():
        lines.append(f"  input {name}: shape {'x'.join(map(str, shape))}")
    for name, o in report["outputs"].items():
        lines.append(f"  output {name}: shape {'x'.join(map(str, o['shape']))}, mean {o['mean']:.4g}, std {o['std']:.4g}, argmax {o['argmax']}")
    if "verify" in report:
        v = report["verify"]
        lines.append(f"  verify vs {v.get('against') or 'onnxruntime'}: {'OK' if v['ok'] else 'MISMATCH'} (max abs diff {v['max_abs_diff']:.3g}, "
                     f"tolerance {v['tolerance']:.3g} = 1e-4 x max abs {v['max_abs_ref']:.3g})")
    if "measured" in report:
        m = report["measured"]
        lines.append(f"  measured peak above loaded baseline: {_measured(m)} (analysed layer-by-layer peak "
                     f"{human(report['analysed_layer_peak_bytes'])}); run {m['seconds'] * 1e3:.1f} ms")
    return "\n".join(lines + _written(report))


def _written(report: dict[str, Any]) -> list[str]:
    w = report.get("written")
    return [f"  outputs written to {w['file']}: {w['outputs']}"] if isinstance(w, dict) else []


def _measured(m: dict[str, Any]) -> str:
    """The kernel counts pages per CPU, so VmHWM carries a known uncertainty: print it."""
    return f"{human(m['run_bytes'])} +/- {human(m['uncertainty_bytes'])} (the kernel's per-CPU page counts)"


def plan_report(plan, graphs, analysis, seconds: float) -> dict[str, Any]:
    naive = sum(t.nbytes(plan.dtype, m.batch) for g, m in zip(graphs, plan.models) for t in g.original_tensors)
    return {
        "models": [m.spec for m in plan.models], "knobs": dict(plan.knobs), "steps": analysis.steps,
        "buffers": len(plan.buffers), "naive_activation_bytes": naive, "lower_bound_bytes": analysis.lower_bound,
        "arena_bytes": analysis.arena_bytes, "ratio_to_lower_bound": analysis.ratio,
        "scratch_peak_bytes": analysis.scratch_peak, "analysed_peak_bytes": analysis.peak_bytes,
        "planning_seconds": seconds,
        "io": [model_io(g, m.batch) for g, m in zip(graphs, plan.models)],
    }


def plan_text(r: dict[str, Any]) -> str:
    k = r["knobs"]
    lines = [f"{' + '.join(r['models'])}: method {k.get('method')}, planner {k.get('planner')}, order {k.get('order')}, "
             f"layout {k.get('layout')}; {r['steps']} steps, {r['buffers']} buffers",
             f"  naive (every imported tensor its own buffer): {human(r['naive_activation_bytes'])}",
             f"  lower bound (busiest step; concurrent partitions add up): {human(r['lower_bound_bytes'])}",
             f"  arena:                                        {human(r['arena_bytes'])} ({r['ratio_to_lower_bound']:.3f} x lower bound)",
             f"  kernel temporaries (largest step, outside the arena): {human(r['scratch_peak_bytes'])}",
             f"  analysed run memory (arena + temporaries):    {human(r['analysed_peak_bytes'])}",
             f"  planning time: {r['planning_seconds'] * 1e3:.0f} ms"]
    for m, io in enumerate(r.get("io", [])):
        lines.insert(1, f"  {'CNN ' + str(m) + ' ' if len(r['io']) > 1 else ''}{io_line(io)}")
    if "predicted_seconds" in k and k.get("method") == "tiling":
        lines.insert(1, f"  tiling within {human(k['budget'])}: {k['tiling'] or 'layer by layer'}, predicted "
                        f"{k['predicted_seconds'] * 1e3:.1f} ms per run (cost profile {k['cost_profile']})")
    elif "predicted_seconds" in k:
        split = k.get("phases", {})
        lines.insert(1, f"  by parts within {human(k['budget'])}: {len(split)} layers split, predicted "
                        f"{k['predicted_seconds'] * 1e3:.1f} ms per run (cost profile {k['cost_profile']})")
    if "written" in r:
        lines.append(f"  plan written to {r['written']}")
    return "\n".join(lines)


def plan_run_text(r: dict[str, Any]) -> str:
    lines = [f"{r['plan']}: ran in {r['seconds'] * 1e3:.1f} ms; arena {human(r['arena_bytes'])} + kernel temporaries "
             f"{human(r['scratch_peak_bytes'])} = analysed {human(r['analysed_peak_bytes'])}"]
    if "enforced_limit_bytes" in r:
        lines.append(f"  enforced: completed under RLIMIT_DATA = loaded baseline + {human(r['enforced_limit_bytes'])}")
    if "verify" in r:
        v = r["verify"]
        lines.append(f"  verify vs reference executor: {'OK' if v['ok'] else 'MISMATCH'} (max abs diff {v.get('max_abs_diff', 0):.3g})")
    if "measured" in r:
        m = r["measured"]
        lines.append(f"  measured peak above loaded baseline: {_measured(m)} (analysed {human(r['analysed_peak_bytes'])})")
    return "\n".join(lines + _written(r))


def layout_map(plan: Plan, graphs) -> str:
    """The arena layout: every buffer's bytes over the steps it lives."""
    life = lifetimes(plan, graphs)
    return format_layout(life.reqs, life.arena_offsets(plan))


def vbs_text(r: dict[str, Any], graph) -> str:
    """The per-layer sub-batch profile (Choudhury et al. Fig. 9) and the three methods' times."""
    lines = [f"  variable batch size for a request of {r['request']} within {human(r['budget_bytes'])}; "
             "sub-batches per layer, in order:"]
    for lid, batches in r["profile"].items():
        lines.append(f"    {int(lid):>3}  {graph.layers[int(lid)].name[:48]:<48}  {', '.join(map(str, batches))}")
    lines.append(f"  {'method':<8} {'batch':>8} {'run memory':>12} {'predicted ms/sample':>20} {'measured ms/sample':>19}")
    for m, row in r["methods"].items():
        if not row["fits"]:
            lines.append(f"  {m:<8} does not fit")
            continue
        batch = row["batch"] if isinstance(row["batch"], int) else ("per layer" if row["batch"] else "mixed")
        measured = row["measured_seconds_per_sample"]
        lines.append(f"  {m:<8} {batch:>8} {human(row['run_bytes']):>12} {row['predicted_seconds_per_sample'] * 1e3:>20.2f} "
                     f"{measured * 1e3 if measured is not None else float('nan'):>19.2f}")
    return "\n".join(lines)


# --- fit ----------------------------------------------------------------------------------------

def peak_tensors(plan: Plan, graphs, top: int = 6) -> tuple[int, int, list[tuple[str, str, int, str]]]:
    """(busiest step, its kernel temporaries, [(CNN index:tensor, buffer kind, bytes, partition)])
    of the buffers live at the step where live bytes plus scratch are largest."""
    live = memory_over_steps(plan, graphs)
    step = max(range(len(live)), key=lambda i: live[i]) if live else 0
    life = lifetimes(plan, graphs)
    tensor_of = buffer_tensors(plan)
    rows = []
    for (b, c), r in live_at(life, [step]):
        m, t = tensor_of[b]
        rows.append((f"{m}:{t}", plan.buffers[b].kind + (f" copy {c}" if plan.buffers[b].copies > 1 else ""), r.size))
    rows.sort(key=lambda x: -x[2])
    return step, life.step_scratch[step] if life.step_scratch else 0, rows[:top]


def memory_over_steps(plan: Plan, graphs) -> list[int]:
    """Bytes live at each step (every buffer copy from first to last use) plus its scratch."""
    life = lifetimes(plan, graphs)
    return [live + scratch for live, scratch in zip(life.live_bytes(), life.step_scratch)]


def contributions(o: FitOutcome) -> list[str]:
    """What each technique contributed to the chosen plan's memory."""
    reuse = o.search.reuse.memory_bytes
    lines = [f"no reduction (every tensor its own buffer, parameters included): {_mb(o.naive_bytes)}"]
    if o.with_params:
        lines.append(f"parameters (counted in the budget): {_mb(o.param_bytes)}")
    lines.append(f"buffer reuse across the application (pipeline-aware), layer by layer: {_mb(reuse)}"
                 f"{' (parameters included)' if o.with_params else ''}")
    chosen = o.point
    problem = o.problem
    for m, (space, name) in enumerate(zip(problem.spaces, o.app.names)):
        genes = list(chosen.genes)
        start = sum(s.width for s in problem.spaces[:m])
        whole = problem.reuse_genes()[start:start + space.width]
        if tuple(genes[start:start + space.width]) == tuple(whole):
            lines.append(f"{name}: {chosen.labels[m]}")
            continue
        genes[start:start + space.width] = whole
        without = problem.evaluate(genes)
        lines.append(f"{name}: {chosen.labels[m]} - saves {_mb(without.memory_bytes - chosen.memory_bytes)} "
                     f"of the application's memory, predicted {chosen.fps[m]:.1f} fps (layer by layer {without.fps[m]:.1f})")
    return lines


def _mb(n: float) -> str:
    return f"{n / MB:.3f} MB ({human(int(n))})"


def fit_report(o: FitOutcome) -> dict[str, Any]:
    step, scratch, peak = peak_tensors(o.plan, o.app.graphs)
    budget = o.constraints.budget_bytes
    r = {
        "cnns": list(o.app.names), "models": [m.spec for m in o.app.models], "budget_bytes": budget,
        "with_params": o.with_params, "param_bytes": o.param_bytes, "min_fps": list(o.constraints.min_fps),
        "fits": o.fits, "early_exit": o.search.early_exit, "evaluated": o.search.evaluated,
        "search_seconds": o.search_seconds, "search_timing": o.timing, "threads": o.threads,
        "chosen_by": o.choice.rule if o.choice else "", "timed_fps": list(o.choice.measured_fps) if o.choice else [],
        "chosen": {"techniques": list(o.point.labels), "memory_bytes": o.memory_bytes, "arena_bytes": o.analysis.arena_bytes,
                   "scratch_peak_bytes": o.analysis.scratch_peak, "lower_bound_bytes": o.analysis.lower_bound,
                   "predicted_fps": list(o.point.fps), "max_rel_diff_vs_reference": o.max_abs_diff},
        "front": [{"memory_bytes": p.memory_bytes, "predicted_fps": list(p.fps), "techniques": list(p.labels)} for p in o.search.front],
        "reuse_only": {"memory_bytes": o.search.reuse.memory_bytes, "predicted_fps": list(o.search.reuse.fps)},
        "naive_bytes": o.naive_bytes,
        "peak": {"step": step, "scratch_bytes": scratch, "tensors": [{"tensor": t, "buffer": k, "bytes": b} for t, k, b in peak]},
        "contributions": contributions(o),
    }
    if o.measured:
        r["chosen"]["measured_run_bytes"] = o.measured["run_bytes"]
        r["chosen"]["measured_memory_bytes"] = o.measured["run_bytes"] + o.counted_params
        r["chosen"]["measured_uncertainty_bytes"] = o.measured["uncertainty_bytes"]
        r["chosen"]["measured_fps"] = o.measured["fps"]
    return r


def fit_text(r: dict[str, Any]) -> str:
    c = r["chosen"]
    what = "with parameters" if r["with_params"] else "run memory (arena + kernel temporaries)"
    within = (f"in {_mb(r['budget_bytes'])}" if r["budget_bytes"] is not None
              else f"at min fps {', '.join(f'{f:g}' for f in r['min_fps'])}, the smallest")
    lines = [f"fit {' + '.join(r['cnns'])} {within}, {what}: {_verdict(r)}"
             + (" - reuse alone fits (early exit)" if r["early_exit"] else ""),
             f"  {_counted_line(r)}",
             f"  {_search_line(r)}",
             f"  chosen: {'; '.join(c['techniques'])}",
             f"  chosen by {r['chosen_by']}",
             f"  memory: analysed {_mb(c['memory_bytes'])} (arena {human(c['arena_bytes'])}, lower bound "
             f"{human(c['lower_bound_bytes'])}, kernel temporaries {human(c['scratch_peak_bytes'])})"]
    if "measured_memory_bytes" in c:
        # The peak is read in whole pages: a run memory of a few KiB may lie in pages already touched.
        small = c["arena_bytes"] + c["scratch_peak_bytes"] < 4 * PAGE_BYTES
        low, high = _measured_range(c)
        lines.append(f"          measured {_mb(c['measured_memory_bytes'])}, between {_mb(low)} and {_mb(high)} "
                     f"(+/- {human(c['measured_uncertainty_bytes'])}; fresh process, peak above the loaded model"
                     f"{' + parameters' if r['with_params'] else ''}{f'; read in pages of {human(PAGE_BYTES)}' if small else ''})")
    lines.append(f"  fps ({r['threads']} thread{'s' if r['threads'] > 1 else ''}): predicted "
                 f"{', '.join(f'{f:.1f}' for f in c['predicted_fps'])}"
                 + (f"; measured {', '.join(f'{f:.1f}' for f in c['measured_fps'])}" if "measured_fps" in c else "")
                 + (f" (minimum {', '.join(f'{f:g}' for f in r['min_fps'])})" if any(r["min_fps"]) else ""))
    lines.append(f"  outputs equal the reference executor's (max diff {c['max_rel_diff_vs_reference']:.2g} x max value)")
    lines.append("  why it fits:" if r["fits"] else "  why it doesn't:")
    lines += [f"    {s}" for s in r["contributions"]]
    if not r["fits"]:
        if r["budget_bytes"] is not None and c["memory_bytes"] > r["budget_bytes"]:
            lines.append(f"    the smallest plan found needs {_mb(c['memory_bytes'])} > budget {_mb(r['budget_bytes'])}")
        for m, (name, need) in enumerate(zip(r["cnns"], r["min_fps"])):
            best = max(p["predicted_fps"][m] for p in r["front"])
            if need and best < need:
                lines.append(f"    {name}: the fastest plan found reaches {best:.1f} fps < the minimum {need:g}")
            elif need and r["timed_fps"] and r["timed_fps"][m] < need:
                lines.append(f"    {name}: measured {r['timed_fps'][m]:.1f} fps < the minimum {need:g}")
    peak = r["peak"]
    lines.append(f"  the peak (step {peak['step']}) is set by:")
    lines += [f"    {t['bytes'] / MB:9.3f} MB  {t['buffer']:<8} {t['tensor']}" for t in peak["tensors"]]
    if peak["scratch_bytes"]:
        lines.append(f"    {peak['scratch_bytes'] / MB:9.3f} MB  kernel temporaries of that step")
    lines.append("  Pareto front (predicted): memory MB | fps per CNN | techniques")
    for p in r["front"]:
        lines.append(f"    {p['memory_bytes'] / MB:9.3f} | {', '.join(f'{f:.1f}' for f in p['predicted_fps'])} | {'; '.join(p['techniques'])}")
    return "\n".join(lines)


def _measured_range(c: dict[str, Any]) -> tuple[int, int]:
    m, u = c["measured_memory_bytes"], c["measured_uncertainty_bytes"]
    return max(m - u, 0), m + u


def _verdict(r: dict[str, Any]) -> str:
    """"fits" where the measurement confirms it too; "fits (analysed)" where its uncertainty is
    larger than the margin under the budget, so only the analysis can say."""
    if not r["fits"]:
        return "does NOT fit (best effort: the closest plan)"
    c = r["chosen"]
    if r["budget_bytes"] is None or "measured_memory_bytes" not in c:
        return "fits"
    return "fits" if _measured_range(c)[1] <= r["budget_bytes"] else "fits (analysed: the measurement's uncertainty exceeds the margin)"


def _counted_line(r: dict[str, Any]) -> str:
    weights = f"{human(r['param_bytes'])}"
    if r["with_params"]:
        return f"budget covers the weights ({weights}) and the activations (arena + kernel temporaries)"
    return f"budget covers activations (the weights, {weights}, are not counted; --with-params counts them)"


def _search_line(r: dict[str, Any]) -> str:
    t = r.get("search_timing") or {}
    line = f"searched {r['evaluated']} plans in {r['search_seconds']:.1f} s"
    if not t:
        return line
    limit = f" of the {t['time_limit']:g} s limit" if t.get("time_limit") else " (no limit)"
    line += f": search {t['search_seconds']:.1f} s{limit}, profiling {t['profiled_shapes']} new step shapes {t['profiling_seconds']:.1f} s"
    if t["passes"] > 1:
        line += f", finding them {t['finding_seconds']:.1f} s ({t['passes'] - 1} more search passes)"
    return line + (" (profiling counted in the limit)" if t.get("time_limit") else "")


def fit_plot(o: FitOutcome) -> bytes:
    """The memory over the chosen plan's steps, against the budget and reuse alone: a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    live = memory_over_steps(o.plan, o.app.graphs)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(range(len(live)), [v / MB for v in live], lw=1, label="live buffers + kernel temporaries")
    if o.constraints.budget_bytes is not None:
        run_budget = o.constraints.budget_bytes - o.counted_params
        ax.axhline(run_budget / MB, color="red", ls="--", lw=1, label="budget" + (" minus parameters" if o.with_params else ""))
    ax.axhline(o.search.reuse.memory_bytes / MB - o.counted_params / MB, color="gray", ls=":", lw=1, label="reuse only (peak)")
    start = 0
    for p in o.plan.partitions:
        if start:
            ax.axvline(start, color="black", lw=0.5, alpha=0.4)
        start += len(p.steps)
    ax.set_xlabel("step")
    ax.set_ylabel("MB (10^6 bytes)")
    ax.set_title(f"{' + '.join(o.app.names)}: memory over the chosen plan's steps")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    return png.getvalue()


# --- export -------------------------------------------------------------------------------------

def export_lines(out: str, sources) -> list[str]:
    """What `tightfit export` wrote into `out` and how to build and run it."""
    return [f"exported {sources.steps} steps to {out}/ ({sources.name}.c, {sources.name}.h, tf_kernels.c, main.c, Makefile"
            + (", weights.bin" if sources.weights_in_file else "") + ")",
            f"build: make -C {out}   run: {out}/{sources.name} INPUT.bin OUTPUT.bin [RUNS]"
            f"   (make -C {out} debug: the same program under -fsanitize=address,undefined)"]


def mcu_export_lines(out: str, target: str, sources, project, built) -> list[str]:
    """What `tightfit export --target cortex-m..` wrote into `out`, how to build and run it, and
    where its memory went."""
    return [f"exported {sources.steps} steps to {out}/ as a {target} firmware project: the library "
            f"({sources.name}.c, {sources.name}.h, tf_kernels.c/.h), {', '.join(project.support)}",
            f"build: make -C {out}   run under qemu: make -C {out} run-qemu "
            f"(reads {out}/input.bin, writes {out}/output.bin: float32, in the model file's layout)",
            built.memory_report()]


def exported_lines(report: dict[str, Any]) -> list[str]:
    """fit's lines about the program it exported (--export), if it did."""
    e = report.get("exported")
    if not e:
        return []
    if "target" not in e:
        return [f"  exported to {e['folder']}/: build with make -C {e['folder']}"]
    if not is_mcu(e["target"]):
        return [f"  exported to {e['folder']}/ for {e['target']}: build with make -C {e['folder']} (a cross compiler), "
                f"run here with make -C {e['folder']} run-qemu"]
    return [f"  {report['target_budget']}",
            f"  exported to {e['folder']}/ as a {e['target']} firmware project: make -C {e['folder']}, "
            f"make -C {e['folder']} run-qemu", f"  {e['memory']}"]



def is_mcu(target: str) -> bool:
    """Whether an export target is a microcontroller (a firmware project), not a Linux program."""
    return target.startswith("cortex-m")


def linux_export_lines(out: str, target: str, sources, cc: str) -> list[str]:
    """`export --target aarch64-linux`'s lines: what was written and how to build and run it."""
    return [f"exported {sources.steps} steps to {out}/ for {target} ({sources.name}.c, {sources.name}.h, "
            f"tf_kernels.c, main.c, Makefile" + (", weights.bin" if sources.weights_in_file else "") + ")",
            f"build: make -C {out} (NEON kernels; make -C {out} portable: the portable ones) with {cc}"
            f"   run here: make -C {out} run-qemu   on the board: ./{sources.name} INPUT.bin OUTPUT.bin [RUNS]"]
