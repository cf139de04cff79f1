"""The small public API; the CLI is built on it."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import torch

from tightfit.analysis.memory import ModelMemory, account
from tightfit.errors import OptionError
from tightfit.frontend.load import load, load_ref
from tightfit.graph.fingerprint import fingerprint
from tightfit.graph.ir import Graph

if TYPE_CHECKING:
    from tightfit.runtime.cost import CostModel


def inspect(graph: Graph, dtype: str = "fp32", workspace: str = "torch", batch: int = 1) -> ModelMemory:
    return account(graph, dtype, workspace, batch)


@dataclass(frozen=True)
class RunResult:
    outputs: dict[str, torch.Tensor]
    seconds: float


def run(graph: Graph, x: torch.Tensor | None = None, keep: Sequence[str] = ()) -> RunResult:
    """Run the reference executor once on `x` (a seeded random input if None)."""
    from tightfit.runtime.reference import random_input, run_reference

    x = random_input(graph) if x is None else x
    t0 = time.perf_counter()
    outs = run_reference(graph, x, keep)
    return RunResult(outs, time.perf_counter() - t0)


# --- plans ------------------------------------------------------------------------------------

def plan(model: str, method: str = "reuse", planner: str = "improve", order: str = "imported",
         layout: str = "nhwc", batch: int = 1, input_shape: Sequence[int] | None = None,
         phases: dict | None = None, rows: int | None = None, budget: int | None = None,
         cost: CostModel | None = None, tiling: str | None = None, unit_bytes: int | None = None,
         latency: float | None = None, held: Sequence[int | str] = (), time_limit: float | None = None,
         say=lambda line: None):
    """Plan a model or an application file; returns (Plan, graphs). The plan is checked.

    method "parts" runs layers by parts: `phases` {layer id or name: phases}, or `rows` output
    rows per phase for every layer that can be split (and the input delivered `rows` at a time),
    or `budget` bytes: the fastest plan the search finds within it, timed by `cost` (a
    CostModel; default this machine's profile); with none of these, one row per phase everywhere
    (the paper's setting).

    method "tiling" runs groups of layers tile by tile: `tiling` "0-7:5x5,8-15:2x2:reuse" (layer
    ids, grid, optional overlap policy), or `budget` bytes: the fastest configuration the tiling
    search finds within it (see plan.tiling).

    method "vbs" runs the `batch` samples of a request with a variable batch size across layers
    (Choudhury et al.): the fastest schedule the dynamic program finds within `budget` bytes, at
    `unit_bytes` memory granularity, each pivot's latency within `latency` seconds if given."""
    from tightfit.frontend.app import is_app_file, load_app
    from tightfit.plan.check import check_plan
    from tightfit.plan.reuse import PlannedModel, plan_reuse

    if method not in ("reuse", "naive", "parts", "tiling", "vbs"):
        raise OptionError(f"unknown method {method!r}; available: reuse, naive, parts, tiling, vbs")
    if not 1 <= batch <= 4096:  # the plan checker's bound on a plan's batch
        raise OptionError(f"--batch {batch} must be 1-4096")
    if tiling and method != "tiling":
        raise OptionError("--tiling goes with --method tiling")
    if held and method != "parts":
        raise OptionError("--hold goes with --method parts")
    if is_app_file(model):
        app, graphs = load_app(model)
        models = [PlannedModel(g, c.model, batch) for g, c in zip(graphs, app.cnns)]
        parts = [(p.cnn, p.layers) for p in app.partitions]
        concurrent = app.pipelines
    else:
        graphs = [load(model, input_shape)]
        models, parts, concurrent = [PlannedModel(graphs[0], model, batch)], None, ()
    if method == "parts":
        if len(models) != 1:
            raise OptionError("--method parts plans one CNN (applications by parts come with `fit`)")
        from tightfit.plan.parts import phases_for_rows, plan_parts

        g = graphs[0]
        if budget is not None:
            if phases or rows is not None or held:
                raise OptionError("give --budget, --rows or --phases, not several (--hold goes with --rows or --phases)")
            p = _parts_for_budget(models[0], budget, planner, layout, cost, time_limit, say)
        else:
            source = None
            if rows is not None:
                phases, source = phases_for_rows(g, rows)
            elif not phases:
                from tightfit.analysis.csdf import max_phases

                phases, source = max_phases(g), g.shape(g.inputs[0])[2]
            p = plan_parts(models[0], phases, source, planner, layout, held=held)
        check_plan(p, graphs)
        return p, graphs
    if method == "vbs":
        if len(models) != 1:
            raise OptionError("--method vbs plans one CNN")
        p = _vbs_for_budget(models[0], budget, planner, layout, cost, unit_bytes, latency)
        check_plan(p, graphs)
        return p, graphs
    if method == "tiling":
        if len(models) != 1:
            raise OptionError("--method tiling plans one CNN")
        p = _tiling_plan(models[0], tiling, budget, planner, layout, cost, time_limit, say)
        check_plan(p, graphs)
        return p, graphs
    if budget is not None:
        raise OptionError("--budget goes with --method parts, tiling or vbs")
    p = plan_reuse(models, "naive" if method == "naive" else planner, order, layout,
                   partitions=parts, concurrent=concurrent)
    check_plan(p, graphs)
    return p, graphs


def _deadline(cost: CostModel, time_limit: float | None):
    """A search deadline `time_limit` seconds of search from now (profiling not counted)."""
    from tightfit.plan.deadline import Deadline

    return None if time_limit is None else Deadline.after(time_limit, cost.search_clock)


def _profiling_line(cost: CostModel, before: tuple[int, float], t0: float) -> str:
    shapes, spent = cost.profiled - before[0], cost.profiled_seconds - before[1]
    return f"search {time.perf_counter() - t0 - spent:.1f} s; profiling {shapes} new step shapes {spent:.1f} s (not counted)"


def _parts_for_budget(model, budget: int, planner: str, layout: str, cost: CostModel | None,
                      time_limit: float | None = None, say=lambda line: None):
    """The parts search's pick for `budget`, placed by `planner`; BudgetError if none fits."""
    from dataclasses import replace

    from tightfit.errors import BudgetError
    from tightfit.plan.parts_search import plan_point, search_parts
    from tightfit.runtime.cost import CostModel
    from tightfit.units import human

    cost = cost or CostModel.default()
    g = model.graph
    before, t0 = (cost.profiled, cost.profiled_seconds), time.perf_counter()
    found = search_parts(model, lambda p: cost.plan_seconds(p, [g]), budget, layout=layout,
                         deadline=_deadline(cost, time_limit), progress=say)
    say(f"parts search: {_profiling_line(cost, before, t0)}{' (time is up: the best found so far)' if found.timed_out else ''}")
    best = found.chosen
    p = plan_point(model, best, planner, layout)
    needs = p.arena_bytes + max((s.scratch for s in p.steps()), default=0)
    if needs > budget:  # also when nothing fits: the pick is then the smallest found
        raise BudgetError(f"no parts plan of {model.spec} fits {human(budget)}: the smallest found needs "
                          f"{human(needs)} ({len(best.phases)} layers split, {found.evaluated} plans tried)")
    knobs = dict(p.knobs, budget=budget, cost_profile=cost.id, predicted_seconds=best.seconds)
    return replace(p, knobs=knobs)


def _tiling_plan(model, tiling: str | None, budget: int | None, planner: str, layout: str, cost: CostModel | None,
                 time_limit: float | None = None, say=lambda line: None):
    """An explicit tiling, or the tiling search's pick for `budget`; BudgetError if none fits."""
    from dataclasses import replace

    from tightfit.errors import BudgetError
    from tightfit.plan.tiling import cost_seconds, parse_tiling, plan_point, plan_tiling, search_tiling
    from tightfit.runtime.cost import CostModel
    from tightfit.units import human

    g = model.graph
    if (tiling is None) == (budget is None):
        raise OptionError("--method tiling needs --tiling FIRST-LAST:NxM,... or --budget SIZE (one of them)")
    if tiling is not None:
        return plan_tiling(model, parse_tiling(tiling, g), planner, layout)
    cost = cost or CostModel.default()
    before, t0 = (cost.profiled, cost.profiled_seconds), time.perf_counter()
    found = search_tiling(model, cost_seconds(cost, g), budget, layout=layout, front_points=0,
                          deadline=_deadline(cost, time_limit), progress=say)
    say(f"tiling search: {_profiling_line(cost, before, t0)}{' (time is up: the best found so far)' if found.timed_out else ''}")
    cost.save()
    p = plan_point(model, found.chosen, planner, layout)
    needs = p.arena_bytes + max((s.scratch for s in p.steps()), default=0)
    if needs > budget:  # also when nothing fits: the pick is then the smallest reachable
        raise BudgetError(f"no tiling of {model.spec} fits {human(budget)}: the smallest reachable needs "
                          f"{human(needs)} ({found.chosen.spec}; {found.evaluated} group tilings tried)")
    knobs = dict(p.knobs, budget=budget, cost_profile=cost.id, predicted_seconds=found.chosen.seconds)
    return replace(p, knobs=knobs)


def _vbs_for_budget(model, budget: int | None, planner: str, layout: str, cost: CostModel | None,
                    unit_bytes: int | None, latency: float | None):
    """The DP's plan for the request within `budget`; BudgetError naming the smallest feasible
    budget (found from memory alone, before any profiling) if it does not fit."""
    from tightfit.errors import BudgetError
    from tightfit.plan.vbs_graph import DEFAULT_UNIT_BYTES, memory_problem, search_vbs, smallest_feasible_budget
    from tightfit.runtime.cost import CostModel
    from tightfit.units import human

    if budget is None:
        raise OptionError("--method vbs needs --budget SIZE (the memory the request may use)")
    unit = unit_bytes or DEFAULT_UNIT_BYTES
    least = smallest_feasible_budget(model, None, None, unit, layout, memory_problem(model), planner)
    if budget < least:
        raise BudgetError(f"no variable batch plan of {model.spec} for {model.batch} samples fits {human(budget)}: "
                          f"the smallest feasible budget is {human(least)} ({least} bytes)")
    from tightfit.plan.vbs_graph import make_problem
    from tightfit.vbs_calibration import MIXED_SCHEDULE_ERROR, UNIFORM_SCHEDULE_ERROR, calibrate

    cost = cost or CostModel.default()
    problem = make_problem(model, cost, layout, batch_factors=calibrate(model, cost, planner, layout))
    found = search_vbs(model, None, budget, cost, unit, latency, planner, layout, problem, margin=MIXED_SCHEDULE_ERROR,
                       fbs_margin=UNIFORM_SCHEDULE_ERROR)
    if not found.fits:
        raise BudgetError(f"no variable batch plan of {model.spec} for {model.batch} samples fits {human(budget)}"
                          + (f" with every pivot within {latency} s" if latency is not None else ""))
    return found.plan


def load_plan(path: str | Path, loaded: Mapping[tuple[str, tuple[int, ...]], Graph] | None = None):
    """Read a plan file, load the models it names (or take them from `loaded`, keyed by spec and
    input shape), check fingerprints and the plan itself."""
    from tightfit.plan import schema
    from tightfit.plan.check import check_plan

    plan_ = schema.read_plan(path)
    graphs = []
    for ref in plan_.models:
        g = (loaded or {}).get((ref.spec, tuple(ref.input_shape))) or load_ref(ref.spec, ref.input_shape)
        if fingerprint(g) != ref.fingerprint:
            raise schema.PlanError(f"plan was made for another model than {ref.spec!r} (fingerprint differs)")
        graphs.append(g)
    check_plan(plan_, graphs)
    return plan_, graphs


def plan_inputs(graphs, plan_, seed: int = 0) -> list[torch.Tensor]:
    from tightfit.runtime.reference import random_input

    return [random_input(g, ref.batch, seed + i) for i, (g, ref) in enumerate(zip(graphs, plan_.models))]


def execute(plan_, graphs, inputs: Sequence[torch.Tensor] | None = None, fill_nan: bool = False):
    """Run a plan once with the arena executor; returns per model {output: tensor} (copies)."""
    from tightfit.runtime.executor import ArenaExecutor

    xs = plan_inputs(graphs, plan_) if inputs is None else list(inputs)
    ex = ArenaExecutor(plan_, graphs, fill_nan=fill_nan)
    t0 = time.perf_counter()
    outs = ex.run(xs)
    seconds = time.perf_counter() - t0
    return [{k: v.clone() for k, v in o.items()} for o in outs], seconds


# --- the C export ------------------------------------------------------------------------------

def reference_io(plan_, graphs, seed: int = 0) -> tuple[list, list]:
    """The seeded inputs of a plan's CNNs and the reference executor's outputs on them (every
    output of every CNN, in order), as float32 arrays."""
    from tightfit.runtime.reference import run_reference

    inputs = plan_inputs(graphs, plan_, seed)
    refs = [run_reference(g, x)[t].numpy() for g, x in zip(graphs, inputs) for t in g.outputs]
    return [x.numpy() for x in inputs], refs


def check_export(plan_, graphs, sources, directory, cc: str | None = None, cflags=None, runs: int = 1,
                 sanitize: bool = False, seed: int = 0, timeout_s: float = 600):
    """Build an exported plan, run it on the seeded inputs, compare with the reference executor
    (tightfit.export.Check)."""
    from tightfit.export import check

    inputs, refs = reference_io(plan_, graphs, seed)
    return check(sources, directory, inputs, refs, cc, cflags, runs, sanitize, timeout_s)


def check_export_mcu(plan_, graphs, built, seed: int = 0):
    """A microcontroller build run under qemu on CNN 0's seeded input, compared with the reference."""
    from tightfit.export import check_mcu

    inputs, refs = reference_io(plan_, graphs[:1], seed)
    return check_mcu(built, inputs[0], refs[0])
