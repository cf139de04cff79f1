"""`tightfit fit`: search every technique for the plan that fits (tightfit.plan.fit), then run it,
verify its outputs against the reference executor, measure its peak (fresh process) and fps,
and explain why it fits. Planners never execute; this module is the face that does.

Every plan fit reports was checked (tightfit.plan.check) and ran with outputs equal to the
reference executor's; a plan that fails either is never reported (VerificationFailed)."""
from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from tightfit.errors import OptionError
from tightfit.plan.check import CheckReport, check_plan
from tightfit.plan.deadline import Deadline
from tightfit.plan.lifetimes import lifetimes
from tightfit.plan.fit import (Constraints, FitApp, FitError, FitPoint, FitProblem, FitSearch, TechniqueSource,
                               parse_min_fps, search, select)
from tightfit.plan.reuse import PlannedModel
from tightfit.plan.schema import Plan
from tightfit.runtime.measure import PAGE_BYTES, Measurement
from tightfit.units import human

MB = 1e6
FPS_RUNS = 5
OBJECTIVES = ("speed", "memory")
TIMED = 3  # `speed`: the plans predicted fastest that fit, timed; the fastest measured is kept
MAX_TIMED = 6  # `memory` with a minimum fps: plans timed, smallest first, until one meets it
FPS_SLACK = 0.2  # plans predicted this far below a minimum fps are not timed (the model errs less)
CHOICE_RUNS = 3  # runs per timed candidate (the chosen plan's fps are measured again, FPS_RUNS)


class VerificationFailed(Exception):
    """The chosen plan failed the checker or gave other outputs than the reference: an internal
    bug (never a user error); nothing is reported or written."""


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
    threads: int = 1  # torch threads the plans were timed and run with
    choice: "Choice | None" = None  # how the plan was chosen among those that fit

    @property
    def counted_params(self) -> int:
        return self.param_bytes if self.with_params else 0

    @property
    def memory_bytes(self) -> int:
        """The chosen plan's analysed memory as the budget counts it."""
        return self.analysis.peak_bytes + self.counted_params


def load_fit_app(spec: str, input_shape: Sequence[int] | None = None, batch: int = 1) -> FitApp:
    """A model (zoo name, .onnx, module:factory) or an application file; `batch` samples per
    request for every CNN."""
    import tightfit
    from tightfit.frontend.app import is_app_file, load_app

    if not 1 <= batch <= 4096:  # the plan checker's bound on a plan's batch
        raise OptionError(f"--batch {batch} must be 1-4096")
    if is_app_file(spec):
        app, graphs = load_app(spec)
        return FitApp(tuple(PlannedModel(g, c.model, batch) for g, c in zip(graphs, app.cnns)),
                      tuple(c.name for c in app.cnns), tuple((p.cnn, p.layers) for p in app.partitions), app.pipelines)
    if spec.lower().endswith((".yaml", ".yml", ".json")):
        from tightfit.frontend.app import AppError

        raise AppError(f"application file not found: {spec}")
    return FitApp.single(PlannedModel(tightfit.load(spec, input_shape), spec, batch))


def param_bytes(app: FitApp) -> int:
    import tightfit

    return sum(tightfit.inspect(g).param_bytes for g in app.graphs)


def fit(app: FitApp, budget_bytes: int, with_params: bool = False, min_fps: str | None = None, seed: int = 0,
        best_effort: bool = False, cost=None, measure: bool = True, progress: Callable[[int, int], None] | None = None,
        sources: dict[str, TechniqueSource] | None = None, thorough: bool = False, objective: str = "speed",
        timer: "Callable[[Plan, Sequence], Sequence[float]] | None" = None, time_limit: float | None = None,
        say: Callable[[str], None] = lambda line: None, **search_options) -> FitOutcome:
    """Search, choose (`choose`: the fastest measured plan that fits, or with `objective`
    "memory" and a minimum fps the smallest whose measured fps meets it, Alg. 9), place, check,
    run and verify the chosen plan, measure. FitError when nothing fits the budget or no plan
    that fits meets the minimum fps as measured (unless `best_effort`: the closest plan).
    `thorough`: search large CNNs as fully as small ones (see plan.fit.QUICK_LAYERS). `timer`:
    a plan's fps per CNN (default: measured here, CHOICE_RUNS runs). `time_limit`: seconds of
    search (profiling new step shapes not counted; None: no limit), after which the best plans
    found so far are chosen from; `say` gets a progress line per phase."""
    from tightfit.runtime.cost import CostModel

    if budget_bytes <= 0:
        raise OptionError("--budget must be positive")
    if time_limit is not None and time_limit <= 0:
        raise OptionError("--time-limit must be positive")
    if objective not in OBJECTIVES:
        raise OptionError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    search_options.update(objective=objective, timer=timer or (lambda plan, graphs: measure_fps(plan, graphs, CHOICE_RUNS)),
                          time_limit=time_limit, say=say)
    # The profile is timed, and the fps predicted and measured, at one thread count: the cores the
    # measuring process leaves free (a profile timed on cores it loads models on runs slow).
    threads = run_threads(measure)
    with _threads(threads):
        outcome = _fit(app, budget_bytes, with_params, min_fps, seed, best_effort, cost or CostModel.default(),
                       measure, progress, sources, thorough, **search_options)
    outcome.threads = threads
    return outcome


def run_threads(measure: bool) -> int:
    """torch threads `fit` times and runs plans with: its own count, less the core the measuring
    process takes."""
    free = (os.cpu_count() or 1) - 1 if measure else torch.get_num_threads()
    return max(1, min(torch.get_num_threads(), free))


def _fit(app: FitApp, budget_bytes: int, with_params: bool, min_fps: str | None, seed: int, best_effort: bool, cost,
         measure: bool, progress: Callable[[int, int], None] | None, sources: dict[str, TechniqueSource] | None,
         thorough: bool, objective: str, timer: Callable, time_limit: float | None, say: Callable[[str], None],
         **search_options) -> FitOutcome:
    params = param_bytes(app)
    counted = params if with_params else 0
    constraints = Constraints(budget_bytes, parse_min_fps(min_fps, len(app.models)))
    if counted >= budget_bytes and not best_effort:
        raise FitError(f"nothing fits {human(budget_bytes)}: the parameters alone take {human(params)} "
                       f"({params / MB:.2f} MB)")
    problem = FitProblem(app, cost.plan_seconds, counted, cost=cost, thorough=thorough)
    with _measuring(app, measure) as measurement:
        t0 = time.perf_counter()
        clock = getattr(cost, "search_clock", time.monotonic)  # (stands still while the cost model profiles)
        deadline = Deadline.after(time_limit, clock) if time_limit is not None else None
        profiled = (getattr(cost, "profiled", 0), getattr(cost, "profiled_seconds", 0.0))
        found = search(problem, constraints, seed, sources=sources, source_budget=max(budget_bytes - counted, 0),
                       progress=progress, deadline=deadline, say=say, **search_options)
        search_seconds = time.perf_counter() - t0
        shapes, spent = getattr(cost, "profiled", 0) - profiled[0], getattr(cost, "profiled_seconds", 0.0) - profiled[1]
        say(f"fit: search {search_seconds - spent:.1f} s" + (f" of {time_limit:g} s allowed" if time_limit else "")
            + f"; profiling {shapes} new step shapes {spent:.1f} s (not counted)")
        if hasattr(cost, "save"):
            cost.save()
        graphs = app.graphs
        placed: dict[tuple[int, ...], tuple[Plan, CheckReport]] = {}

        def within_budget(point: FitPoint) -> tuple[Plan, CheckReport] | None:
            """The point's placed plan, if the final placement keeps it within the budget."""
            if point.genes not in placed:
                placed[point.genes] = _placed(problem, point)
            plan, analysis = placed[point.genes]
            return placed[point.genes] if analysis.peak_bytes + counted <= budget_bytes else None

        def timed_fps(point: FitPoint) -> tuple[float, ...] | None:
            got = within_budget(point)
            return None if got is None else tuple(timer(got[0], graphs))

        fitting = [p for p in found.front if p.memory_bytes <= budget_bytes]
        say(f"fit: choosing among {len(fitting)} plans that fit: timing the best candidates")
        choice = choose(fitting, constraints.min_fps, objective, timed_fps)
        if choice.point is not None:
            say(f"fit: chosen by {choice.rule}: measured fps {', '.join(f'{f:.1f}' for f in choice.measured_fps)}")
        if choice.point is not None and not choice.met and not best_effort:
            raise FitError(unmet_fps_line(choice, constraints, budget_bytes))
        if choice.point is None:
            if not best_effort:
                raise FitError(unreachable_line(found, constraints, budget_bytes))
            smallest = select(found.front, Constraints(None, ()))[0]
            choice = Choice(smallest, (), False, "best effort: nothing fits the budget; the smallest plan found", 0)
        point = choice.point
        plan, analysis = placed.get(point.genes) or _placed(problem, point)
        naive = sum(t.nbytes(plan.dtype, m.batch) for g, m in zip(graphs, plan.models) for t in g.original_tensors) + params
        outcome = FitOutcome(app, found, constraints, problem, plan, point, analysis, params, with_params, choice.met,
                             naive, 0.0, search_seconds, choice=choice)

        def verified() -> None:
            outcome.max_abs_diff = verify(plan, graphs)

        say("fit: verifying the outputs and measuring the peak in a fresh process")
        if measurement is not None:  # the peak is measured in a fresh process while the outputs are verified here
            outcome.measured = measure_plan(plan, graphs, meanwhile=verified, measurement=measurement)
        else:
            verified()
        return outcome


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


def unmet_fps_line(choice: Choice, constraints: Constraints, budget_bytes: int) -> str:
    fps = ", ".join(f"{f:.1f}" for f in choice.measured_fps)
    need = ", ".join(f"{f:g}" for f in constraints.min_fps)
    return (f"no plan that fits {human(budget_bytes)} meets min fps {need} as measured: the fastest of the "
            f"{choice.timed} timed runs at {fps} fps (predicted {', '.join(f'{f:.1f}' for f in choice.point.fps)}); "
            f"--best-effort reports it")


@contextmanager
def _threads(n: int):
    """torch's intra-op threads set to `n` for a while."""
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
    measurement = Measurement(None, [(m.spec, m.ref().input_shape) for m in app.models], threads)
    try:
        yield measurement
    finally:
        if measurement.proc.poll() is None:
            measurement.cancel()


def unreachable_line(found: FitSearch, constraints: Constraints, budget_bytes: int) -> str:
    smallest = min(found.front, key=lambda p: (p.memory_bytes, sum(p.seconds)))
    n = len(smallest.seconds)
    best = [max(p.fps[m] for p in found.front) for m in range(n)]
    fps = ", ".join(f"{f:.1f}" for f in best)
    need = "" if not any(constraints.min_fps) else f" and min fps {', '.join(f'{f:g}' for f in constraints.min_fps)}"
    return (f"no plan meets {human(budget_bytes)}{need}: the smallest reachable memory is {human(smallest.memory_bytes)} "
            f"({smallest.memory_bytes / MB:.2f} MB, at {', '.join(f'{f:.1f}' for f in smallest.fps)} fps); "
            f"the best reachable fps is {fps} ({found.evaluated} plans evaluated)")


def _placed(problem: FitProblem, point: FitPoint) -> tuple[Plan, CheckReport]:
    plan = final_plan(problem, point)
    return plan, checked(plan, problem.app.graphs)


def final_plan(problem: FitProblem, point: FitPoint) -> Plan:
    """The point's application plan placed by the best offset planner, its choices in the knobs."""
    from dataclasses import replace

    from tightfit.plan.place import place

    plan = place(problem.plan(point.genes), problem.app.graphs, "improve")
    return replace(plan, knobs=dict(plan.knobs, techniques=list(point.labels), predicted_seconds=list(point.seconds)))


def checked(plan: Plan, graphs) -> CheckReport:
    from tightfit.plan.schema import PlanError

    try:
        return check_plan(plan, graphs)
    except PlanError as e:
        raise VerificationFailed(f"the chosen plan fails the checker: {e}") from None


def verify(plan: Plan, graphs) -> float:
    """Run the plan (arena filled with NaN first) and compare every output with the reference
    executor; returns the largest difference relative to each output's largest value."""
    import tightfit
    from tightfit.runtime.reference import run_reference
    from tightfit.verify import compare

    checked(plan, graphs)
    xs = tightfit.api.plan_inputs(graphs, plan)
    outs, _ = tightfit.api.execute(plan, graphs, xs, fill_nan=True)
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
                 measurement: Measurement | None = None) -> dict[str, Any]:
    """Peak above the loaded baseline in a fresh process (`measurement`: one started earlier,
    waiting for its job), and per CNN the fps of its partitions (median of `runs`; a CNN whose
    partitions all form one pipeline runs as a stream). `meanwhile` runs while that process
    measures (the fps are measured after it, alone)."""
    from tightfit.plan import schema

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "plan.json"
        path.write_text(schema.dumps(plan))
        job = {"kind": "plan", "plan": str(path)}
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
    return {"run_bytes": m.run_bytes, "baseline_bytes": m.baseline_bytes, "fps": measure_fps(plan, graphs, runs)}


def measure_fps(plan: Plan, graphs, runs: int = FPS_RUNS) -> list[float]:
    import tightfit
    from tightfit.runtime.executor import ArenaExecutor

    xs = tightfit.api.plan_inputs(graphs, plan)
    ex = ArenaExecutor(plan, graphs)
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


def run_cnn(ex, m: int, x) -> dict[str, torch.Tensor]:
    """Run only CNN `m`'s partitions of an application plan on input `x` (a frame routed to one
    CNN); returns its outputs as views into the arena."""
    with torch.no_grad():
        for p, compiled in zip(ex.plan.partitions, ex.frames[0]):
            if p.model == m:
                compiled.run(x)
    return ex._outputs[0][m]


# --- explaining ---------------------------------------------------------------------------------

def peak_tensors(plan: Plan, graphs, top: int = 6) -> tuple[int, int, list[tuple[str, str, int, str]]]:
    """(busiest step, its kernel temporaries, [(CNN index:tensor, buffer kind, bytes, partition)])
    of the buffers live at the step where live bytes plus scratch are largest."""
    live = memory_over_steps(plan, graphs)
    step = max(range(len(live)), key=lambda i: live[i]) if live else 0
    life = lifetimes(plan, graphs)
    tensor_of: dict[int, tuple[int, str]] = {}
    for s in plan.steps():
        for a in (s.out, *s.inputs):
            tensor_of.setdefault(a.buffer, (s.model, a.tensor))
    rows = []
    for (b, c), r in zip(life.keys, life.reqs):
        if r.first_use <= step <= r.last_use:
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


def report(o: FitOutcome) -> dict[str, Any]:
    step, scratch, peak = peak_tensors(o.plan, o.app.graphs)
    budget = o.constraints.budget_bytes
    r = {
        "cnns": list(o.app.names), "models": [m.spec for m in o.app.models], "budget_bytes": budget,
        "with_params": o.with_params, "param_bytes": o.param_bytes, "min_fps": list(o.constraints.min_fps),
        "fits": o.fits, "early_exit": o.search.early_exit, "evaluated": o.search.evaluated,
        "search_seconds": o.search_seconds, "threads": o.threads,
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
        r["chosen"]["measured_fps"] = o.measured["fps"]
    return r


def report_text(r: dict[str, Any]) -> str:
    c = r["chosen"]
    what = "with parameters" if r["with_params"] else "run memory (arena + kernel temporaries)"
    verdict = "fits" if r["fits"] else "does NOT fit (best effort: the closest plan)"
    lines = [f"fit {' + '.join(r['cnns'])} in {_mb(r['budget_bytes'])}, {what}: {verdict}"
             + (" - reuse alone fits (early exit)" if r["early_exit"] else ""),
             f"  searched {r['evaluated']} plans in {r['search_seconds']:.1f} s",
             f"  chosen: {'; '.join(c['techniques'])}",
             f"  chosen by {r['chosen_by']}",
             f"  memory: analysed {_mb(c['memory_bytes'])} (arena {human(c['arena_bytes'])}, lower bound "
             f"{human(c['lower_bound_bytes'])}, kernel temporaries {human(c['scratch_peak_bytes'])})"]
    if "measured_memory_bytes" in c:
        # The peak is read in whole pages: a run memory of a few KiB may lie in pages already touched.
        small = c["arena_bytes"] + c["scratch_peak_bytes"] < 4 * PAGE_BYTES
        lines.append(f"          measured {_mb(c['measured_memory_bytes'])} (fresh process, peak above the loaded model"
                     f"{' + parameters' if r['with_params'] else ''}{f'; read in pages of {human(PAGE_BYTES)}' if small else ''})")
    lines.append(f"  fps ({r['threads']} torch thread{'s' if r['threads'] > 1 else ''}): predicted "
                 f"{', '.join(f'{f:.1f}' for f in c['predicted_fps'])}"
                 + (f"; measured {', '.join(f'{f:.1f}' for f in c['measured_fps'])}" if "measured_fps" in c else "")
                 + (f" (minimum {', '.join(f'{f:g}' for f in r['min_fps'])})" if any(r["min_fps"]) else ""))
    lines.append(f"  outputs equal the reference executor's (max diff {c['max_rel_diff_vs_reference']:.2g} x max value)")
    lines.append("  why it fits:" if r["fits"] else "  why it doesn't:")
    lines += [f"    {s}" for s in r["contributions"]]
    if not r["fits"]:
        if c["memory_bytes"] > r["budget_bytes"]:
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


def plot_memory(o: FitOutcome, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    live = memory_over_steps(o.plan, o.app.graphs)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(range(len(live)), [v / MB for v in live], lw=1, label="live buffers + kernel temporaries")
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
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(o: FitOutcome, out: Path, r: dict[str, Any]) -> None:
    """plan.json, report.json, report.txt and memory.png, written into a fresh folder first and
    moved into `out` when complete (nothing partial on disk; other files in `out` are kept)."""
    import json
    import shutil

    from tightfit.plan import schema

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "plan.json").write_text(schema.dumps(o.plan))
        (tmp / "report.json").write_text(json.dumps(r, indent=1) + "\n")
        (tmp / "report.txt").write_text(report_text(r) + "\n")
        plot_memory(o, tmp / "memory.png")
        if not out.exists():
            tmp.rename(out)
            return
        if not out.is_dir():
            raise OptionError(f"--out {out} is a file, not a folder")
        for f in tmp.iterdir():
            f.replace(out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def progress_bar(stream) -> Callable[[int, int], None]:
    """A one-line bar on a terminal; nothing elsewhere (so errors stay one line)."""
    if not stream.isatty():
        return lambda done, total: None

    def show(done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        stream.write(f"\rfit: searching [{'#' * filled}{'.' * (width - filled)}] {done}/{total} plans")
        if done >= total:
            stream.write("\r" + " " * (width + 40) + "\r")
        stream.flush()

    return show
