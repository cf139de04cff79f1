"""The commands as one staged pipeline: load -> profile -> search -> place -> check -> run or
export -> verify -> measure -> report (-> write). Each command is a function of its options
object (tightfit.options), which the CLI's parser and the API build alike; it runs the stages it
needs (tightfit.stages, tightfit.files) in that order and answers a Result: the report (what
--json prints), its text (report.py formats it) and the exit status. Nothing here parses a
command line or prints."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tightfit import atomic
from tightfit.analysis import csdf as C
from tightfit.analysis.memory import account
from tightfit.errors import OptionError, VerificationFailed
from tightfit.export import BuildOptions, default_name, generate, linux, mcu
from tightfit.export.build import write_files
from tightfit.export.errors import DoesNotFitError
from tightfit.files import load_plan, read_inputs, write_fit_folder, write_outputs, write_plan
from tightfit.frontend import zoo
from tightfit.frontend.app import is_app_file, load_app
from tightfit.frontend.load import load
from tightfit.graph.forms import file_output, file_outputs
from tightfit.graph.ir import DTYPE_BYTES, Graph
from tightfit.options import CsdfOptions, ExportOptions, FitOptions, InspectOptions, PlanOptions, RunOptions, is_plan_file
from tightfit.plan.check import check_plan
from tightfit.plan.overlay import overlap_in_place
from tightfit.plan.schema import Plan
from tightfit.reference import run_reference
from tightfit.report import (io_line, model_io, export_lines, exported_lines, fit_report, fit_text, inspect_json, inspect_table, int8_lines, is_mcu,
                             layout_map, linux_export_lines, mcu_export_lines, plan_report, plan_run_text, plan_text, run_report,
                             run_text, vbs_text)
from tightfit.runtime.cost import CostModel
from tightfit.runtime.enforce import MARGIN, require_available
from tightfit.runtime.measure import measure_subprocess
from tightfit.runtime.reference import input_dtype, input_shapes, random_input
from tightfit.stages import (FitOutcome, check_batch, check_export, check_export_linux, check_export_mcu, execute, load_fit_app, param_bytes,
                             plan_for_budget, plan_inputs, run_model)
from tightfit.stages import fit as search_fit
from tightfit.techniques.interface import Config, PlannedModel
from tightfit.techniques.registry import TECHNIQUES, technique
from tightfit.techniques.reuse.planner import plan_reuse
from tightfit.units import human, parse_size
from tightfit.vbs_calibration import compare_methods
from tightfit.verify import compare, verify_with_onnxruntime

RAM_RESERVE = 256  # bytes of RAM first set aside for the test program's own .data/.bss (measured: ~120)
FIT_TRIES = 3      # a RAM overflow at link time lowers the arena budget by as much and fits again


@dataclass(frozen=True)
class Result:
    """What a command answers: `report` (JSON-ready), `text` (for a person), the exit status."""

    report: Any
    text: str
    status: int = 0


# --- zoo, inspect, csdf -------------------------------------------------------------------------

def zoo_list() -> Result:
    entries = zoo.entries()
    width = max(len(e.name) for e in entries)
    return Result([{"name": e.name, "input_shape": list(e.input_shape), "source": e.source, "about": e.about} for e in entries],
                  "\n".join(f"{e.name:<{width}}  {'x'.join(map(str, e.input_shape)):<14}  {e.source:<11}  {e.about}"
                            for e in entries))


def inspect(o: InspectOptions) -> Result:
    """load -> report: the per-layer memory accounting."""
    graph = load(o.model, o.input_shape)
    if o.batch < 1:
        raise OptionError("--batch must be at least 1")
    mem = account(graph, o.dtype, o.workspace, o.batch)
    int8 = int8_lines(graph)
    io = model_io(graph, o.batch)
    return Result({**inspect_json(mem), **io, **({"int8": int8} if int8 else {})},
                  "\n".join([inspect_table(mem), io_line(io)] + int8))


def parse_phases(text: str) -> dict | str:
    """--phases: ID=P,NAME=P,... as {layer id or name: phases}, or "max" (resolved on the graph)."""
    if text.strip() == "max":
        return "max"
    phases: dict = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = item.rpartition("=")
        if not sep or not value.isdigit() or int(value) < 1:
            raise OptionError(f"cannot read --phases item {item!r}: write ID=P or NAME=P with P >= 1")
        phases[int(key) if key.isdigit() else key] = int(value)
    return phases


def _phases_of(phases, graph: Graph) -> dict | None:
    return C.max_phases(graph) if phases == "max" else phases


def csdf(o: CsdfOptions) -> Result:
    """load -> the cyclo-static dataflow graph (Minakova & Stefanov Alg. 1) -> report."""
    graph = load(o.model, o.input_shape)
    if o.source_rows and o.source_phases:
        raise OptionError("give --source-rows or --source-phases, not both")
    try:
        rows = [int(r) for r in o.source_rows.split(",")] if o.source_rows else o.source_phases
    except ValueError:
        raise OptionError(f"cannot read --source-rows {o.source_rows!r}: write rows per phase, e.g. 24,8") from None
    if rows is not None and (min(rows) if isinstance(rows, list) else rows) < 1:
        raise OptionError("--source-rows and --source-phases must be positive")
    phases = _phases_of(parse_phases(o.phases), graph)
    g = C.to_csdf(graph, phases, rows, o.itemsize)
    C.check_balance(g)
    if o.format == "sdf3":
        return Result(None, C.to_sdf3_xml(g))
    if o.format == "dot":
        return Result(None, C.to_dot(g))
    order = C.firing_order(g)
    sizes = C.buffer_sizes(g, order)
    lines = [f"{graph.name}: {len(g.actors)} actors, {len(g.channels)} channels, {len(order)} firings; balance holds"]
    lines += [f"  {name:<40} {size:>12} B" for name, size in sizes.items()]
    lines += [f"  {'total (no reuse)':<40} {sum(sizes.values()):>12} B", "  order: " + C.describe_order(g, order),
              _parts_arena_line(o.model, graph, phases, rows, o.itemsize)]
    return Result(None, "\n".join(lines))


def _parts_arena_line(spec: str, graph: Graph, phases: dict, source_rows, item: int) -> str:
    """The arena of the parts plan of these phases, buffers shared by lifetime, at the same bytes
    per element as the summary above."""
    dtype = next((d for d, n in DTYPE_BYTES.items() if n == item), None)
    if dtype is None:
        return f"  arena with reuse: not planned ({item}-byte elements; plans take {sorted(set(DTYPE_BYTES.values()))})"
    config = Config("nhwc", dtype, "improve", settings={"phases": phases, "source": source_rows})
    plan_ = technique("parts").draft(PlannedModel(graph, spec), config)
    rep = check_plan(plan_, [graph])
    return (f"  arena with reuse (the parts plan of these phases, 64-byte aligned offsets): {rep.arena_bytes} B; "
            f"buffers without reuse {sum(b.nbytes for b in plan_.buffers)} B; lower bound {rep.lower_bound} B")


# --- plan ---------------------------------------------------------------------------------------

def _check_plan_options(o: PlanOptions) -> PlanOptions:
    """Which options go together (one line each), before anything is loaded; `phases` read, and
    method "naive" as what it is (reuse without reuse: every buffer after the previous one)."""
    if o.method != "parts" and (o.rows or o.phases):
        raise OptionError("--rows and --phases go with --method parts")
    if o.rows and o.phases:
        raise OptionError("give --rows or --phases, not both")
    if isinstance(o.phases, str):
        o = replace(o, phases=parse_phases(o.phases) or None)
    if o.method != "vbs" and (o.unit_bytes or o.latency is not None):
        raise OptionError("--unit and --latency go with --method vbs")
    if o.method == "naive":
        o = replace(o, method="reuse", planner="naive")
    if o.method not in TECHNIQUES:
        raise OptionError(f"unknown method {o.method!r}; available: naive, {', '.join(TECHNIQUES)}")
    check_batch(o.batch)
    if o.tiling and o.method != "tiling":
        raise OptionError("--tiling goes with --method tiling")
    if o.held and o.method != "parts":
        raise OptionError("--hold goes with --method parts")
    if o.stream_outputs and o.method != "parts":
        raise OptionError("--stream-outputs goes with --method parts (fit: its plans by parts)")
    return o


def plan_model(o: PlanOptions) -> tuple[Plan, list[Graph]]:
    """load -> profile -> search (with a budget; else the technique's draft of the settings
    given) -> place -> check: the plan of a model or an application file and its graphs. Every
    method is a technique of the registry (techniques/registry.py)."""
    o = _check_plan_options(o)
    if is_app_file(o.model):
        app, graphs = load_app(o.model, o.allow_code)
        models = [PlannedModel(g, c.model, o.batch) for g, c in zip(graphs, app.cnns)]
        parts, concurrent = [(p.cnn, p.layers) for p in app.partitions], app.pipelines
    else:
        graphs = [load(o.model, o.input_shape)]
        models, parts, concurrent = [PlannedModel(graphs[0], o.model, o.batch)], None, ()
    if o.method == "reuse":
        if o.budget is not None:
            raise OptionError("--budget goes with --method parts, tiling or vbs")
        # An application's CNNs share one arena (reuse is the one technique that plans several).
        p = _in_place(o, plan_reuse(models, o.planner, o.order, o.layout, partitions=parts, concurrent=concurrent), graphs)
        check_plan(p, graphs)
        return p, graphs
    if len(models) != 1:
        raise OptionError(f"--method {o.method} plans one CNN" + (" (applications by parts come with `fit`)"
                                                                    if o.method == "parts" else ""))
    p = _in_place(o, _drafted_or_searched(o, models[0]), graphs)
    check_plan(p, graphs)
    return p, graphs


def _in_place(o: PlanOptions, p: Plan, graphs: list[Graph]) -> Plan:
    """With --inplace, the plan with outputs over their inputs where the kernels allow and the
    arena shrinks (a plan within a budget stays within it)."""
    if not o.inplace:
        return p
    if p.concurrent or o.planner == "naive":
        raise OptionError("--inplace needs partitions that run one after another and a planner that reuses memory (not naive)")
    over = overlap_in_place(p, graphs, o.planner)
    return replace(over, knobs=dict(over.knobs, inplace=True, overlap=True))


def _drafted_or_searched(o: PlanOptions, model: PlannedModel) -> Plan:
    """The technique's draft of the settings given, or without them its search within the budget."""
    settings = {"parts": dict(phases=_phases_of(o.phases, model.graph), rows=o.rows, held=tuple(o.held)),
                "tiling": dict(tiling=o.tiling), "vbs": {}}.get(o.method, {})
    config = Config(o.layout, "fp32", o.planner, o.order, {k: v for k, v in settings.items() if v})
    streamed = {"stream_outputs": True} if o.stream_outputs else {}
    if o.budget is None:
        config = replace(config, settings={**config.settings, **streamed})
        if o.method == "parts" and o.inplace:  # its overlay blocks kept only where they help
            config = replace(config, settings={**config.settings, "inplace": True})
        if o.method == "tiling" and not o.tiling:
            raise OptionError("--method tiling needs --tiling FIRST-LAST:NxM,... or --budget SIZE (one of them)")
        if o.method == "vbs":
            raise OptionError("--method vbs needs --budget SIZE (the memory the request may use)")
        return technique(o.method).draft(model, config)
    if config.settings:
        raise OptionError({"parts": "give --budget, --rows or --phases, not several (--hold goes with --rows or --phases)",
                           "tiling": "--method tiling needs --tiling FIRST-LAST:NxM,... or --budget SIZE (one of them)"
                           }[o.method])
    config = replace(config, settings={**config.settings, **streamed})
    return plan_for_budget(o.method, model, o.budget, config, o.cost, o.time_limit, o.say,
                           dict(unit_bytes=o.unit_bytes, latency=o.latency) if o.method == "vbs" else {})


def plan(o: PlanOptions) -> Result:
    """`tightfit plan`: profile -> plan_model -> report (vbs: the three methods compared) -> write."""
    o = _check_plan_options(o)  # before the profile, which --reprofile measures again
    if o.budget is not None and o.cost is None:  # profile: this machine's step times
        o = replace(o, cost=CostModel.default(o.reprofile))
    t0 = time.perf_counter()
    p, graphs = plan_model(o)
    report = plan_report(p, graphs, check_plan(p, graphs), time.perf_counter() - t0)
    if o.method == "vbs":
        report["vbs"] = compare_methods(p, graphs[0], o.cost, o.planner, o.layout)
    if o.out:
        write_plan(p, o.out)
        report["written"] = o.out
    text = [plan_text(report)]
    if "vbs" in report:
        text.append(vbs_text(report["vbs"], graphs[0]))
    if o.layout_map:
        text.append(layout_map(p, graphs))
    return Result(report, "\n".join(text))


# --- run ----------------------------------------------------------------------------------------

def run(o: RunOptions) -> Result:
    """`tightfit run`: a plan file (run_plan) or a model: load -> run on the reference executor
    -> write the outputs -> verify against onnxruntime -> measure in a fresh process -> report."""
    if is_plan_file(o.model):
        return run_plan(o)
    if o.enforce:
        raise OptionError("--enforce runs a plan: give a plan.json made by `tightfit plan`")
    graph = load(o.model, o.input_shape)
    need = account(graph, batch=graph.shape(graph.inputs[0])[0])
    # onnxruntime (--verify) holds the model's weights and activations a second time.
    require_available((need.layer_peak_bytes + need.param_bytes) * (2 if o.verify else 1),
                      "running the model layer by layer" + (" and in onnxruntime (--verify)" if o.verify else ""))
    x = read_inputs(o.input, [input_shapes(graph)], _dtypes([graph]), _nhwc([graph]))[0] if o.input else random_input(graph)
    result = run_model(graph, x, threads=o.threads)
    result = replace(result, outputs=file_outputs(graph, result.outputs))  # as the model file gives them
    report = run_report(graph, result)
    if o.output:
        report["written"] = {"file": o.output, "outputs": write_outputs(o.output, list(result.outputs.items()))}
    if o.verify:
        report["verify"] = verify_with_onnxruntime(o.model, o.input_shape, graph, x, result.outputs).as_dict()
    if o.measure:
        m = measure_subprocess({"kind": "reference", "model": o.model,
                                "input_shape": _json_shape(o.input_shape)})
        report["measured"] = {"baseline_bytes": m.baseline_bytes, "run_bytes": m.run_bytes, "seconds": m.seconds,
                              "uncertainty_bytes": m.uncertainty_bytes}
        report["analysed_layer_peak_bytes"] = need.layer_peak_bytes
    return Result(report, run_text(report), 1 if o.verify and not report["verify"]["ok"] else 0)


def _dtypes(graphs) -> list:
    """Every CNN's inputs' element types in their order (int8 for an int8 graph input)."""
    return [input_dtype(g, t) for g in graphs for t in g.inputs]


def _nhwc(graphs) -> list:
    """Every CNN's inputs' shapes in their model files where a file takes one channels-last, else None."""
    forms = [{t: shape for t, form, shape in g.input_forms if form == "nhwc"} for g in graphs]
    return [f.get(t) for g, f in zip(graphs, forms) for t in g.inputs]


def _json_shape(shape) -> "list[int] | dict[str, list[int]] | None":
    """--input-shape as a child process is told it: one shape, or {input name: shape}."""
    if not shape:
        return None
    return {k: list(v) for k, v in shape.items()} if isinstance(shape, dict) else list(shape)


def run_plan(o: RunOptions) -> Result:
    """A plan file: load and check -> (enforce) -> run on the arena executor -> write the outputs
    -> verify against the reference executor -> measure in a fresh process -> report."""
    plan_, graphs = load_plan(o.model, allow_code=o.allow_code)
    analysis = check_plan(plan_, graphs)
    report: dict = {"plan": o.model, "arena_bytes": analysis.arena_bytes, "scratch_peak_bytes": analysis.scratch_peak,
                    "analysed_peak_bytes": analysis.peak_bytes, "lower_bound_bytes": analysis.lower_bound}
    if o.enforce:
        limit = parse_size(o.limit) if o.limit else analysis.peak_bytes + MARGIN
        m = measure_subprocess({"kind": "plan", "plan": o.model, "enforce_bytes": limit, "allow_code": o.allow_code})
        report["enforced_limit_bytes"] = limit
        report["enforced_run_bytes"] = m.run_bytes
    elif o.limit:
        raise OptionError("--limit goes with --enforce")
    shapes = [input_shapes(g, ref.batch) for g, ref in zip(graphs, plan_.models)]
    xs = read_inputs(o.input, shapes, _dtypes(graphs), _nhwc(graphs)) if o.input else plan_inputs(graphs, plan_)
    outs, seconds = execute(plan_, graphs, xs, threads=o.threads)
    outs = [file_outputs(g, o_) for g, o_ in zip(graphs, outs)]  # as the model files give them
    report["seconds"] = seconds
    report["outputs"] = {f"{m}:{k}": list(v.shape) for m, o_ in enumerate(outs) for k, v in o_.items()}
    if o.output:
        named = [(k if len(outs) == 1 else f"cnn{m}_{k}", v) for m, o_ in enumerate(outs) for k, v in o_.items()]
        report["written"] = {"file": o.output, "outputs": write_outputs(o.output, named)}
    if o.verify:
        report["verify"] = _verify_plan_outputs(graphs, xs, outs)
    if o.measure:
        m = measure_subprocess({"kind": "plan", "plan": o.model, "allow_code": o.allow_code})
        report["measured"] = {"baseline_bytes": m.baseline_bytes, "run_bytes": m.run_bytes, "seconds": m.seconds,
                              "uncertainty_bytes": m.uncertainty_bytes}
    return Result(report, plan_run_text(report), 1 if o.verify and not report["verify"]["ok"] else 0)


def _verify_plan_outputs(graphs, xs, outs) -> dict:
    """The worst comparison of a plan's outputs with the reference executor's."""
    worst = None
    for g, x, o in zip(graphs, xs, outs):
        ref = run_reference(g, x)
        for k, v in o.items():
            c = compare(v, file_output(g, k, ref[k]))
            worst = c if worst is None or (not c.ok) or (worst.ok and c.max_abs_diff > worst.max_abs_diff) else worst
    return worst.as_dict() if worst else {"ok": True}


# --- fit ----------------------------------------------------------------------------------------

def _fit_budget(o: FitOptions) -> int | None:
    """The run-memory budget: `budget`, or with a cortex-m target what `ram` leaves after the
    stack and the program's other data (its first guess: RAM_RESERVE). The folders are refused
    now, not after minutes of search."""
    for option, folder in (("--out", o.out), ("--export", o.export)):
        if folder:
            atomic.check_output_folder(folder, o.force, option)
    if o.out and o.export and os.path.abspath(o.out) == os.path.abspath(o.export):
        raise OptionError("--out and --export name the same folder: give each its own")
    if not is_mcu(o.target):
        if o.ram or o.flash:
            raise OptionError("--ram and --flash go with a cortex-m --target")
        if o.target != "host" and not o.export:
            raise OptionError(f"--target {o.target} goes with --export (the folder to write the program into)")
        return o.budget
    if not (o.ram and o.flash and o.export):
        raise OptionError(f"--target {o.target} needs --ram, --flash and --export, e.g. --ram 512KiB --flash 2MiB --export fw")
    if o.stream_outputs:
        raise OptionError(f"--stream-outputs does not go with --target {o.target} (its program reads the outputs from the arena)")
    if o.budget is not None or o.with_params or o.min_fps:
        raise OptionError(f"with --target {o.target} the budget is what --ram leaves (the weights live in --flash): "
                          "leave out --budget, --with-params and --min-fps")
    left = parse_size(o.ram) - mcu.DEFAULT_STACK_BYTES - RAM_RESERVE
    if left <= 0:
        raise OptionError(f"--ram {o.ram} leaves nothing for the arena after the {mcu.DEFAULT_STACK_BYTES} B stack")
    return left


def fit(o: FitOptions) -> Result:
    """`tightfit fit`: load -> profile, search, choose, place, check, verify, measure
    (stages.fit) -> export (a RAM overflow at link time fits again to a smaller budget) ->
    report -> write. VerificationFailed (an internal bug): nothing is reported or written."""
    budget = _fit_budget(o)
    app = load_fit_app(o.model, o.input_shape, o.batch, o.allow_code)
    if o.inplace and app.concurrent:
        raise OptionError("--inplace needs partitions that run one after another (this application pipelines some)")
    if is_mcu(o.target):
        weights = param_bytes(app)
        if weights >= parse_size(o.flash):  # known now: no search for a program that cannot fit
            raise OptionError(f"the weights alone ({weights} B, {human(weights)}) do not fit --flash {o.flash}")
    for attempt in range(FIT_TRIES):
        outcome = search_fit(app, replace(o, budget=budget))
        report = fit_report(outcome)
        if is_mcu(o.target):
            report["target_budget"] = (f"budget: what --ram {o.ram} leaves after the {mcu.DEFAULT_STACK_BYTES} B stack "
                                       f"and the program's own data: {budget} B")
        try:
            if o.export:
                report["exported"] = _fit_export(o, outcome)
            break
        except DoesNotFitError as e:
            if not e.ram_overflow or e.flash_overflow or attempt == FIT_TRIES - 1:
                raise
            # The program's data took more than set aside: a plan smaller by as much as it overflowed.
            budget = min(budget, outcome.memory_bytes) - -(-e.ram_overflow // 64) * 64
            o.say(f"fit: the program's own data took {e.ram_overflow} B more RAM; fitting again to {budget} B")
    if o.out:
        write_fit_folder(outcome, o.out, report, o.force)
        report["written"] = o.out
    return Result(report, "\n".join([fit_text(report), *exported_lines(report)]))


def _fit_export(o: FitOptions, outcome: FitOutcome) -> dict:
    """The chosen plan exported into `o.export`: the host C program, the same for a Linux board
    (its Makefile cross-compiles it), or with a cortex-m target the firmware project, built (whole
    or not at all)."""
    weights = "c" if is_mcu(o.target) else "auto"
    sources = generate(outcome.plan, outcome.app.graphs, default_name(outcome.plan), weights)
    with atomic.output_folder(o.export, o.force, "--export") as stage:
        if o.target == "host":
            write_files(sources, stage)
            return {"folder": o.export, "name": sources.name, "steps": sources.steps}
        if not is_mcu(o.target):
            linux.write_files(sources, stage, o.target)
            return {"folder": o.export, "name": sources.name, "steps": sources.steps, "target": o.target}
        project = mcu.write_project(stage, sources, o.target, parse_size(o.ram), parse_size(o.flash))
        built = mcu.build_project(stage, project)
        return {"folder": o.export, "name": sources.name, "steps": sources.steps, "target": o.target,
                "memory": built.memory_report(), "mcu": _paths_as_text(asdict(built))}


def _paths_as_text(record: dict) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in record.items()}


# --- export -------------------------------------------------------------------------------------

def _check_export_options(o: ExportOptions) -> None:
    if not is_mcu(o.target) and (o.ram or o.flash):
        raise OptionError("--ram and --flash go with a cortex-m target")
    if o.target == "aarch64-linux" and o.sanitize:
        raise OptionError("--sanitize goes with the host target (the sanitizers do not run under qemu-aarch64)")
    if is_mcu(o.target) and not (o.ram and o.flash):
        raise OptionError(f"--target {o.target} needs --ram and --flash, e.g. --ram 512KiB --flash 2MiB")
    if is_mcu(o.target) and o.weights == "file":
        raise OptionError(f"--target {o.target} keeps the weights in flash: --weights file goes with the host target")
    if o.runs < 1:
        raise OptionError("--runs must be at least 1")
    if o.keep_io and not o.check:
        raise OptionError("--keep-io goes with --check (it keeps the checked input and reference output)")
    if is_mcu(o.target) and (o.sanitize or o.cc or o.cflags):
        raise OptionError("--sanitize, --cc and --cflags go with the host target")


def export(o: ExportOptions) -> Result:
    """`tightfit export`: load the plan file -> export (generate, write) -> with `check` build,
    run, verify, measure -> report. Everything, the check's build and run included, happens in a
    staged folder that takes `o.out`'s place only at the end: a failure or a signal leaves it as
    it was."""
    _check_export_options(o)
    atomic.check_output_folder(o.out, o.force)  # before the plan is loaded: no work wasted
    plan_, graphs = load_plan(o.plan, allow_code=o.allow_code)
    with atomic.output_folder(o.out, o.force) as stage:
        report, lines, ok = _export_into(o, plan_, graphs, stage)
    return Result(report, "\n".join(lines), 0 if ok else 1)


def _export_into(o: ExportOptions, plan_: Plan, graphs, stage: Path) -> tuple[dict, list[str], bool]:
    """Export (and with `check` build, run and compare) into `stage`, which becomes `o.out`."""
    weights = "c" if is_mcu(o.target) and o.weights == "auto" else o.weights
    sources = generate(plan_, graphs, o.name or default_name(plan_), weights)
    if is_mcu(o.target):
        return _export_mcu(o, plan_, graphs, sources, stage)
    if o.target != "host":
        return _export_linux(o, plan_, graphs, sources, stage)
    write_files(sources, stage)
    report: dict = {"plan": o.plan, "folder": o.out, "name": sources.name, "steps": sources.steps,
                    "arena_bytes": sources.arena_bytes, "weight_bytes": sources.weight_bytes,
                    "weights_file": sources.weights_in_file}
    lines = export_lines(o.out, sources)
    if not o.check:
        return report, lines, True
    return _check_host(o, (plan_, graphs, sources), stage, report, lines)


def _check_host(o: ExportOptions, exported: tuple, stage: Path, report: dict, lines: list[str]) -> tuple[dict, list[str], bool]:
    plan_, graphs, sources = exported
    build = BuildOptions(o.cc, o.cflags, o.runs)
    result = check_export(plan_, graphs, sources, stage, build, keep_io=stage if o.keep_io else None)
    report["check"] = {k: v for k, v in result.__dict__.items() if k != "built"} | {"budget_bytes": result.budget_bytes}
    lines += result.lines()
    if o.keep_io:
        lines.append(f"kept: {o.out}/input.bin (the checked input) and {o.out}/reference.bin (the reference output), "
                     f"in the model file's layout (float32, an int8 input's bytes): {o.out}/{sources.name} "
                     f"{o.out}/input.bin out.bin, then compare out.bin with reference.bin")
    ok = result.ok
    if o.sanitize:
        clean = check_export(plan_, graphs, sources, stage, replace(build, runs=1, sanitize=True))
        report["sanitized"] = {"ok": clean.ok}
        lines.append("under -fsanitize=address,undefined: " + ("no reports, outputs match" if clean.ok else "outputs DIFFER"))
        ok = ok and clean.ok
    return report, lines, ok


def _export_linux(o: ExportOptions, plan_: Plan, graphs, sources, stage: Path) -> tuple[dict, list[str], bool]:
    """The host program for a Linux board (--target aarch64-linux), with `check` cross-built and
    run under qemu."""
    linux.write_files(sources, stage, o.target)
    report: dict = {"plan": o.plan, "folder": o.out, "name": sources.name, "steps": sources.steps, "target": o.target,
                    "arena_bytes": sources.arena_bytes, "weight_bytes": sources.weight_bytes,
                    "weights_file": sources.weights_in_file}
    lines = linux_export_lines(o.out, o.target, sources, linux.linux_target(o.target).cc)
    if not o.check:
        return report, lines, True
    got = check_export_linux(plan_, graphs, sources, stage, o.target, BuildOptions(o.cc, o.cflags),
                             keep_io=stage if o.keep_io else None)
    report["check"] = {k: v for k, v in got.__dict__.items() if k != "built"}
    lines += got.lines()
    return report, lines, got.ok


def _export_mcu(o: ExportOptions, plan_: Plan, graphs, sources, stage: Path) -> tuple[dict, list[str], bool]:
    project = mcu.write_project(stage, sources, o.target, parse_size(o.ram), parse_size(o.flash))
    built = mcu.build_project(stage, project)
    report: dict = {"plan": o.plan, "folder": o.out, "name": sources.name, "steps": sources.steps,
                    "arena_bytes": sources.arena_bytes, "weight_bytes": sources.weight_bytes,
                    "mcu": _paths_as_text(asdict(built))}
    report["mcu"]["elf"] = str(Path(o.out) / built.elf.name)
    lines = mcu_export_lines(o.out, o.target, sources, project, built)
    if not o.check:
        return report, lines, True
    if built.qemu_problem:
        report["mcu_check"] = {"ran": False, "why": built.qemu_problem}
        lines.append(f"--check not run: {built.qemu_problem}")
        return report, lines, True
    got = check_export_mcu(plan_, graphs, built, keep_io=stage if o.keep_io else None)
    report["mcu_check"] = asdict(got)
    lines.append(got.summary())
    return report, lines, got.ok


__all__ = ["Result", "VerificationFailed", "csdf", "export", "fit", "inspect", "plan", "plan_model", "run", "run_plan", "zoo_list"]
