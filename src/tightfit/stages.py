"""The stages every command is made of (tightfit.pipeline puts them in order): load -> profile ->
search -> place -> check -> run or export -> verify -> measure. Planners never execute; these
stages do, around them: a technique's search or fit's search over every technique runs over a
frozen profile (runtime/profiling.py), the plan it picks is placed and checked
(tightfit.plan.check), run on the arena executor, verified against the reference executor and
measured (its peak in a fresh process, its fps).

Every plan `fit` reports was checked and ran with outputs equal to the reference executor's; a
plan that fails either is never reported (VerificationFailed)."""
from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tightfit.analysis.memory import account
from tightfit.errors import BudgetError, OptionError, VerificationFailed
from tightfit.export import BuildOptions, check, check_mcu
from tightfit.export.build import input_bytes
from tightfit.export.linux import check_for
from tightfit.frontend.app import AppError, is_app_file, load_app
from tightfit.frontend.load import load
from tightfit.graph.forms import file_input, file_output
from tightfit.options import FitOptions
from tightfit.plan import schema
from tightfit.plan.check import CheckReport, check_plan
from tightfit.plan.overlay import overlap_in_place
from tightfit.plan.place import place
from tightfit.plan.schema import Plan, PlanError
from tightfit.reference import run_reference
from tightfit.runtime.cost import CostModel
from tightfit.runtime.executor import ArenaExecutor
from tightfit.runtime.measure import Measurement
from tightfit.runtime.profiling import profiled_search
from tightfit.runtime.reference import input_arrays, random_input
from tightfit.techniques.deadline import Deadline
from tightfit.techniques.fit import (Constraints, FitApp, FitError, FitPoint, FitProblem, FitSearch, SearchOptions, search,
                                     select)
from tightfit.techniques.interface import PlannedModel, Problem, run_memory
from tightfit.techniques.registry import technique
from tightfit.techniques.vbs.graph_dp import DEFAULT_UNIT_BYTES, make_problem, memory_problem, smallest_feasible_budget
from tightfit.units import human
from tightfit.vbs_calibration import MIXED_SCHEDULE_ERROR, UNIFORM_SCHEDULE_ERROR, calibrate
from tightfit.verify import compare

MB = 1e6
FPS_RUNS = 5
OBJECTIVES = ("speed", "memory")
TIMED = 3  # `speed`: the plans predicted fastest that fit, timed; the fastest measured is kept
MAX_TIMED = 6  # `memory` with a minimum fps: plans timed, smallest first, until one meets it
FPS_SLACK = 0.2  # plans predicted this far below a minimum fps are not timed (the model errs less)
CHOICE_RUNS = 3  # runs per timed candidate (the chosen plan's fps are measured again, FPS_RUNS)
MAX_BATCH = 4096  # the plan checker's bound on a plan's batch


# --- load ---------------------------------------------------------------------------------------

def check_batch(batch: int) -> None:
    if not 1 <= batch <= MAX_BATCH:
        raise OptionError(f"--batch {batch} must be 1-{MAX_BATCH}")


def load_models(spec: str, input_shape: "Sequence[int] | Mapping[str, Sequence[int]] | None" = None, batch: int = 1,
                allow_code: bool = False) -> FitApp:
    """A model (zoo name, .onnx, module:factory) or an application file (its CNNs by
    module:factory only with `allow_code`), `batch` samples per request for every CNN: the CNNs,
    their names, partitions and the partitions that run at the same time."""
    check_batch(batch)
    if is_app_file(spec):
        app, graphs = load_app(spec, allow_code)
        return FitApp(tuple(PlannedModel(g, c.model, batch) for g, c in zip(graphs, app.cnns)),
                      tuple(c.name for c in app.cnns), tuple((p.cnn, p.layers) for p in app.partitions), app.pipelines)
    return FitApp.single(PlannedModel(load(spec, input_shape), spec, batch))


def load_fit_app(spec: str, input_shape: "Sequence[int] | Mapping[str, Sequence[int]] | None" = None, batch: int = 1,
                 allow_code: bool = False) -> FitApp:
    """`load_models` for `fit`, where a missing application file is named as one."""
    if not is_app_file(spec) and spec.lower().endswith((".yaml", ".yml", ".json")):
        check_batch(batch)
        raise AppError(f"application file not found: {spec}")
    return load_models(spec, input_shape, batch, allow_code)


def param_bytes(app: FitApp) -> int:
    return sum(account(g).param_bytes for g in app.graphs)


# --- profile and search: one technique ------------------------------------------------------------

# Of a command's --time-limit, the share kept for what follows its search and profiling (placing,
# choosing among the fastest by timing them, verifying, measuring in a fresh process): what the
# user waits for is bounded by the limit, not only the search (mobilenet_v2 by parts, limit 30 s,
# an empty profile: 8.7 s after the search).
AFTER_SEARCH_SHARE = 0.15


def _deadline(time_limit: float | None):
    """The deadline of the search and profiling stage: the limit from now, less AFTER_SEARCH_SHARE
    (None: no limit)."""
    return lambda: None if time_limit is None else Deadline.after(time_limit * (1 - AFTER_SEARCH_SHARE))


# How each technique's budget search names what it found when nothing fits (BudgetError).
_NOT_FOUND = {"parts": ("no parts plan", "the smallest found needs", "plans tried"),
              "tiling": ("no tiling", "the smallest reachable needs", "group tilings tried")}


def plan_for_budget(method: str, model: PlannedModel, budget: int, config, cost: CostModel | None = None,
                    time_limit: float | None = None, say: Callable[[str], None] = lambda line: None,
                    settings: Mapping | None = None) -> Plan:
    """The technique's search for the fastest plan within `budget` (run memory) over a frozen
    profile of `cost` (default this machine's; profiled first where it lacks step shapes, see
    runtime/profiling.py), stopped after `time_limit` seconds of search; its pick placed by
    `config.planner`. BudgetError if nothing fits."""
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


def _vbs_settings(model: PlannedModel, budget: int, config, cost, settings: Mapping, say) -> dict:
    """What the variable-batch search needs measured before it: BudgetError naming the smallest
    feasible budget (found from memory alone) if `budget` is below it; the step times of every
    sub-batch profiled; the uniform plans calibrated by whole runs (times kept in the profile)."""
    unit = settings.get("unit_bytes") or DEFAULT_UNIT_BYTES
    least = smallest_feasible_budget(model, None, None, unit, config.layout, memory_problem(model), config.planner)
    if budget < least:
        raise BudgetError(f"no variable batch plan of {model.spec} for {model.batch} samples fits {human(budget)}: "
                          f"the smallest feasible budget is {human(least)} ({least} bytes)")
    profiled_search(cost, lambda predict, deadline: make_problem(model, predict, config.layout), say=say, what="vbs search")
    factors = calibrate(model, cost, config.planner, config.layout)
    return dict(unit_bytes=unit, batch_factors=factors, margin=MIXED_SCHEDULE_ERROR, fbs_margin=UNIFORM_SCHEDULE_ERROR)


# --- fit: profile, search every technique, choose, place, check, verify, measure ---------------------

@dataclass
class FitOutcome:
    app: FitApp
    search: FitSearch
    constraints: Constraints
    problem: FitProblem
    plan: Plan
    point: FitPoint
    analysis: CheckReport
    param_bytes: int
    with_params: bool
    fits: bool
    naive_bytes: int
    max_abs_diff: float
    search_seconds: float
    measured: dict[str, Any] = field(default_factory=dict)
    threads: int = 1  # threads the plans were timed and run with
    choice: "Choice | None" = None  # how the plan was chosen among those that fit
    # Where search_seconds went: the search itself (what --time-limit bounds) and the profiling of
    # new step shapes between its passes (not bounded), with the limit it ran under.
    timing: dict[str, Any] = field(default_factory=dict)

    @property
    def counted_params(self) -> int:
        return self.param_bytes if self.with_params else 0

    @property
    def memory_bytes(self) -> int:
        """The chosen plan's analysed memory as the budget counts it."""
        return self.analysis.peak_bytes + self.counted_params


def fit(app: FitApp, o: FitOptions) -> FitOutcome:
    """Search, choose (`choose`: the fastest measured plan that fits, or with `o.objective`
    "memory" and a minimum fps the smallest whose measured fps meets it, Alg. 9), place, check,
    run and verify the chosen plan, measure. Without a budget (`o.budget` None), the smallest
    plan whose measured fps meets `o.min_fps`. FitError when nothing fits the budget or no plan
    that fits meets the minimum fps as measured (unless `o.best_effort`: the closest plan).
    `o.thorough`: search large CNNs as fully as small ones (see techniques.fit.space.QUICK_LAYERS).
    `o.timer`: a plan's fps per CNN (default: measured here, CHOICE_RUNS runs). `o.time_limit`:
    seconds of search (profiling new step shapes included; None: no limit), after which the
    best plans found so far are chosen from; `o.say` gets a progress line per phase."""
    if o.budget is None and not o.min_fps:
        raise OptionError("fit needs --budget SIZE, --min-fps X, or both")
    if o.budget is not None and o.budget <= 0:
        raise OptionError("--budget must be positive")
    if o.budget is None:
        o = replace(o, objective="memory")  # only a minimum fps: the smallest plan whose measured fps meets it
    if o.time_limit is not None and o.time_limit <= 0:
        raise OptionError("--time-limit must be positive")
    if o.objective not in OBJECTIVES:
        raise OptionError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {o.objective!r}")
    if o.threads < 1:
        raise OptionError(f"--threads must be at least 1, got {o.threads}")
    threads = o.threads
    o = replace(o, cost=o.cost or CostModel.default(),
                timer=o.timer or (lambda plan, graphs: measure_fps(plan, graphs, CHOICE_RUNS, threads)))
    with _measuring(app, o.measure) as measurement:
        outcome = _fit(app, o, measurement)
    outcome.threads = threads
    return outcome


def _kernel_threads():
    """torch where the kernels that run plans loaded it (its intra-op threads are theirs), else
    None: fit never imports torch itself, an ONNX model's plans need none."""
    return sys.modules.get("torch")


def _fit(app: FitApp, o: FitOptions, measurement: Measurement | None) -> FitOutcome:
    params = param_bytes(app)
    counted = params if o.with_params else 0
    constraints = Constraints(o.budget, parse_min_fps(o.min_fps, len(app.models)))
    if o.budget is not None and counted >= o.budget and not o.best_effort:
        raise FitError(f"nothing fits {human(o.budget)}: the parameters alone take {human(params)} "
                       f"({params / MB:.2f} MB)")
    t0 = time.perf_counter()
    (problem, found), profiling = profiled_search(o.cost, _fit_search(app, o, constraints, counted),
                                                  _deadline(o.time_limit), o.say, "fit")
    search_seconds = time.perf_counter() - t0
    o.say(profiling.line("fit", o.time_limit))
    choice, (plan, analysis) = _choose_placed(problem, found, constraints, o, counted)
    graphs = app.graphs
    naive = sum(t.nbytes(plan.dtype, m.batch) for g, m in zip(graphs, plan.models) for t in g.original_tensors) + params
    outcome = FitOutcome(app, found, constraints, problem, plan, choice.point, analysis, params, o.with_params, choice.met,
                         naive, 0.0, search_seconds, choice=choice,
                         timing={"search_seconds": profiling.search_seconds, "profiling_seconds": profiling.measure_seconds,
                                 "finding_seconds": profiling.finding_seconds, "profiled_shapes": profiling.shapes,
                                 "passes": profiling.passes, "time_limit": o.time_limit})

    def verified() -> None:
        outcome.max_abs_diff = verify(plan, graphs, o.threads)

    o.say("fit: verifying the outputs and measuring the peak in a fresh process")
    if measurement is not None:  # the peak is measured in a fresh process while the outputs are verified here
        outcome.measured = measure_plan(plan, graphs, meanwhile=verified, measurement=measurement, threads=o.threads)
    else:
        verified()
    return outcome


def _fit_search(app: FitApp, o: FitOptions, constraints: Constraints, counted: int):
    """The search over every technique as a function of a frozen profile and a deadline."""
    source_budget = 0 if o.budget is None else max(o.budget - counted, 0)

    def searched(predict, deadline) -> tuple[FitProblem, FitSearch]:
        problem = FitProblem(app, predict.plan_seconds, counted, cost=predict, thorough=o.thorough,
                             stream_outputs=o.stream_outputs)
        options = replace(o.search or SearchOptions(), seed=o.seed, sources=o.sources, source_budget=source_budget,
                          progress=o.progress, deadline=deadline, say=o.say)
        return problem, search(problem, constraints, options)

    return searched


def _choose_placed(problem: FitProblem, found: FitSearch, constraints: Constraints, o: FitOptions,
                   counted: int) -> tuple[Choice, tuple[Plan, CheckReport]]:
    """The plan chosen among those that fit (timed), placed and checked; FitError if none meets
    the constraints (with `o.best_effort`: the closest plan)."""
    graphs = problem.app.graphs
    placed: dict[tuple[int, ...], tuple[Plan, CheckReport]] = {}

    def within_budget(point: FitPoint) -> tuple[Plan, CheckReport] | None:
        """The point's placed plan, if the final placement keeps it within the budget."""
        if point.genes not in placed:
            placed[point.genes] = _placed(problem, point, o.inplace)
        plan, analysis = placed[point.genes]
        return placed[point.genes] if o.budget is None or analysis.peak_bytes + counted <= o.budget else None

    def timed_fps(point: FitPoint) -> tuple[float, ...] | None:
        got = within_budget(point)
        return None if got is None else tuple(o.timer(got[0], graphs))

    # The search predicts memory without in-place outputs: with `inplace`, a plan over the budget
    # may fit once placed so, which within_budget decides.
    fitting = [p for p in found.front if o.budget is None or o.inplace or p.memory_bytes <= o.budget]
    o.say(f"fit: choosing among {len(fitting)} plans that fit{' or may, placed in place' if o.inplace else ''}: "
          "timing the best candidates")
    choice = choose(fitting, constraints.min_fps, o.objective, timed_fps)
    if choice.point is not None:
        o.say(f"fit: chosen by {choice.rule}: measured fps {', '.join(f'{f:.1f}' for f in choice.measured_fps)}")
    if choice.point is not None and not choice.met and not o.best_effort:
        raise FitError(unmet_fps_line(choice, constraints, o.budget))
    if choice.point is None:
        if not o.best_effort:
            raise FitError(unreachable_line(found, constraints, o.budget))
        choice = Choice(closest(problem), (), False, "best effort: nothing fits the budget; the smallest plan found", 0)
    return choice, placed.get(choice.point.genes) or _placed(problem, choice.point, o.inplace)


def closest(problem: FitProblem) -> FitPoint:
    """Best effort's plan when nothing fits: the smallest of every plan evaluated. The front leaves
    out plans below the memory side's smallest (a time-guided search found them, so another cost
    profile might not), but when the budget is missed the user wants the closest plan there is:
    deeplabv3 at half its reuse arena got reuse (46.96 MB) while the parts search had 24.06 MB."""
    return select(list(problem.points.values()), Constraints(None, ()))[0]


@dataclass(frozen=True)
class Choice:
    """The plan `fit` chose among those that fit, and why."""

    point: FitPoint | None  # None: no plan fits the budget after placement
    measured_fps: tuple[float, ...]  # the chosen plan's fps per CNN when it was timed
    met: bool  # fits, and (with minimum fps) its measured fps meet every minimum
    rule: str
    timed: int  # plans timed to choose


def choose(fitting: Sequence[FitPoint], min_fps: Sequence[float], objective: str,
           timed_fps: Callable[[FitPoint], Sequence[float] | None]) -> Choice:
    """Among the points that fit the budget (as the search predicted them): with `objective`
    "speed" (and always without a minimum fps), the TIMED predicted fastest (fewest seconds per
    frame of every CNN) are timed and the fastest measured that meets every minimum fps is kept;
    with "memory" and a minimum fps (the thesis's Alg. 9), the smallest first are timed, at most
    MAX_TIMED, and the first whose measured fps meets it is kept. Plans predicted more than
    FPS_SLACK below a minimum are not timed. `timed_fps(point)`: its measured fps per CNN, or
    None when its final placement misses the budget (it is passed over). If no plan timed meets
    the minimum, the fastest timed is returned with `met` False."""
    need = tuple(min_fps)
    wanted = any(need)

    def meets(fps: Sequence[float]) -> bool:
        return all(f >= n for f, n in zip(fps, need))

    hopeful = [p for p in fitting if all(f >= n * (1 - FPS_SLACK) for f, n in zip(p.fps, need))]
    by_memory = objective == "memory" and wanted
    if by_memory:
        order, limit = sorted(hopeful, key=lambda p: (p.memory_bytes, sum(p.seconds), p.genes)), MAX_TIMED
        rule = "memory: the smallest plan that fits whose measured fps meet the minimum (Alg. 9)"
    else:
        order, limit = sorted(hopeful, key=lambda p: (sum(p.seconds), p.memory_bytes, p.genes)), TIMED
        rule = (f"speed: the fastest measured of the {limit} plans predicted fastest that fit"
                + (" and whose measured fps meet the minimum" if wanted else ""))
    timed: list[tuple[FitPoint, tuple[float, ...]]] = []
    for p in order:
        if len(timed) >= limit:
            break
        fps = timed_fps(p)
        if fps is None:
            continue  # its final placement misses the budget
        timed.append((p, tuple(fps)))
        if by_memory and meets(fps):
            break
    if not timed:
        return Choice(None, (), False, rule, 0)

    def per_frame(pf: tuple[FitPoint, tuple[float, ...]]) -> tuple:
        return (sum(1.0 / f if f > 0 else math.inf for f in pf[1]), pf[0].memory_bytes, pf[0].genes)

    ok = [pf for pf in timed if meets(pf[1])]
    if ok:
        point, fps = ok[0] if by_memory else min(ok, key=per_frame)
        return Choice(point, fps, True, f"{rule} ({len(timed)} timed)", len(timed))
    point, fps = min(timed, key=per_frame)
    return Choice(point, fps, False, f"{rule}: none of the {len(timed)} timed meets it; the fastest timed", len(timed))


def unmet_fps_line(choice: Choice, constraints: Constraints, budget_bytes: int | None) -> str:
    fps = ", ".join(f"{f:.1f}" for f in choice.measured_fps)
    need = ", ".join(f"{f:g}" for f in constraints.min_fps)
    return (f"no plan{'' if budget_bytes is None else f' that fits {human(budget_bytes)}'} meets min fps {need} as measured: the fastest of the "
            f"{choice.timed} timed runs at {fps} fps (predicted {', '.join(f'{f:.1f}' for f in choice.point.fps)}); "
            f"--best-effort reports it")


@contextmanager
def _threads(n: int):
    """The kernels' intra-op threads (torch's, where they use it) set to `n` for a while."""
    torch = _kernel_threads()
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def _measuring(app: FitApp, measure: bool):
    """The measuring process, started before the search so that it loads the models meanwhile;
    stopped on the way out unless it measured."""
    if not measure:
        yield None
        return
    # It measures while this process verifies: the cores are shared between the two (a core
    # oversubscribed by torch's threads runs many times slower).
    threads = max(1, (os.cpu_count() or 1) - 1)
    measurement = Measurement(None, [(m.spec, m.ref().shapes()) for m in app.models], threads)
    try:
        yield measurement
    finally:
        if measurement.proc.poll() is None:
            measurement.cancel()


def unreachable_line(found: FitSearch, constraints: Constraints, budget_bytes: int | None) -> str:
    smallest = min(found.front, key=lambda p: (p.memory_bytes, sum(p.seconds)))
    n = len(smallest.seconds)
    best = [max(p.fps[m] for p in found.front) for m in range(n)]
    fps = ", ".join(f"{f:.1f}" for f in best)
    asked = ([human(budget_bytes)] if budget_bytes is not None else []) + (
        [f"min fps {', '.join(f'{f:g}' for f in constraints.min_fps)}"] if any(constraints.min_fps) else [])
    return (f"no plan meets {' and '.join(asked)}: the smallest reachable memory is {human(smallest.memory_bytes)} "
            f"({smallest.memory_bytes / MB:.2f} MB, at {', '.join(f'{f:.1f}' for f in smallest.fps)} fps); "
            f"the best reachable fps is {fps} ({found.evaluated} plans evaluated)")


def _placed(problem: FitProblem, point: FitPoint, inplace: bool = False) -> tuple[Plan, CheckReport]:
    """The point's plan placed (with `inplace`, outputs laid over their inputs where the kernels
    allow and the arena shrinks) and checked."""
    plan = final_plan(problem, point)
    if inplace:
        over = overlap_in_place(plan, problem.app.graphs, "improve")
        plan = replace(over, knobs=dict(over.knobs, inplace=True, overlap=True))
    return plan, checked(plan, problem.app.graphs)


def final_plan(problem: FitProblem, point: FitPoint) -> Plan:
    """The point's application plan placed by the best offset planner, its choices in the knobs."""
    plan = place(problem.plan(point.genes), problem.app.graphs, "improve")
    return replace(plan, knobs=dict(plan.knobs, techniques=list(point.labels), predicted_seconds=list(point.seconds)))


def checked(plan: Plan, graphs) -> CheckReport:
    try:
        return check_plan(plan, graphs)
    except PlanError as e:
        raise VerificationFailed(f"the chosen plan fails the checker: {e}") from None


def verify(plan: Plan, graphs, threads: int = 1) -> float:
    """Run the plan on `threads` threads (arena filled with NaN first) and compare every output with
    the reference executor; returns the largest difference relative to each output's largest value."""
    checked(plan, graphs)
    xs = plan_inputs(graphs, plan)
    outs, _ = execute(plan, graphs, xs, fill_nan=True, threads=threads)
    worst = 0.0
    for m, (g, x, o) in enumerate(zip(graphs, xs, outs)):
        ref = run_reference(g, x)
        for name, got in o.items():
            c = compare(got, ref[name])
            if not c.ok:
                raise VerificationFailed(f"the chosen plan's output {name!r} of CNN {m} differs from the reference "
                                         f"(max abs diff {c.max_abs_diff:.3g} > {c.tolerance:.3g})")
            worst = max(worst, c.max_abs_diff / max(c.max_abs_ref, 1e-30))
    return worst


def measure_plan(plan: Plan, graphs, runs: int = FPS_RUNS, meanwhile: Callable[[], None] = lambda: None,
                 measurement: Measurement | None = None, threads: int = 1) -> dict[str, Any]:
    """Peak above the loaded baseline in a fresh process (`measurement`: one started earlier,
    waiting for its job), and per CNN the fps of its partitions (median of `runs`; a CNN whose
    partitions all form one pipeline runs as a stream), both running the plan on `threads` threads.
    `meanwhile` runs while that process measures (the fps are measured after it, alone)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "plan.json"
        path.write_text(schema.dumps(plan))
        job = {"kind": "plan", "plan": str(path), "allow_code": True,  # written here, from models loaded here
               "threads": threads}
        if measurement is None:
            measurement = Measurement(job)
        else:
            measurement.send(job)
        try:
            with _threads(1):
                meanwhile()
        except BaseException:
            measurement.cancel()
            raise
        m = measurement.result()
    return {"run_bytes": m.run_bytes, "baseline_bytes": m.baseline_bytes, "uncertainty_bytes": m.uncertainty_bytes,
            "fps": measure_fps(plan, graphs, runs, threads)}


def measure_fps(plan: Plan, graphs, runs: int = FPS_RUNS, threads: int = 1) -> list[float]:
    """Per CNN, its fps on `threads` threads (median of `runs` after a warm-up run)."""
    xs = plan_inputs(graphs, plan)
    ex = ArenaExecutor(plan, graphs, threads=threads)
    pipeline = len(plan.concurrent) == 1 and len(plan.models) == 1 and len(plan.concurrent[0]) == len(plan.partitions) > 1
    if pipeline:
        ex.run_stream([xs] * 2, lambda f, o: None)
        t0 = time.perf_counter()
        n = ex.run_stream([xs] * (4 * runs), lambda f, o: None)
        return [n / (time.perf_counter() - t0)]
    fps = []
    for m in range(len(graphs)):
        times = []
        for _ in range(runs + 1):
            t0 = time.perf_counter()
            run_cnn(ex, m, xs[m])
            times.append(time.perf_counter() - t0)
        fps.append(1.0 / statistics.median(times[1:]))
    return fps


def run_cnn(ex, m: int, x) -> Mapping[str, Any]:
    """Run only CNN `m`'s partitions of an application plan on input `x` (a frame routed to one
    CNN); returns its outputs as views into the arena."""
    for p, part in zip(ex.plan.partitions, ex.frames[0]):
        if p.model == m:
            ex.run_partition(part, x)
    return ex._outputs[0][m]


def parse_min_fps(text: str | None, n: int) -> tuple[float, ...]:
    """'' -> no minimum; 'X' -> every CNN; 'X,Y,...' -> one per CNN."""
    if not text:
        return (0.0,) * n
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise OptionError(f"cannot read --min-fps {text!r}: write a number, or one per CNN separated by commas") from None
    if len(values) == 1:
        values *= n
    if len(values) != n or any(v < 0 or not math.isfinite(v) for v in values):
        raise OptionError(f"--min-fps needs one non-negative number or {n} (one per CNN), got {text!r}")
    return tuple(values)


# --- run ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunResult:
    outputs: dict[str, np.ndarray]
    seconds: float


def run_model(graph, x: np.ndarray | None = None, keep: Sequence[str] = (), threads: int = 1) -> RunResult:
    """Run the reference executor once on `x` (a seeded random input if None), on `threads` threads."""
    x = random_input(graph) if x is None else x
    t0 = time.perf_counter()
    outs = run_reference(graph, x, keep, threads)
    return RunResult(outs, time.perf_counter() - t0)


def plan_inputs(graphs, plan_, seed: int = 0) -> list[np.ndarray]:
    """Every CNN's seeded random input, `batch` samples as the plan runs it."""
    return [random_input(g, ref.batch, seed + i) for i, (g, ref) in enumerate(zip(graphs, plan_.models))]


def execute(plan_, graphs, inputs: Sequence[np.ndarray] | None = None, fill_nan: bool = False, threads: int = 1):
    """Run a plan once with the arena executor on `threads` threads; returns per model {output:
    array} (copies)."""
    xs = plan_inputs(graphs, plan_) if inputs is None else list(inputs)
    ex = ArenaExecutor(plan_, graphs, fill_nan=fill_nan, threads=threads)
    t0 = time.perf_counter()
    outs = ex.run(xs)
    seconds = time.perf_counter() - t0
    return [{k: v.copy() for k, v in o.items()} for o in outs], seconds


# --- export: check the C program ------------------------------------------------------------------

def reference_io(plan_, graphs, seed: int = 0) -> tuple[list, list]:
    """The seeded inputs of a plan's CNNs and the reference executor's outputs on them (every
    output of every CNN, in order), as the C program takes and gives them: each in its element
    type and in the model file's layout (NHWC where the file's image is channels-last)."""
    inputs = plan_inputs(graphs, plan_, seed)
    refs = [file_output(g, t, run_reference(g, x)[t]) for g, x in zip(graphs, inputs) for t in g.outputs]
    return [file_input(g, t, a) for g, x in zip(graphs, inputs) for t, a in zip(g.inputs, input_arrays(g, x))], refs


def check_export(plan_, graphs, sources, directory, build: BuildOptions = BuildOptions(), seed: int = 0,
                 keep_io: str | Path | None = None):
    """Build an exported plan, run it on the seeded inputs, compare with the reference executor
    (tightfit.export.Check). With `keep_io`, a folder: the inputs and reference outputs are left
    there as input.bin and reference.bin (float32, every CNN's in order), to rerun the program on."""
    inputs, refs = reference_io(plan_, graphs, seed)
    if keep_io is not None:
        _keep_io(Path(keep_io), inputs, refs)
    return check(sources, directory, inputs, refs, build)


def check_export_linux(plan_, graphs, sources, directory, target: str, build: BuildOptions = BuildOptions(),
                       keep_io: str | Path | None = None):
    """Cross-build an exported plan for a Linux `target` (export.linux.TARGETS), run it under qemu
    on the seeded inputs and compare with the reference executor (export.linux.CrossCheck); of
    `build`, the compiler and its flags."""
    inputs, refs = reference_io(plan_, graphs)
    if keep_io is not None:
        _keep_io(Path(keep_io), inputs, refs)
    return check_for(target, sources, Path(directory), inputs, refs, build.cflags, build.cc)


def check_export_mcu(plan_, graphs, built, seed: int = 0, keep_io: str | Path | None = None):
    """A microcontroller build run under qemu on CNN 0's seeded input, compared with the reference."""
    inputs, refs = reference_io(plan_, graphs[:1], seed)
    whole = np.concatenate([x.reshape(-1) for x in inputs])  # every input of CNN 0, one after another
    if keep_io is not None:
        _keep_io(Path(keep_io), [whole], refs[:1])
    return check_mcu(built, whole, refs[0])


def _keep_io(folder: Path, inputs, refs) -> None:
    (folder / "input.bin").write_bytes(b"".join(input_bytes(x) for x in inputs))
    (folder / "reference.bin").write_bytes(b"".join(np.ascontiguousarray(r, dtype="<f4").tobytes() for r in refs))
