"""Tables and JSON the CLI prints. Units are stated in every header."""
from __future__ import annotations

from typing import Any

from tightfit.analysis.memory import ModelMemory
from tightfit.units import human, mib, round_half_up


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


def run_report(graph, result) -> dict[str, Any]:
    outs = {}
    for name, t in result.outputs.items():
        outs[name] = {"shape": list(t.shape), "mean": float(t.mean()), "std": float(t.std()) if t.numel() > 1 else 0.0,
                      "argmax": int(t.reshape(t.shape[0], -1).argmax(1)[0])}
    return {"model": graph.name, "layers": len(graph.layers), "seconds": result.seconds, "outputs": outs}


def run_text(report: dict[str, Any]) -> str:
    lines = [f"{report['model']}: {report['layers']} layers, reference executor {report['seconds'] * 1e3:.1f} ms"]
    for name, o in report["outputs"].items():
        lines.append(f"  output {name}: shape {'x'.join(map(str, o['shape']))}, mean {o['mean']:.4g}, std {o['std']:.4g}, argmax {o['argmax']}")
    if "verify" in report:
        v = report["verify"]
        lines.append(f"  verify vs onnxruntime: {'OK' if v['ok'] else 'MISMATCH'} (max abs diff {v['max_abs_diff']:.3g}, "
                     f"tolerance {v['tolerance']:.3g} = 1e-4 x max abs {v['max_abs_ref']:.3g})")
    if "measured" in report:
        m = report["measured"]
        lines.append(f"  measured peak above loaded baseline: {human(m['run_bytes'])} (analysed layer-by-layer peak "
                     f"{human(report['analysed_layer_peak_bytes'])}); run {m['seconds'] * 1e3:.1f} ms")
    return "\n".join(lines)


def plan_report(plan, graphs, analysis, seconds: float) -> dict[str, Any]:
    naive = sum(t.nbytes(plan.dtype, m.batch) for g, m in zip(graphs, plan.models) for t in g.original_tensors)
    return {
        "models": [m.spec for m in plan.models], "knobs": dict(plan.knobs), "steps": analysis.steps,
        "buffers": len(plan.buffers), "naive_activation_bytes": naive, "lower_bound_bytes": analysis.lower_bound,
        "arena_bytes": analysis.arena_bytes, "ratio_to_lower_bound": analysis.ratio,
        "scratch_peak_bytes": analysis.scratch_peak, "analysed_peak_bytes": analysis.peak_bytes,
        "planning_seconds": seconds,
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
        lines.append(f"  measured peak above loaded baseline: {human(m['run_bytes'])} (analysed {human(r['analysed_peak_bytes'])})")
    return "\n".join(lines)


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
