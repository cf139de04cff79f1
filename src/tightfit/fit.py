"""`tightfit fit`: search every technique for the plan that fits (tightfit.techniques.fit), then run it,
verify its outputs against the reference executor, measure its peak (fresh process) and fps,
and explain why it fits. Planners never execute; this module is the face that does.

Every plan fit reports was checked (tightfit.plan.check) and ran with outputs equal to the
reference executor's; a plan that fails either is never reported (VerificationFailed)."""
from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tightfit.errors import OptionError
from tightfit.plan.check import CheckReport, check_plan
from tightfit.techniques.deadline import Deadline
from tightfit.techniques.fit import Constraints, FitApp, FitError, FitPoint, FitProblem, FitSearch, search, select
from tightfit.techniques.interface import Technique
from tightfit.techniques.interface import PlannedModel
from tightfit.plan.schema import Plan
from tightfit.runtime.measure import Measurement
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


def load_fit_app(spec: str, input_shape: Sequence[int] | None = None, batch: int = 1,
                 allow_code: bool = False) -> FitApp:
    """A model (zoo name, .onnx, module:factory) or an application file (its CNNs by
    module:factory only with `allow_code`); `batch` samples per request for every CNN."""
    import tightfit
    from tightfit.frontend.app import is_app_file, load_app

    if not 1 <= batch <= 4096:  # the plan checker's bound on a plan's batch
        raise OptionError(f"--batch {batch} must be 1-4096")
    if is_app_file(spec):
        app, graphs = load_app(spec, allow_code)
        return FitApp(tuple(PlannedModel(g, c.model, batch) for g, c in zip(graphs, app.cnns)),
                      tuple(c.name for c in app.cnns), tuple((p.cnn, p.layers) for p in app.partitions), app.pipelines)
    if spec.lower().endswith((".yaml", ".yml", ".json")):
        from tightfit.frontend.app import AppError

        raise AppError(f"application file not found: {spec}")
    return FitApp.single(PlannedModel(tightfit.load(spec, input_shape), spec, batch))


def param_bytes(app: FitApp) -> int:
    import tightfit

    return sum(tightfit.inspect(g).param_bytes for g in app.graphs)


def fit(app: FitApp, budget_bytes: int | None, with_params: bool = False, min_fps: str | None = None, seed: int = 0,
        best_effort: bool = False, cost=None, measure: bool = True, progress: Callable[[int, int], None] | None = None,
        sources: dict[str, Technique] | None = None, thorough: bool = False, objective: str = "speed",
        timer: "Callable[[Plan, Sequence], Sequence[float]] | None" = None, time_limit: float | None = None,
        say: Callable[[str], None] = lambda line: None, **search_options) -> FitOutcome:
    """Search, choose (`choose`: the fastest measured plan that fits, or with `objective`
    "memory" and a minimum fps the smallest whose measured fps meets it, Alg. 9), place, check,
    run and verify the chosen plan, measure. Without a budget (`budget_bytes` None), the smallest
    plan whose measured fps meets `min_fps`. FitError when nothing fits the budget or no plan
    that fits meets the minimum fps as measured (unless `best_effort`: the closest plan).
    `thorough`: search large CNNs as fully as small ones (see techniques.fit.space.QUICK_LAYERS). `timer`:
    a plan's fps per CNN (default: measured here, CHOICE_RUNS runs). `time_limit`: seconds of
    search (profiling new step shapes not counted; None: no limit), after which the best plans
    found so far are chosen from; `say` gets a progress line per phase."""
    from tightfit.runtime.cost import CostModel

    if budget_bytes is None and not min_fps:
        raise OptionError("fit needs --budget SIZE, --min-fps X, or both")
    if budget_bytes is not None and budget_bytes <= 0:
        raise OptionError("--budget must be positive")
    if budget_bytes is None:
        objective = "memory"  # only a minimum fps: the smallest plan whose measured fps meets it
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


def _kernel_threads():
    """torch where the kernels that run plans loaded it (its intra-op threads are theirs), else
    None: fit never imports torch itself, an ONNX model's plans need none."""
    return sys.modules.get("torch")


def run_threads(measure: bool) -> int:
    """Threads `fit` times and runs plans with: the kernels' own count, less the core the
    measuring process takes."""
    torch = _kernel_threads()
    own = torch.get_num_threads() if torch is not None else os.cpu_count() or 1
    free = (os.cpu_count() or 1) - 1 if measure else own
    return max(1, min(own, free))


def _fit(app: FitApp, budget_bytes: int | None, with_params: bool, min_fps: str | None, seed: int, best_effort: bool, cost,
         measure: bool, progress: Callable[[int, int], None] | None, sources: dict[str, Technique] | None,
         thorough: bool, objective: str, timer: Callable, time_limit: float | None, say: Callable[[str], None],
         **search_options) -> FitOutcome:
    params = param_bytes(app)
    counted = params if with_params else 0
    constraints = Constraints(budget_bytes, parse_min_fps(min_fps, len(app.models)))
    if budget_bytes is not None and counted >= budget_bytes and not best_effort:
        raise FitError(f"nothing fits {human(budget_bytes)}: the parameters alone take {human(params)} "
                       f"({params / MB:.2f} MB)")
    from tightfit.runtime.profiling import profiled_search

    def searched(predict, deadline) -> tuple[FitProblem, FitSearch]:
        problem = FitProblem(app, predict.plan_seconds, counted, cost=predict, thorough=thorough)
        return problem, search(problem, constraints, seed, sources=sources, source_budget=0 if budget_bytes is None else max(budget_bytes - counted, 0),
                               progress=progress, deadline=deadline, say=say, **search_options)

    with _measuring(app, measure) as measurement:
        t0 = time.perf_counter()
        (problem, found), profiling = profiled_search(
            cost, searched, lambda: None if time_limit is None else Deadline.after(time_limit), say, "fit")
        search_seconds = time.perf_counter() - t0
        say(profiling.line("fit", time_limit))
        graphs = app.graphs
        placed: dict[tuple[int, ...], tuple[Plan, CheckReport]] = {}

        def within_budget(point: FitPoint) -> tuple[Plan, CheckReport] | None:
            """The point's placed plan, if the final placement keeps it within the budget."""
            if point.genes not in placed:
                placed[point.genes] = _placed(problem, point)
            plan, analysis = placed[point.genes]
            return placed[point.genes] if budget_bytes is None or analysis.peak_bytes + counted <= budget_bytes else None

        def timed_fps(point: FitPoint) -> tuple[float, ...] | None:
            got = within_budget(point)
            return None if got is None else tuple(timer(got[0], graphs))

        fitting = [p for p in found.front if budget_bytes is None or p.memory_bytes <= budget_bytes]
        say(f"fit: choosing among {len(fitting)} plans that fit: timing the best candidates")
        choice = choose(fitting, constraints.min_fps, objective, timed_fps)
        if choice.point is not None:
            say(f"fit: chosen by {choice.rule}: measured fps {', '.join(f'{f:.1f}' for f in choice.measured_fps)}")
        if choice.point is not None and not choice.met and not best_effort:
            raise FitError(unmet_fps_line(choice, constraints, budget_bytes))
        if choice.point is None:
            if not best_effort:
                raise FitError(unreachable_line(found, constraints, budget_bytes))
            choice = Choice(closest(problem), (), False, "best effort: nothing fits the budget; the smallest plan found", 0)
        point = choice.point
        plan, analysis = placed.get(point.genes) or _placed(problem, point)
        naive = sum(t.nbytes(plan.dtype, m.batch) for g, m in zip(graphs, plan.models) for t in g.original_tensors) + params
        outcome = FitOutcome(app, found, constraints, problem, plan, point, analysis, params, with_params, choice.met,
                             naive, 0.0, search_seconds, choice=choice,
                             timing={"search_seconds": profiling.search_seconds, "profiling_seconds": profiling.measure_seconds,
                                     "finding_seconds": profiling.finding_seconds, "profiled_shapes": profiling.shapes,
                                     "passes": profiling.passes, "time_limit": time_limit})

        def verified() -> None:
            outcome.max_abs_diff = verify(plan, graphs)

        say("fit: verifying the outputs and measuring the peak in a fresh process")
        if measurement is not None:  # the peak is measured in a fresh process while the outputs are verified here
            outcome.measured = measure_plan(plan, graphs, meanwhile=verified, measurement=measurement)
        else:
            verified()
        return outcome


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
    measurement = Measurement(None, [(m.spec, m.ref().input_shape) for m in app.models], threads)
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
    from tightfit.reference import run_reference
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
        job = {"kind": "plan", "plan": str(path), "allow_code": True}  # written here, from models loaded here
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
            "fps": measure_fps(plan, graphs, runs)}


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


def run_cnn(ex, m: int, x) -> Mapping[str, Any]:
    """Run only CNN `m`'s partitions of an application plan on input `x` (a frame routed to one
    CNN); returns its outputs as views into the arena."""
    for p, part in zip(ex.plan.partitions, ex.frames[0]):
        if p.model == m:
            ex.run_partition(part, x)
    return ex._outputs[0][m]


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


def parse_min_fps(text: str | None, n: int) -> tuple[float, ...]:
    """'' -> no minimum; 'X' -> every CNN; 'X,Y,...' -> one per CNN."""
    from tightfit.errors import OptionError

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
