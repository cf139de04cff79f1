"""The small public API; the CLI is built on it."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from tightfit.analysis.memory import ModelMemory, account
from tightfit.errors import OptionError
from tightfit.frontend.load import load, load_ref
from tightfit.graph.fingerprint import fingerprint
from tightfit.graph.ir import Graph

if TYPE_CHECKING:
    import torch

    from tightfit.runtime.cost import CostModel


def inspect(graph: Graph, dtype: str = "fp32", workspace: str = "torch", batch: int = 1) -> ModelMemory:
    return account(graph, dtype, workspace, batch)


@dataclass(frozen=True)
class RunResult:
    outputs: dict[str, np.ndarray]
    seconds: float


def run(graph: Graph, x: np.ndarray | None = None, keep: Sequence[str] = (), threads: int = 1) -> RunResult:
    """Run the reference executor once on `x` (a seeded random input if None), on `threads` threads."""
    from tightfit.reference import run_reference
    from tightfit.runtime.reference import random_input

    x = random_input(graph) if x is None else x
    t0 = time.perf_counter()
    outs = run_reference(graph, x, keep, threads)
    return RunResult(outs, time.perf_counter() - t0)


# --- plans ------------------------------------------------------------------------------------

def plan(model: str, method: str = "reuse", planner: str = "improve", order: str = "imported",
         layout: str = "nhwc", batch: int = 1, input_shape: Sequence[int] | None = None,
         phases: dict | None = None, rows: int | None = None, budget: int | None = None,
         cost: CostModel | None = None, tiling: str | None = None, unit_bytes: int | None = None,
         latency: float | None = None, held: Sequence[int | str] = (), time_limit: float | None = None,
         say=lambda line: None, allow_code: bool = False):
    """Plan a model or an application file; returns (Plan, graphs). The plan is checked.

    method "parts" runs layers by parts: `phases` {layer id or name: phases}, or `rows` output
    rows per phase for every layer that can be split (and the input delivered `rows` at a time),
    or `budget` bytes: the fastest plan the search finds within it, timed by `cost` (a
    CostModel; default this machine's profile); with none of these, one row per phase everywhere
    (the paper's setting).

    method "tiling" runs groups of layers tile by tile: `tiling` "0-7:5x5,8-15:2x2:reuse" (layer
    ids, grid, optional overlap policy), or `budget` bytes: the fastest configuration the tiling
    search finds within it (see techniques/tiling).

    Every method is a technique of the registry (techniques/registry.py): its `draft` plans the
    settings given, its `search` the budget (`plan_for_budget`).

    method "vbs" runs the `batch` samples of a request with a variable batch size across layers
    (Choudhury et al.): the fastest schedule the dynamic program finds within `budget` bytes, at
    `unit_bytes` memory granularity, each pivot's latency within `latency` seconds if given.

    `model` may be module:factory; an application file's CNNs may only with `allow_code`."""
    from tightfit.frontend.app import is_app_file, load_app
    from tightfit.plan.check import check_plan
    from tightfit.techniques.interface import PlannedModel
    from tightfit.techniques.reuse.planner import plan_reuse
    from tightfit.techniques.interface import Config
    from tightfit.techniques.registry import TECHNIQUES, technique

    if method == "naive":  # reuse without reuse: every buffer after the previous one
        method, planner = "reuse", "naive"
    if method not in TECHNIQUES:
        raise OptionError(f"unknown method {method!r}; available: naive, {', '.join(TECHNIQUES)}")
    if not 1 <= batch <= 4096:  # the plan checker's bound on a plan's batch
        raise OptionError(f"--batch {batch} must be 1-4096")
    if tiling and method != "tiling":
        raise OptionError("--tiling goes with --method tiling")
    if held and method != "parts":
        raise OptionError("--hold goes with --method parts")
    if is_app_file(model):
        app, graphs = load_app(model, allow_code)
        models = [PlannedModel(g, c.model, batch) for g, c in zip(graphs, app.cnns)]
        parts = [(p.cnn, p.layers) for p in app.partitions]
        concurrent = app.pipelines
    else:
        graphs = [load(model, input_shape)]
        models, parts, concurrent = [PlannedModel(graphs[0], model, batch)], None, ()
    if method == "reuse":
        if budget is not None:
            raise OptionError("--budget goes with --method parts, tiling or vbs")
        # An application's CNNs share one arena (reuse is the one technique that plans several).
        p = plan_reuse(models, planner, order, layout, partitions=parts, concurrent=concurrent)
        check_plan(p, graphs)
        return p, graphs
    if len(models) != 1:
        raise OptionError(f"--method {method} plans one CNN" + (" (applications by parts come with `fit`)"
                                                                  if method == "parts" else ""))
    settings = {"parts": dict(phases=phases, rows=rows, held=tuple(held)), "tiling": dict(tiling=tiling),
                "vbs": {}}.get(method, {})
    config = Config(layout, "fp32", planner, order, {k: v for k, v in settings.items() if v})
    if budget is None:
        if method == "tiling" and not tiling:
            raise OptionError("--method tiling needs --tiling FIRST-LAST:NxM,... or --budget SIZE (one of them)")
        if method == "vbs":
            raise OptionError("--method vbs needs --budget SIZE (the memory the request may use)")
        p = technique(method).draft(models[0], config)
    else:
        if config.settings:
            raise OptionError({"parts": "give --budget, --rows or --phases, not several (--hold goes with --rows or --phases)",
                               "tiling": "--method tiling needs --tiling FIRST-LAST:NxM,... or --budget SIZE (one of them)"
                               }[method])
        p = plan_for_budget(method, models[0], budget, config, cost, time_limit, say,
                            dict(unit_bytes=unit_bytes, latency=latency) if method == "vbs" else {})
    check_plan(p, graphs)
    return p, graphs


def _deadline(time_limit: float | None):
    """A new deadline `time_limit` seconds of search from now, per search pass (None: no limit)."""
    from tightfit.techniques.deadline import Deadline

    return lambda: None if time_limit is None else Deadline.after(time_limit)


# How each technique's budget search names what it found when nothing fits (BudgetError).
_NOT_FOUND = {"parts": ("no parts plan", "the smallest found needs", "plans tried"),
              "tiling": ("no tiling", "the smallest reachable needs", "group tilings tried")}


def plan_for_budget(method: str, model, budget: int, config, cost: CostModel | None = None,
                    time_limit: float | None = None, say=lambda line: None, settings: Mapping | None = None):
    """The technique's search for the fastest plan within `budget` (run memory) over a frozen
    profile of `cost` (default this machine's; profiled first where it lacks step shapes, see
    runtime/profiling.py), stopped after `time_limit` seconds of search; its pick placed by
    `config.planner`. BudgetError if nothing fits."""
    from dataclasses import replace

    from tightfit.errors import BudgetError
    from tightfit.runtime.cost import CostModel
    from tightfit.runtime.profiling import profiled_search
    from tightfit.techniques.interface import Problem, run_memory
    from tightfit.techniques.registry import technique
    from tightfit.units import human

    cost = cost or CostModel.default()
    settings = dict(settings or {})
    if method == "tiling":
        settings.setdefault("front_points", 0)  # one budget: no ladder of budgets for a front
    if method == "vbs":
        settings.update(_vbs_settings(model, budget, config, cost, settings, say))
    tech = technique(method)
    unplaced = replace(config, planner=None) if method != "vbs" else config
    found, profiling = profiled_search(
        cost, lambda predict, deadline: tech.search(Problem(model, budget, predict, unplaced, deadline, say,
                                                            settings=settings)),
        _deadline(time_limit), say, f"{method} search")
    say(profiling.line(f"{method} search", time_limit) + (" (time is up: the best found so far)" if found.timed_out else ""))
    if method == "vbs":
        if not found.fits:
            latency = settings.get("latency")
            raise BudgetError(f"no variable batch plan of {model.spec} for {model.batch} samples fits {human(budget)}"
                              + (f" with every pivot within {latency} s" if latency is not None else ""))
        return found.detail.plan
    p = tech.draft(model, replace(found.chosen.config, planner=config.planner))
    p = replace(p, knobs=dict(p.knobs, budget=budget, cost_profile=cost.id, predicted_seconds=found.chosen.seconds[0]))
    needs = run_memory(p)
    if needs > budget:  # also when nothing fits: the pick is then the smallest found
        what, smallest, tried = _NOT_FOUND[method]
        raise BudgetError(f"{what} of {model.spec} fits {human(budget)}: {smallest} {human(needs)} "
                          f"({found.chosen.labels[0]}; {found.evaluated} {tried})", smallest=p)
    return p


def _vbs_settings(model, budget: int, config, cost, settings: Mapping, say) -> dict:
    """What the variable-batch search needs measured before it: BudgetError naming the smallest
    feasible budget (found from memory alone) if `budget` is below it; the step times of every
    sub-batch profiled; the uniform plans calibrated by whole runs (times kept in the profile)."""
    from tightfit.errors import BudgetError
    from tightfit.techniques.vbs.graph_dp import DEFAULT_UNIT_BYTES, make_problem, memory_problem, smallest_feasible_budget
    from tightfit.runtime.profiling import profiled_search
    from tightfit.units import human
    from tightfit.vbs_calibration import MIXED_SCHEDULE_ERROR, UNIFORM_SCHEDULE_ERROR, calibrate

    unit = settings.get("unit_bytes") or DEFAULT_UNIT_BYTES
    least = smallest_feasible_budget(model, None, None, unit, config.layout, memory_problem(model), config.planner)
    if budget < least:
        raise BudgetError(f"no variable batch plan of {model.spec} for {model.batch} samples fits {human(budget)}: "
                          f"the smallest feasible budget is {human(least)} ({least} bytes)")
    profiled_search(cost, lambda predict, deadline: make_problem(model, predict, config.layout), say=say, what="vbs search")
    factors = calibrate(model, cost, config.planner, config.layout)
    return dict(unit_bytes=unit, batch_factors=factors, margin=MIXED_SCHEDULE_ERROR, fbs_margin=UNIFORM_SCHEDULE_ERROR)


def load_plan(path: str | Path, loaded: Mapping[tuple[str, tuple[int, ...]], Graph] | None = None,
              allow_code: bool = False):
    """Read a plan file, load the models it names (or take them from `loaded`, keyed by spec and
    input shape), check fingerprints and the plan itself. A model named by module:factory is
    loaded only with `allow_code` (a file carries data, not code)."""
    from tightfit.plan import schema
    from tightfit.plan.check import check_plan

    p = Path(path)
    plan_ = schema.read_plan(p)
    graphs = []
    for ref in plan_.models:
        spec = _model_file(ref, p.parent)
        g = (loaded or {}).get((ref.spec, tuple(ref.input_shape))) or load_ref(spec, ref.input_shape, allow_code, f"plan {p}")
        if fingerprint(g) != ref.fingerprint:
            raise schema.PlanError(f"plan {p} was made for another model than {spec} (fingerprint {fingerprint(g)}, "
                                   f"the plan's {ref.fingerprint}): was it changed? plan it again")
        graphs.append(g)
    check_plan(plan_, graphs)
    return plan_, graphs


def _model_file(ref, folder: Path) -> str:
    """Where a plan's model is: a zoo name or module:factory as written; a file relative to the
    plan's folder, else as written (relative to the working folder), else where it was when the
    plan was written. A missing file is one line naming every place looked at."""
    from tightfit.frontend import zoo
    from tightfit.plan import schema

    if ref.spec in zoo.names() or not _looks_like_file(ref.spec):
        return ref.spec
    candidates = [folder / ref.spec, Path(ref.spec)] + ([Path(ref.location)] if ref.location else [])
    for c in candidates:
        if c.is_file():
            return str(c)
    raise schema.PlanError(f"model file of the plan not found: looked at {', '.join(dict.fromkeys(map(str, candidates)))}")


def _looks_like_file(spec: str) -> bool:
    return spec.lower().endswith(".onnx") or Path(spec).is_file() or ("/" in spec and ":" not in spec)


def portable(plan_, folder: str | Path):
    """The plan with each model file named relative to `folder` (where the plan file goes) and by
    its absolute path, so the plan folder can be run from anywhere and moved (see load_plan)."""
    from dataclasses import replace

    from tightfit.frontend import zoo

    folder = Path(folder).resolve()
    models = []
    for ref in plan_.models:
        if ref.spec in zoo.names() or not Path(ref.spec).is_file():
            models.append(ref)
            continue
        target = Path(ref.spec).resolve()
        models.append(replace(ref, spec=Path(os.path.relpath(target, folder)).as_posix(), location=str(target)))
    return replace(plan_, models=tuple(models))


def write_plan(plan_, path: str | Path) -> None:
    """Write a plan file (its model paths made portable), to a temporary name renamed into place
    (OSError: atomic.OutputError, one line)."""
    from tightfit import atomic
    from tightfit.plan import schema

    path = Path(path)
    if path.is_dir():
        raise atomic.OutputError(f"{path} is a folder; a plan is one JSON file: name one, e.g. {path / 'plan.json'}")
    atomic.write_text(path, schema.dumps(portable(plan_, path.parent)))


def plan_inputs(graphs, plan_, seed: int = 0) -> list[np.ndarray]:
    from tightfit.runtime.reference import random_input

    return [random_input(g, ref.batch, seed + i) for i, (g, ref) in enumerate(zip(graphs, plan_.models))]


def execute(plan_, graphs, inputs: Sequence[np.ndarray] | None = None, fill_nan: bool = False, threads: int = 1):
    """Run a plan once with the arena executor on `threads` threads; returns per model {output:
    array} (copies)."""
    from tightfit.runtime.executor import ArenaExecutor

    xs = plan_inputs(graphs, plan_) if inputs is None else list(inputs)
    ex = ArenaExecutor(plan_, graphs, fill_nan=fill_nan, threads=threads)
    t0 = time.perf_counter()
    outs = ex.run(xs)
    seconds = time.perf_counter() - t0
    return [{k: v.copy() for k, v in o.items()} for o in outs], seconds


# --- the C export ------------------------------------------------------------------------------

def reference_io(plan_, graphs, seed: int = 0) -> tuple[list, list]:
    """The seeded inputs of a plan's CNNs and the reference executor's outputs on them (every
    output of every CNN, in order), as float32 arrays."""
    from tightfit.reference import run_reference

    inputs = plan_inputs(graphs, plan_, seed)
    refs = [run_reference(g, x)[t] for g, x in zip(graphs, inputs) for t in g.outputs]
    return list(inputs), refs


def check_export(plan_, graphs, sources, directory, cc: str | None = None, cflags=None, runs: int = 1,
                 sanitize: bool = False, seed: int = 0, timeout_s: float = 600, keep_io: str | Path | None = None):
    """Build an exported plan, run it on the seeded inputs, compare with the reference executor
    (tightfit.export.Check). With `keep_io`, a folder: the inputs and reference outputs are left
    there as input.bin and reference.bin (float32, every CNN's in order), to rerun the program on."""
    from tightfit.export import check

    inputs, refs = reference_io(plan_, graphs, seed)
    if keep_io is not None:
        _keep_io(Path(keep_io), inputs, refs)
    return check(sources, directory, inputs, refs, cc, cflags, runs, sanitize, timeout_s)


def check_export_linux(plan_, graphs, sources, directory, target: str, cflags=None, cc: str | None = None,
                       keep_io: str | Path | None = None):
    """Cross-build an exported plan for a Linux `target` (export.linux.TARGETS), run it under qemu
    on the seeded inputs and compare with the reference executor (export.linux.CrossCheck)."""
    from tightfit.export.linux import check_for

    inputs, refs = reference_io(plan_, graphs)
    if keep_io is not None:
        _keep_io(Path(keep_io), inputs, refs)
    return check_for(target, sources, Path(directory), inputs, refs, cflags, cc)


def check_export_mcu(plan_, graphs, built, seed: int = 0, keep_io: str | Path | None = None):
    """A microcontroller build run under qemu on CNN 0's seeded input, compared with the reference."""
    from tightfit.export import check_mcu

    inputs, refs = reference_io(plan_, graphs[:1], seed)
    if keep_io is not None:
        _keep_io(Path(keep_io), inputs[:1], refs[:1])
    return check_mcu(built, inputs[0], refs[0])


def _keep_io(folder: Path, inputs, refs) -> None:
    import numpy as np

    (folder / "input.bin").write_bytes(b"".join(np.ascontiguousarray(x, dtype="<f4").tobytes() for x in inputs))
    (folder / "reference.bin").write_bytes(b"".join(np.ascontiguousarray(r, dtype="<f4").tobytes() for r in refs))


# --- the user's own data (`tightfit run --input/--output`) -------------------------------------------

def read_inputs(path: str | Path, shapes: Sequence[Sequence[int]]) -> "list[np.ndarray]":
    """Every CNN's input from a file: .npy (one CNN; its shape, or the same number of values), or
    raw bytes holding every CNN's input one after another, NCHW, float32 (4 bytes a value) or
    int8 (1 byte a value; the file's size tells which). OptionError: one line saying what was expected."""
    path, sizes = Path(path), [int(np.prod(s)) for s in shapes]
    shown = " + ".join("x".join(map(str, s)) for s in shapes)
    if not path.is_file():
        raise OptionError(f"--input {path}: " + ("is a folder, not a file" if path.is_dir() else "no such file"))
    if path.suffix == ".npy":
        if len(shapes) > 1:
            raise OptionError(f"--input {path}: the plan has {len(shapes)} CNNs; give their inputs as one raw float32 file")
        try:
            arr = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise OptionError(f"--input {path}: not a readable .npy file ({e})") from None
        if arr.size != sizes[0] or arr.dtype.kind not in "fiu":
            raise OptionError(f"--input {path}: holds {arr.dtype} {'x'.join(map(str, arr.shape))}; the model takes {shown} numbers")
        return [np.ascontiguousarray(arr, dtype=np.float32).reshape(shapes[0])]
    data = path.read_bytes()
    total = sum(sizes)
    if len(data) not in (4 * total, total):
        raise OptionError(f"--input {path}: expected {4 * total} bytes (float32, {shown}) or {total} (int8), got {len(data)}")
    flat = np.frombuffer(data, dtype="<f4" if len(data) == 4 * total else np.int8).astype(np.float32)
    at, out = 0, []
    for shape, size in zip(shapes, sizes):
        out.append(flat[at: at + size].reshape(shape).copy())
        at += size
    return out


def write_outputs(path: str | Path, outputs: "Sequence[tuple[str, np.ndarray]]") -> str:
    """The outputs (name, tensor) into a file, whole or not at all: .npy (one output), .npz (every
    output by name), else raw float32, every output one after another (as the exported program
    writes them). Returns what was written, for the report."""
    import io

    import numpy as np

    from tightfit import atomic

    path = Path(path)
    if path.is_dir():
        raise OptionError(f"--output {path} is a folder: name a file (.npy, .npz or raw float32)")
    arrays = [(name, np.asarray(t, dtype=np.float32)) for name, t in outputs]
    buf = io.BytesIO()
    if path.suffix == ".npy":
        if len(arrays) != 1:
            raise OptionError(f"--output {path}: the model has {len(arrays)} outputs; write them to .npz or a raw file")
        np.save(buf, arrays[0][1])
    elif path.suffix == ".npz":
        np.savez(buf, **{name: a for name, a in arrays})
    else:
        buf.write(b"".join(np.ascontiguousarray(a, dtype="<f4").tobytes() for _, a in arrays))
    atomic.write_bytes(path, buf.getvalue())
    return ", ".join(f"{name} {'x'.join(map(str, a.shape))}" for name, a in arrays)
