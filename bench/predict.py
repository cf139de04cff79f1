"""The cost model's prediction error |pred/meas - 1| per technique on the zoo models, one thread,
against the Python executor and against the exported C program.

Target (issue 20, and issue 39 point 6 for the program the user ships): median <= 5% and max <= 15%
per technique, tiling and parts included, for both.

    python bench/predict.py [--models a,b,...] [--skip a,b] [--runs 5] [--span 30] [--max-rounds 9]
                            [--time-limit 20] [--fractions 0.5,0.125] [--vbs mobilenet_v1_025,...]
                            [--model-timeout 900] [--cpu N] [--skip-c] [--save-rows FILE]
    python bench/predict.py --from-rows FILE[,FILE...] [--models a,b,...] [--write-docs]

The 24 models take hours on a shared 2-core machine, so they can be measured in chunks: each run
with `--models a,b,c --save-rows chunks.jsonl` appends every model's rows (the run that measured
them, its command, date and commit, with them) as it finishes; `--from-rows` then prints the one
table and verdict over the saved rows without measuring anything (a model measured again: its last
rows), and with `--write-docs` writes that into docs/benchmarks.md.

Per model, in a process of its own, the plans (searched over a profile measured afresh there):
- reuse: the layer-by-layer plan with buffer reuse;
- parts, tiling: the search's pick within each fraction of the reuse plan's run memory (arena +
  kernel temporaries), each search bounded by --time-limit seconds of wall time, profiling
  included (the pick is the best found by then; where nothing fits, the smallest reachable);
- vbs (models named by --vbs): the variable-batch plan of a request of 4 within half the
  batch-4 reuse plan's run memory.
Measured and predicted in rounds, each a fresh profile of every step the plans hold (a cost model
in memory, measured from nothing: runtime/cost.py) and the plans' predictions from it, then one
timing of every plan; the median over the rounds of each, of which there are at least --runs and as
many as fit in --span seconds, and more, up to --max-rounds, while a plan's rounds scatter so that
their median is uncertain by more than NOISE (1%: a scaled median absolute deviation over the root
of the count). A plan runs in a timing worker of its own (runtime/_timer.py, one
torch thread; the run's thread CPU time, the clock the cost model times steps by at one thread, so
that other processes holding the cores count in neither); in each round it runs back to back,
twice or for 20 ms, and the median of the runs after the first is kept (a frame after a frame of
the same plan, which is what the model predicts, rather than after the other plans' workers).
Profile and timings share the minutes: the other tenants of this host slow our runs in phases of
seconds to a minute that the load average does not see (every plan of mobilenet_v3_small 9%
faster for 15 s, then 5-15% slower, while an in-cache matmul moved 1%), and a profile taken in one
phase and timings in another put a whole model off by that much. The spread printed per model is
how far its layer-by-layer plan's predictions and timings moved between rounds (largest over
smallest). Profiling, searches and timing workers run on one core (--cpu, default the last one):
left to the scheduler, a round's timings moved 40% at random (mobilenet_v3_small layer by layer
2.9 or 4.1-4.3 ms, while its profile predicted 2.8-3.0 in every round); pinned, most models'
rounds move 2-25% (40-50% in the host's worst minutes); the process that measured a step and the
one that runs it share that core's caches, as one thread of an edge device does. The machine is
shared: per model the 1-minute load average is sampled once a round and its range printed; rows
taken while it exceeded the core count are marked. An error, pred/meas - 1, is the median over the
rounds of each round's own ratio (a round's profile and timings are closer in time, and in the
host's load, than the medians of all rounds are), so it need not equal the ratio of the printed
medians.

The exported program (issue 39 point 6): every plan is exported (`tightfit.export.export`, weights in
weights.bin) and built with the check's default flags (-O3 -march=native, static). In each round,
each plan runs on the executor and at once as its program, on the same core (the two times of a plan
taken within a second, in the same phase of the host's other work; the plans' order alternates
between rounds), its input read whole first (-p), 1 + k runs back to back (k as many as the
executor's worker makes, at least 2); the program says the median of its runs after the first, each
the shorter of its wall and its CPU time less what the clocks read around nothing (main.c's
cpu_seconds: the executor's clock, so that other processes holding the core count in neither). The
median over the rounds is printed beside the executor's ("C ms"), with its own prediction ("Cpred
ms": the same profile's, less the executor's Python and ctypes call around each partition, which
the program does not make: analysis/predict.Predictor.plan_seconds(program=True)) and error per
technique, and the program's time over the executor's per technique (the same kernels on the same tables: they differ
only by how the process holds its memory and calls the library). The cost model profiles steps
through the library's tf_run, as both run them, so one profile predicts both. Where the program's
prediction is off by more than 5%, the summary prints it by its terms (analysis/predict.Terms:
the steps' own times, what the cache model fetches from memory, the ops' code fetched again)
beside the measured time: whether the miss is in the steps' times or in what the cache adds.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from benchlib import add_write_docs, command_line, commit, cores, docs_section, header, load_mark, loaded, verdict  # noqa: E402
from tightfit.techniques.interface import run_memory  # noqa: E402

TECHNIQUES = ("reuse", "parts", "tiling", "vbs")
MEDIAN_TARGET, MAX_TARGET = 0.05, 0.15
ROUND_SECONDS = 0.02
VBS_REQUEST = 4
NOISE = 0.01  # a median over rounds that the rounds' scatter leaves uncertain by more is measured again
TERMS = ("steps", "fetch", "code")  # the program's prediction by its terms (it makes no executor's calls)


def model_plans(name: str, fractions: list[float], time_limit: float, vbs: bool, cost) -> list[tuple[str, str, object]]:
    """(technique, label, plan) for one model."""
    import tightfit
    from tightfit.techniques.deadline import Deadline
    from tightfit.techniques.parts.phase_search import plan_point as parts_plan, search_parts
    from tightfit.techniques.interface import PlannedModel
    from tightfit.techniques.reuse.planner import plan_reuse
    from tightfit.techniques.tiling import TilingOptions, cost_seconds, plan_point as tiling_plan, search_tiling

    g = tightfit.load(name)
    model = PlannedModel(g, name)
    reuse = plan_reuse(model)
    base = run_memory(reuse)
    plans = [("reuse", "layer by layer", reuse)]
    for f in fractions:
        budget = int(base * f)
        found = search_parts(model, lambda p: cost.plan_seconds(p, [g]), budget, deadline=Deadline.after(time_limit))
        plans.append(("parts", _label(f, found.fits, found.timed_out), parts_plan(model, found.chosen)))
        try:
            found = search_tiling(model, cost_seconds(cost, g), budget, options=TilingOptions(front_points=0), deadline=Deadline.after(time_limit))
        except KeyError:  # the search fails when time is up before its plain segments are planned
            found = search_tiling(model, cost_seconds(cost, g), budget, options=TilingOptions(front_points=0))
        plans.append(("tiling", _label(f, found.fits, found.timed_out) + " " + found.chosen.config.spec[:28], tiling_plan(model, found.chosen)))
    if vbs:
        plans += vbs_plans(name, cost)
    return plans


def vbs_plans(name: str, cost) -> list[tuple[str, str, object]]:
    import tightfit
    from tightfit.errors import BudgetError
    from tightfit.techniques.interface import PlannedModel
    from tightfit.techniques.reuse.planner import plan_reuse

    g = tightfit.load(name)
    budget = run_memory(plan_reuse(PlannedModel(g, name, VBS_REQUEST))) // 2
    try:
        plan, _ = tightfit.api.plan(name, method="vbs", batch=VBS_REQUEST, budget=budget, cost=cost)
    except BudgetError:
        return []
    return [("vbs", f"request {VBS_REQUEST}, 1/2", plan)]


def _label(fraction: float, fits: bool, timed_out: bool) -> str:
    text = f"1/{round(1 / fraction)}" if fraction < 1 else "1"
    return text + ("" if fits else " smallest") + (" (time up)" if timed_out else "")


@dataclass
class Program:
    """A plan's exported program, built: what running it needs."""

    binary: Path
    weights: Path | None
    inputs: list
    sizes: list


def build_programs(plans: list, graph, work: Path) -> list[Program | str]:
    """Each plan exported and built in `work` (weights in a file: no slow initializers); a plan
    that does not export is its one-line reason."""
    import numpy as np

    from tightfit.api import plan_inputs
    from tightfit.export import export
    from tightfit.export.build import build

    out: list[Program | str] = []
    for k, plan in enumerate(plans):
        folder = work / f"plan{k}"
        try:
            sources = export(plan, [graph], folder, weights="file")
            built = build(folder, sources.name)
        except Exception as e:  # noqa: BLE001 -- a plan the export refuses is a row without a C time
            out.append(f"{type(e).__name__}: {str(e).splitlines()[0][:80]}")
            continue
        xs = [np.asarray(x, dtype=np.float32) for x in plan_inputs([graph], plan)]
        sizes = [int(np.prod((plan.models[0].batch,) + tuple(graph.shape(t)[1:]))) for t in graph.outputs]
        out.append(Program(built.binary, folder / "weights.bin" if sources.weights_in_file else None, xs, sizes))
    return out


def time_program(program: Program, frames: int) -> float:
    """Seconds of one run of the program: the median of its runs after the first, back to back in
    one process (`frames` of them, at least 2), each the shorter of its wall and CPU time less
    what the clocks read around nothing (main.c's cpu_seconds): the executor's runs are timed so,
    and a run that lost the core to another process counts only what it ran."""
    from tightfit.export.build import run

    return run(program.binary, program.inputs, program.sizes, 1 + max(2, frames), program.weights, preload=True).cpu_seconds


def measure(plans: list, graph, args, first: list[float], programs: list | None = None) -> dict:
    """Per plan its median prediction and median time over the rounds (see the module's
    docstring), and its exported program's (`programs`: a Program per plan, or the reason it has
    none); the rounds, the seconds a round's profile took, the 1-minute load averages sampled
    (one a round), and per plan the spread of its predictions and of its times (largest over
    smallest, less 1)."""
    from tightfit.runtime.cost import CostModel
    from tightfit.runtime.vbs_runs import PlanTimer

    timers = [PlanTimer(p, graph, stir=False, clock="step") for p in plans]
    try:
        for t in timers:  # every worker loaded before any is timed (loading takes the cores)
            t.run(0)
        predicted: list[list[float]] = [[] for _ in plans]
        predicted_c: list[list[float]] = [[] for _ in plans]  # the same profile's prediction of the program
        terms: list[list] = [[] for _ in plans]  # and that prediction by its terms (analysis/predict.Terms)
        times: list[list[float]] = [[] for _ in plans]
        c_times: list[list[float]] = [[] for _ in plans]
        programs = programs or [""] * len(plans)
        profiling: list[float] = []
        loads: list[float] = []
        start, r = time.monotonic(), 0
        while _more_rounds(r, time.monotonic() - start, args, predicted + times + c_times):
            loads.append(os.getloadavg()[0])
            t0, profile = time.monotonic(), CostModel(None)
            for k, p in enumerate(plans):
                predicted[k].append(profile.plan_seconds(p, [graph]))
                predicted_c[k].append(profile.plan_seconds(p, [graph], program=True))
                terms[k].append(profile.plan_terms(p, [graph], program=True))
            profiling.append(time.monotonic() - t0)
            # Each plan on the executor, then at once as its program: the two times of a plan are
            # taken within a second of each other, in the same phase of the host's other work.
            for k in range(len(plans)) if r % 2 == 0 else reversed(range(len(plans))):
                times[k].append(statistics.median(timers[k].run(_frames(first[k]))[1:]))
                if isinstance(programs[k], Program):
                    c_times[k].append(time_program(programs[k], _frames(first[k]) + 1))
            r += 1
    finally:
        for t in timers:
            t.close()
    spread = lambda xs: max(xs) / min(xs) - 1  # noqa: E731
    return {"predicted": [statistics.median(p) for p in predicted], "measured": [statistics.median(t) for t in times],
            "c_predicted": [statistics.median(p) for p in predicted_c],
            "c_terms": [{f: statistics.median(getattr(t, f) for t in ts) for f in TERMS} for ts in terms],
            "error": [_paired_error(p, t) for p, t in zip(predicted, times)],
            "c_error_ratio": [_paired_error(p, c) if c else None for p, c in zip(predicted_c, c_times)],
            "c_measured": [statistics.median(t) if t else None for t in c_times],
            "c_error": [p if isinstance(p, str) else "" for p in programs],
            "rounds": r, "profile_seconds": statistics.median(profiling), "loads": loads,
            "per_round": [{"pred": p, "pred_c": q, "py": t, "c": c} for p, q, t, c in zip(predicted, predicted_c, times, c_times)],
            "spread": [(spread(p), spread(t), spread(c) if c else None) for p, t, c in zip(predicted, times, c_times)]}


def _paired_error(predicted: list[float], measured: list[float]) -> float:
    """pred/meas - 1 as the median over the rounds of each round's own ratio: a round's profile and
    timings are taken minutes closer to each other than the rounds' medians are, in the same phase
    of the host's other work."""
    return statistics.median(p / m for p, m in zip(predicted, measured)) - 1


def _more_rounds(done: int, elapsed: float, args, series: list[list[float]]) -> bool:
    """Whether to take another round: until --runs rounds and --span seconds; then, up to
    --max-rounds, while some plan's predictions or times are noisy (the host's other work moved
    them between rounds by more than their median can be trusted to NOISE)."""
    if done < args.runs or elapsed < args.span:
        return True
    return done < args.max_rounds and any(_noisy(xs) for xs in series)


def _noisy(xs: list[float]) -> bool:
    """Whether the median of `xs` is uncertain by more than NOISE: the median absolute deviation
    (scaled to a normal's standard deviation) over the root of the count, relative to the median."""
    if len(xs) < 3:
        return False
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    return 1.4826 * mad / math.sqrt(len(xs)) > NOISE * med


def _frames(seconds: float) -> int:
    """Runs back to back per round: the first follows the other plans' workers and is left out;
    a plan of microseconds runs for ROUND_SECONDS, whose median its single run's noise does not
    reach (minakova5, 50 us: a lone run is off by a preemption or a cold L1)."""
    return 2 + min(200, int(ROUND_SECONDS / max(seconds, 1e-6)))


def one_model(name: str, args) -> None:
    """Print one JSON line per plan: technique, label, steps, predicted, measured seconds."""
    import tightfit
    from tightfit.runtime.cost import CostModel

    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    if args.cpu >= 0:  # the timing workers inherit it
        os.sched_setaffinity(0, {args.cpu})
    cost = CostModel(None)
    fractions = [float(f) for f in args.fractions.split(",")]
    plans = model_plans(name, fractions, args.time_limit, name in args.vbs.split(","), cost)
    graph = tightfit.load(name)
    first = [cost.plan_seconds(p, [graph]) for _, _, p in plans]
    with tempfile.TemporaryDirectory(prefix="bench-predict-") as work:
        programs = build_programs([p for _, _, p in plans], graph, Path(work)) if not args.skip_c else None
        m = measure([p for _, _, p in plans], graph, args, first, programs)
    for k, (technique, label, plan) in enumerate(plans):
        print(json.dumps({"technique": technique, "label": label, "steps": len(plan.steps()),
                          "predicted": m["predicted"][k], "measured": m["measured"][k], "rounds": m["rounds"],
                          "error": m["error"][k], "c_predicted": m["c_predicted"][k], "c_error_ratio": m["c_error_ratio"][k],
                          "c_measured": m["c_measured"][k], "c_error": m["c_error"][k], "c_terms": m["c_terms"][k],
                          "profile_seconds": m["profile_seconds"], "spread": m["spread"][k], "loads": m["loads"],
                          "loaded": max(m["loads"]) > cores(), "per_round": m["per_round"][k]}),
              flush=True)


def main() -> None:
    from tightfit.frontend.zoo import names

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="")
    ap.add_argument("--skip", default="")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--span", type=float, default=30.0)
    ap.add_argument("--max-rounds", type=int, default=9,
                    help="rounds taken at most while a plan's rounds scatter (see NOISE)")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--fractions", default="0.5,0.125")
    ap.add_argument("--vbs", default="mobilenet_v1_025,squeezenet1_0")
    ap.add_argument("--model-timeout", type=float, default=900.0)
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)),
                    help="the core that profiles, searches and runs the plans (-1: wherever the scheduler puts them)")
    ap.add_argument("--skip-c", action="store_true", help="time the Python executor only (no exported programs)")
    ap.add_argument("--save-rows", default="", metavar="FILE",
                    help="append each model's rows (JSON lines) to FILE, for a table over several runs (--from-rows)")
    ap.add_argument("--from-rows", default="", metavar="FILE[,FILE...]",
                    help="measure nothing: print the table and verdict over rows saved by --save-rows (with --write-docs, into the docs)")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    add_write_docs(ap)
    args = ap.parse_args()
    if args.cpu != -1 and args.cpu not in os.sched_getaffinity(0):
        ap.error(f"--cpu {args.cpu}: not one of this process's cores {sorted(os.sched_getaffinity(0))} (or -1)")
    missing = [f for f in args.from_rows.split(",") if args.from_rows and not Path(f).is_file()]
    if missing:
        ap.error(f"--from-rows: no such file: {', '.join(missing)}")
    if args.one:
        one_model(args.one, args)
        return
    shown = command_line("predict.py")
    with docs_section("predict", args.write_docs, shown):
        if args.from_rows:
            from_rows(args)
        else:
            all_models(args, names)


def all_models(args, names) -> None:
    """Every model in a child process of its own, then the error per technique and the verdict,
    against the Python executor and against the exported program."""
    torch.set_num_threads(1)
    header(__doc__.splitlines()[0])
    models = [m for m in (args.models.split(",") if args.models else names()) if m not in args.skip.split(",")]
    print(f"models: {', '.join(models)}; runs {args.runs}; search limit {args.time_limit:g} s; "
          f"measured over at least {args.span:g} s; fractions of the reuse run memory {args.fractions}; vbs on {args.vbs or 'none'}")
    table = Table(args.skip_c)
    for name in models:
        t0 = time.monotonic()
        skipped = len(table.skipped)
        rows = _model_rows(name, args, table.skipped)
        if args.save_rows:
            _save_rows(args.save_rows, name, rows or [{"skipped": table.skipped[skipped:]}], time.monotonic() - t0)
        table.model(name, rows, time.monotonic() - t0)
    table.summary()


def _save_rows(path: str, name: str, rows: list[dict], seconds: float) -> None:
    """Append a model's rows (or why it has none) to `path`, each with the run that measured it:
    appended model by model, so a run cut short keeps what it measured."""
    run = f"{command_line('predict.py')} on {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC at commit {commit()}"
    with open(path, "a") as f:
        f.writelines(json.dumps({"model": name, "seconds": seconds, "run": run, **row}) + "\n" for row in rows)


def from_rows(args) -> None:
    """The table and the verdict over rows saved by earlier runs (--save-rows), measuring nothing:
    one model's rows are those of its last run in the files' order (a model measured again
    replaces its earlier rows); --models / --skip select among them."""
    by_model: dict[str, list[dict]] = {}
    runs: dict[str, None] = {}
    for path in args.from_rows.split(","):
        previous = None
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            key = (row["model"], row.get("run"))
            if key != previous:  # a model's rows are written together: a new block replaces older ones
                by_model[row["model"]] = []
                previous = key
            by_model[row["model"]].append(row)
            runs.setdefault(f"{path}: {row.get('run', 'run not recorded')}")
    chosen = [m for m in (args.models.split(",") if args.models else by_model) if m not in args.skip.split(",")]
    print(__doc__.splitlines()[0])
    print("measured by earlier runs, their rows read back (--from-rows):\n" + "\n".join(f"  {r}" for r in runs))
    print(f"models: {', '.join(m for m in chosen if m in by_model)}")
    table = Table(skip_c=False)
    for name in chosen:
        if name not in by_model:
            table.skipped.append(f"{name} (no rows)")
            continue
        rows = [r for r in by_model[name] if "skipped" not in r]
        table.skipped += [why for r in by_model[name] for why in r.get("skipped", [])]
        table.model(name, rows, by_model[name][0].get("seconds"))
    table.summary(final_load=False)


class Table:
    """The per-plan lines, printed model by model, and what the summary needs of them: per
    technique the errors against the executor and the program, the errors relative to the model's
    reuse plan, the program's time over the executor's, the plans without a program's time."""

    def __init__(self, skip_c: bool):
        self.skip_c = skip_c
        self.errors: dict[str, dict[str, list[float]]] = {kind: {t: [] for t in TECHNIQUES}
                                                          for kind in ("Python executor", "exported program")}
        self.relative: dict[str, list[float]] = {t: [] for t in TECHNIQUES}  # against the model's reuse plan
        self.c_over_py: dict[str, list[float]] = {t: [] for t in TECHNIQUES}
        self.skipped: list[str] = []
        self.no_program: list[str] = []
        self.missed: list[str] = []  # the program's predictions off by more than the median target, by their terms
        print(f"{'model':<22} {'technique':<7} {'plan':<44} {'steps':>6} {'pred ms':>9} {'Py ms':>9} {'pred/Py-1':>10} "
              f"{'Cpred ms':>9} {'C ms':>9} {'pred/C-1':>9} {'C/Py':>6}")

    def model(self, name: str, rows: list[dict], seconds: float | None) -> None:
        """Print one model's rows and its rounds' line; take its errors."""
        reuse_ratio = None
        for row in rows:
            err, technique = row["error"], row["technique"]
            self.errors["Python executor"][technique].append(abs(err))
            if technique == "reuse":
                reuse_ratio = 1 + err
            elif reuse_ratio is not None:
                self.relative[technique].append(abs((1 + err) / reuse_ratio - 1))
            c = row.get("c_measured")
            if c:
                self.errors["exported program"][technique].append(abs(row["c_error_ratio"]))
                self.c_over_py[technique].append(c / row["measured"])
            elif not self.skip_c:
                self.no_program.append(f"{name} {technique} {row['label']}: {row.get('c_error') or 'not timed'}")
            if c and abs(row["c_error_ratio"]) > MEDIAN_TARGET and row.get("c_terms"):
                self.missed.append(_terms_text(name, row))
            c_text = (f"{row['c_predicted'] * 1e3:>9.2f} {c * 1e3:>9.2f} {row['c_error_ratio'] * 100:>+8.1f}% "
                      f"{c / row['measured']:>6.3f}" if c else f"{'-':>9} {'-':>9} {'-':>9} {'-':>6}")
            mark = " [loaded]" if row["loaded"] else ""
            print(f"{name:<22} {technique:<7} {row['label']:<44} {row['steps']:>6} {row['predicted'] * 1e3:>9.2f} "
                  f"{row['measured'] * 1e3:>9.2f} {err * 100:>+9.1f}% {c_text}{mark}", flush=True)
        if rows:
            took = "?" if seconds is None else f"{seconds:.0f}"
            print(f"{'':<22} ({took} s; {_rounds_text(rows[0])}){load_mark(max(rows[0]['loads']))}", flush=True)

    def summary(self, final_load: bool = True) -> None:
        """The errors per technique against both, the program over the executor, the errors
        relative to the reuse plans, what was skipped, and the verdict."""
        checks = []
        for kind, per in self.errors.items():
            if not any(per.values()):
                continue
            print(f"\n|pred/meas - 1| per technique, measured on the {kind} (target: median <= {MEDIAN_TARGET:.0%}, "
                  f"max <= {MAX_TARGET:.0%})")
            for t, errs in per.items():
                if not errs:
                    continue
                med, top = statistics.median(errs), max(errs)
                checks += [(med <= MEDIAN_TARGET, f"{kind}: {t} median {med:.1%}"),
                           (top <= MAX_TARGET, f"{kind}: {t} max {top:.1%}")]
                print(f"  {t:<7} plans {len(errs):>3}  median {med * 100:5.1f}%  max {top * 100:5.1f}%")
        if any(self.c_over_py.values()):
            print("the exported program's time over the Python executor's (the same kernels on the same tables):")
            for t, rs in self.c_over_py.items():
                if rs:
                    print(f"  {t:<7} plans {len(rs):>3}  median {statistics.median(rs):.3f}  range {min(rs):.3f}-{max(rs):.3f}")
        print("the Python executor's, each plan's pred/meas divided by its model's reuse plan's (what a choice between plans"
              " rests on; a load that slows every plan of a model alike cancels):")
        for t, errs in self.relative.items():
            if errs:
                print(f"  {t:<7} plans {len(errs):>3}  median {statistics.median(errs) * 100:5.1f}%  max {max(errs) * 100:5.1f}%")
        if self.missed:
            print("the program's predictions off by more than 5%, by their terms (medians over the rounds, ms: the steps'"
                  " own times, the cache's fetches from memory, the ops' code fetched again; against the time measured):")
            print("\n".join(self.missed))
        if self.skipped:
            print("skipped: " + ", ".join(self.skipped))
        if self.no_program:
            print("no exported program timed: " + "; ".join(self.no_program))
            checks.append((False, f"{len(self.no_program)} plans without an exported program's time"))
        print("targets: " + verdict(checks) + (loaded() if final_load else ""))


def _terms_text(name: str, row: dict) -> str:
    """One plan's program prediction by its terms beside its measured time, and how far the steps'
    own times alone were from it: whether the miss is in the steps or in what the cache adds."""
    t, c = row["c_terms"], row["c_measured"]
    return (f"  {name} {row['technique']} {row['label']} ({row['steps']} steps): steps {t['steps'] * 1e3:.2f} + fetch "
            f"{t['fetch'] * 1e3:.2f} + code {t['code'] * 1e3:.2f} = {row['c_predicted'] * 1e3:.2f} against {c * 1e3:.2f} "
            f"({row['c_error_ratio'] * 100:+.1f}%); the steps alone {t['steps'] / c - 1:+.1%}")


def _rounds_text(row: dict) -> str:
    """A model's rounds: how many, the profile's seconds, how far its layer-by-layer plan moved between
    them, and the load they were taken at."""
    spread_pred, spread_py, spread_c = row["spread"]
    moved = f"{spread_pred:.0%} predicted, {spread_py:.0%} on the executor" + (f", {spread_c:.0%} as a program" if spread_c is not None else "")
    loads = row["loads"]
    return (f"{row['rounds']} rounds, a profile in {row['profile_seconds']:.1f} s each; layer by layer moved {moved}; "
            f"load {min(loads):.1f}-{max(loads):.1f} on {cores()} cores")


def _model_rows(name: str, args, skipped: list[str]) -> list[dict]:
    """One model's rows, from a child process of its own (its failure a line, and a name in `skipped`)."""
    try:
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", name], capture_output=True, text=True,
                             timeout=args.model_timeout)
    except subprocess.TimeoutExpired:
        skipped.append(f"{name} (past {args.model_timeout:g} s)")
        print(f"{name:<22} skipped: past --model-timeout {args.model_timeout:g} s", flush=True)
        return []
    if out.returncode != 0:
        skipped.append(f"{name} (failed)")
        print(f"{name:<22} failed: {out.stderr.strip().splitlines()[-1:]}", flush=True)
        return []
    return [json.loads(line) for line in out.stdout.splitlines()]


if __name__ == "__main__":
    main()
