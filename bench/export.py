"""The exported C program beside tightfit's Python executor, onnxruntime and emx-onnx-cgen (issue 21,
acceptance 2), and MAFAT's experiment as a real process under a memory limit (acceptance 3).

    .venv/bin/python bench/export.py [--rounds 3] [--runs 3] [--only MODEL,...] [--threads N] [--skip-emx]
                                     [--skip-mafat] [--mafat-budgets 64,32,16] [--mafat-plans DIR64,DIR32,DIR16]
                                     [--mafat-cc CC] [--search] [--split-models M,...] [--time-limit S]

Part 1, per plan (mobilenet_v2, resnet18, googlenet and efficientnet_b0 reuse; mobilenet_v2 tiled
and by parts aiming at 1/2 and 1/8 of its reuse arena; tiny-yolov2 and yolov2-16 reuse and tiled aiming at 1/8 of theirs; the
tiled and by-parts plans are the explicit ones of EXPLICIT and PARTS_AT below (mobilenet_v2's at
1/8: the searches' picks within 1/8, recorded), or with --search the searches' picks
`api.plan(..., method="tiling"|"parts", budget=...)`):
- C: the plan exported (`tightfit.export.export`), built with the check's default flags
  (-std=c99 -O3 -march=native -ffp-contract=fast, static), run once streaming its input by rows
  (the outputs compared with the reference executor, the whole process's VmHWM: the peak printed),
  then timed with the input read whole first (`-p`, so no file reads are timed).
- Python: tightfit's arena executor on the same plan, one torch thread; peak: a fresh measuring
  process (runtime/measure.py, as `tightfit run PLAN --measure`), its whole VmHWM.
- ORT: onnxruntime on the same ONNX bytes (`verify.onnx_bytes_for`), intra- and inter-op threads 1,
  sequential; peak: a fresh process that loads onnxruntime, runs once and reads its VmHWM.
- emx: `emx-onnx-cgen compile --emit-testbench` on the same ONNX bytes, built with cc -O3
  -march=native; peak and exit status from /usr/bin/time -v (a small process: a child's
  ru_maxrss would count the Python process it was forked from); time per image from the
  testbench's timer hooks around its one `model()` call (the weights load is not timed), median
  over the rounds. Its output is compared with the reference executor's (max abs diff printed).
C, Python and ORT are timed interleaved: every round times each of them `--runs` times on every
plan, and the median over all rounds is printed. One thread everywhere, or with `--threads N` N
threads: the program's `-t N`, the executor's `threads=N` and onnxruntime's N intra-op threads
(emx-onnx-cgen has none). Issue 39 point 7's goal: C >= 1.0x onnxruntime on the four reuse plans at
that thread count; where one misses it, the lines after the targets say where the time goes,
measured: the library's steps timed one by one on one thread (each alone in an arena, as the cost
model profiles them; least CPU time) beside onnxruntime's own profile of its nodes
(enable_profiling; least time per node), summed per op kind; at N threads, both programs' speed-up
over one thread.

Issue 39 point 7's split plans: a plan by parts at 1/8 of its model's reuse arena within 1.15x the
reuse plan's time, a tiled one within 1.5x, the program's and the executor's (ratios of the medians
of the same interleaved rounds). Where one misses, the line after says where its extra time goes,
measured as shares of the reuse plan's time: its steps and the reuse plan's each timed alone (one
thread, least CPU time), split into the recomputed halos (multiply-adds added), the per-step cost
of small bands and tiles, and the rest spent in the program beyond its steps alone.

Part 2, MAFAT Table 4.1 for real: yolov2-16 plans fitted by `tightfit fit yolov2-16 --budget B
--with-params --stream-outputs` (B a little below 64, 32 and 16 MiB so that the program's code,
libc and stack fit too; the output leaves by rows as the input arrives, so neither is ever whole
in memory), exported, built with `--mafat-cc` (default musl-gcc where installed: a static musl
program maps about 0.6 MiB less code than a static glibc one; else cc), run: the whole process's
peak against the budget, and the binary run under `prlimit --data=BUDGET` and `prlimit
--as=BUDGET` (exit status and outputs compared). With musl, each budget's program is also built
with cc (glibc, static) and its peak printed beside. Latency ratio against the yolov2-16 reuse
plan exported the same way, beside MAFAT's.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import tightfit  # noqa: E402
from tightfit.errors import BudgetError  # noqa: E402
from tightfit.plan.check import check_plan  # noqa: E402
from tightfit.api import check_export  # noqa: E402
from tightfit.export import export  # noqa: E402
from tightfit.export.build import DEFAULT_CFLAGS, run  # noqa: E402
from tightfit.plan.schema import dumps  # noqa: E402
from tightfit.runtime.cost import _bind_alone  # noqa: E402  (a step alone in an arena, as the profiler times it)
from tightfit.runtime.executor import ArenaExecutor  # noqa: E402
from tightfit.runtime.measure import Measurement  # noqa: E402
from tightfit.reference import run_reference  # noqa: E402
from tightfit.units import human, parse_size  # noqa: E402
from tightfit.verify import onnx_bytes_for  # noqa: E402
from benchlib import emx_program, header, load_average, load_mark, loaded, set_torch_threads, verdict  # noqa: E402

MiB = 2**20
EMX = emx_program()
# MAFAT Table 4.1 (Farley & Gerstlauer), best measured latency in ms per memory limit (MB); 256 MB
# is unconstrained (the whole process fits).
MAFAT_MS = {256: 15065, 64: 17753, 32: 22215, 16: 31095}
MAFAT_BUDGETS_MIB = (64, 32, 16)
# What the fit leaves for the program besides weights and arena: its code and libc pages touched,
# stack, stdio buffers. Measured (VmHWM - weights - arena): 0.9 MiB for the yolov2-16 reuse program,
# 1.96 MiB for a by-parts one (608 row bands: its step code is 1.9 MiB of text); the table prints both.
FIT_MARGIN = 1 * MiB


def plan_at(model: str, method: str, budget: int | None = None, **kw):
    """(plan, graphs, note): the search's plan within `budget`, or, where the search cannot reach
    it, the smallest plan it reaches (its BudgetError names that size)."""
    try:
        plan, graphs = tightfit.api.plan(model, method=method, budget=budget, **kw)
        return plan, graphs, ""
    except BudgetError as e:
        m = re.search(r"needs ([0-9.]+ [KMG]iB|[0-9]+ B)", str(e))
        if m is None:
            raise
        if e.smallest is not None:  # (a search under a time limit does not find the same smallest twice)
            graphs = [tightfit.load(model)]
            check_plan(e.smallest, graphs)
            return e.smallest, graphs, f"{human(budget)} unreachable, smallest {m.group(1)}"
        reached = int(parse_size(m.group(1).replace(" ", "")) * 1.01) + 4096
        plan, graphs = tightfit.api.plan(model, method=method, budget=reached, **kw)
        return plan, graphs, f"{human(budget)} unreachable, smallest {human(reached)}"


@dataclass
class Row:
    label: str
    model: str
    plan: object
    graphs: list
    note: str = ""
    folder: Path | None = None
    binary: Path | None = None
    weights_file: Path | None = None
    c_ok: bool = False
    c_diff: float = float("nan")
    c_peak: int = 0
    code: int = 0        # the binary's text + data besides the weights (`size`)
    rows: int = 0        # its step tables' rows (a repeated run of steps: one REPEAT row and its body)
    limit: int = 0
    arena: int = 0
    weights: int = 0
    c_times: list = field(default_factory=list)
    py_times: list = field(default_factory=list)
    ort_times: list = field(default_factory=list)
    py_peak: int = 0
    error: str = ""
    method: str = "reuse"
    frac: int = 1        # the plan aims at this fraction of its model's reuse arena


# Explicit plans near 1/2 of the reuse arena, and the tiled ones at 1/8 (the searches took over 20
# minutes for one mobilenet_v2 budget on the shared 2-core machine; `--search` runs them instead).
# Uniform row bands cannot take mobilenet_v2 below 1.79 MiB: its parts plan at 1/8 is the parts
# search's pick within 1/8 (PARTS_AT), drafted from the settings it chose.
EXPLICIT = {
    ("mobilenet_v2", "tiling", 2): {"tiling": "0-20:2x2:reuse"},
    # the tiling search's pick within 1/8 without the whole network by parts (TilingOptions(parts=False),
    # 160 s): 14x4 tiles over layers 0-22 (narrow border columns), one-row tiles over 23-48
    ("mobilenet_v2", "tiling", 8): {"tiling": "0-22:14x4:reuse:edge3,23-48:7x1:reuse:overlay"},
    ("mobilenet_v2", "parts", 2): {"rows": 2},
    ("tiny-yolov2", "tiling", 8): {"tiling": "0-7:4x4:reuse"},
    ("yolov2-16", "tiling", 8): {"tiling": "0-7:8x8:reuse,8-15:4x4:reuse"},
}
# The parts search's pick within 1/8 of the reuse arena (search_parts over this machine's cost
# profile, 60 s; the tiling search's pick within 1/8 was the same plan): phases per layer range (one
# row per phase up to the 28-row layers, two in the 14-row ones, one in the 7-row ones), the input in
# 64 equal bands, no rows aligned to the producers, 7 layers' outputs held whole to cut the stream.
PARTS_AT = {
    ("mobilenet_v2", 8): dict(phases="0-3:112,4-10:56,11-21:28,22-61:7", source=64, align=False,
                              held=(12, 23, 27, 31, 35, 42, 49)),
}


def parts_at(model: str, settings: dict):
    """(plan, graphs): the parts plan of a search's settings (`phases` as 'FIRST-LAST:PHASES,...'),
    placed and checked as `tightfit.api.plan` does."""
    from tightfit.techniques import parts
    from tightfit.techniques.interface import Config, PlannedModel

    phases = {}
    for item in settings["phases"].split(","):
        span, count = item.split(":")
        first, last = (int(v) for v in span.split("-"))
        phases.update({lid: int(count) for lid in range(first, last + 1)})
    g = tightfit.load(model)
    plan = parts.draft(PlannedModel(g, model), Config(settings=dict(settings, phases=phases)))
    check_plan(plan, [g])
    return plan, [g]


def plans_part1(only: set[str] | None, search: bool, split_models: set[str] = frozenset(),
                time_limit: float | None = None) -> list[Row]:
    """The rows of part 1; `split_models` also get the parts and tiling searches' picks within 1/8
    of their reuse arena (searched for at most `time_limit` seconds each)."""
    rows = []
    wanted = [("mobilenet_v2", ("tiling", "parts")), ("resnet18", ()), ("googlenet", ()), ("efficientnet_b0", ()),
              ("tiny-yolov2", ("tiling",)), ("yolov2-16", ("tiling",))]
    for model, methods in wanted:
        if only and model not in only:
            continue
        plan, graphs = tightfit.api.plan(model)
        rows.append(Row(f"{model} reuse", model, plan, graphs))
        arena = plan.arena_bytes
        if model in split_models and not methods:
            methods = ("parts", "tiling")
        for method in methods:
            for frac in ((2, 8) if model == "mobilenet_v2" else (8,)):
                t0 = time.perf_counter()
                known = (model, method, frac) in EXPLICIT or method == "parts" and (model, frac) in PARTS_AT
                if search or not known:
                    p, g, note = plan_at(model, method, arena // frac, time_limit=time_limit)
                elif (model, method, frac) in EXPLICIT:
                    knobs = EXPLICIT[(model, method, frac)]
                    p, g = tightfit.api.plan(model, method=method, **knobs)
                    note = f"{', '.join(f'{k} {v}' for k, v in knobs.items())}: aims at {human(arena // frac)}"
                else:
                    p, g = parts_at(model, PARTS_AT[(model, frac)])
                    note = f"the parts search's pick within {human(arena // frac)}"
                print(f"  planned {model} {method} 1/{frac} ({human(arena // frac)}) in {time.perf_counter() - t0:.0f} s"
                      + (f": {note}" if note else ""), flush=True)
                rows.append(Row(f"{model} {method} 1/{frac}", model, p, g, note, method=method, frac=frac))
    return rows


def seeded_inputs(row: Row) -> list[np.ndarray]:
    return [np.asarray(x) for x in tightfit.api.plan_inputs(row.graphs, row.plan)]


def references(row: Row) -> list[np.ndarray]:
    xs = tightfit.api.plan_inputs(row.graphs, row.plan)
    return [np.asarray(run_reference(g, x)[t]) for g, x in zip(row.graphs, xs) for t in g.outputs]


def prepare_c(row: Row, work: Path) -> None:
    """Export, build, run once by rows: outputs compared, whole-process peak."""
    row.folder = work / row.label.replace(" ", "_").replace("/", "of")
    sources = export(row.plan, row.graphs, row.folder, force=True)  # a --keep folder of an earlier run
    chk = check_export(row.plan, row.graphs, sources, row.folder, runs=1)
    row.c_ok, row.c_diff, row.c_peak, row.limit = chk.ok, chk.max_abs_diff, chk.peak_rss, chk.budget_bytes
    row.code, row.rows = chk.code_bytes, sources.files[f"{sources.name}.c"].decode().count("{TF_STEP_")
    row.arena, row.weights = chk.arena_bytes, chk.weight_bytes
    row.binary = chk.built.binary
    row.weights_file = row.folder / "weights.bin" if sources.weights_in_file else None


def time_c(row: Row, x: list[np.ndarray], sizes: list[int], runs: int, threads: int = 1) -> None:
    # The program has no warm-up run: its first run faults the arena and weight pages in. 2k+1 runs
    # keep that one out of the median (Python and onnxruntime get a warm-up run each).
    ran = run(row.binary, x, sizes, 2 * runs + 1, row.weights_file, preload=True, threads=threads)
    row.c_times.append(ran.median_seconds)


def ort_session(onnx: bytes, threads: int = 1, profile: str | None = None):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile
    return ort.InferenceSession(onnx, opts, providers=["CPUExecutionProvider"])


ORT_PEAK = r"""
import sys, numpy as np, onnxruntime as ort
o = ort.SessionOptions(); o.intra_op_num_threads = 1; o.inter_op_num_threads = 1
o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
s = ort.InferenceSession(sys.argv[1], o, providers=["CPUExecutionProvider"])
x = np.fromfile(sys.argv[2], dtype="<f4").reshape(s.get_inputs()[0].shape)
s.run(None, {s.get_inputs()[0].name: x})
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")))
"""


def ort_peak(onnx_path: Path, input_path: Path) -> int:
    out = subprocess.run([sys.executable, "-c", ORT_PEAK, str(onnx_path), str(input_path)],
                         capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), check=True)
    return int(out.stdout.split()[-1]) * 1024


def python_peak(row: Row, work: Path) -> int:
    path = row.folder / "plan.json"
    path.write_text(dumps(row.plan))
    return Measurement({"kind": "plan", "plan": str(path)}, threads=1).result().peak_bytes


EMX_TIMER = r"""
#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <time.h>
static struct timespec t0;
void timer_start(void) { clock_gettime(CLOCK_MONOTONIC, &t0); }
void timer_stop(void) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fprintf(stderr, "emx_seconds %.9f\n", (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
}
"""


@dataclass
class Emx:
    error: str = ""
    folder: Path | None = None
    times: list = field(default_factory=list)
    peak: int = 0
    diff: float = float("nan")


def one_line(text: str) -> str:
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    useful = [l for l in lines if "error" in l.lower()] or lines[-1:] or ["?"]
    return useful[0][:160]


def prepare_emx(onnx_path: Path, folder: Path) -> Emx:
    folder.mkdir(parents=True, exist_ok=True)
    if not EMX.exists():
        return Emx("emx-onnx-cgen not installed (pip install -e .[bench])")
    gen = subprocess.run([str(EMX), "compile", "--emit-testbench", str(onnx_path), str(folder / "model.c")],
                         capture_output=True, text=True, cwd=folder)
    if gen.returncode != 0:
        return Emx("emx-onnx-cgen: " + one_line(gen.stderr + gen.stdout))
    (folder / "timer.c").write_text(EMX_TIMER)
    cc = subprocess.run(["cc", "-O3", "-march=native", "-o", "model", "model.c", "timer.c", "-lm"],
                        capture_output=True, text=True, cwd=folder)
    if cc.returncode != 0:
        return Emx("cc: " + one_line(cc.stderr))
    return Emx(folder=folder)


def time_emx(emx: Emx, input_path: Path, ref: np.ndarray) -> None:
    if emx.error:
        return
    done = subprocess.run(["/usr/bin/time", "-v", "./model", str(input_path)], capture_output=True, text=True,
                          cwd=emx.folder)
    if done.returncode != 0:
        emx.error = f"program exit {done.returncode}: " + one_line(done.stderr)
        return
    emx.times.append(float(re.search(r"emx_seconds ([0-9.eE+-]+)", done.stderr).group(1)))
    emx.peak = max(emx.peak, int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1)) * 1024)
    data = json.loads(done.stdout)["outputs"]
    got = np.array([float.fromhex(v) for v in np.ravel(next(iter(data.values()))["data"])], dtype=np.float32)
    emx.diff = float(np.max(np.abs(got - ref.ravel()))) if got.size == ref.size else float("inf")


def fps(times: list) -> float:
    return 1 / statistics.median(times) if times else float("nan")


def part1(args, work: Path) -> None:
    only = set(args.only.split(",")) if args.only else None
    split = set(args.split_models.split(",")) if args.split_models else set()
    rows = plans_part1(only, args.search, split, args.time_limit)
    set_torch_threads(1)
    onnx_paths, emxs, refs, inputs = {}, {}, {}, {}
    for row in rows:
        try:
            prepare_c(row, work)
            row.py_peak = python_peak(row, work)
        except Exception as e:  # noqa: BLE001 -- a failing plan is a row of the table, not the end of the run
            row.error = f"{type(e).__name__}: {e}"
        print(f"  built and measured {row.label}", flush=True)
        if row.model not in onnx_paths:
            shape = row.graphs[0].shape(row.graphs[0].inputs[0])
            onnx_paths[row.model] = work / f"{row.model}.onnx"
            onnx_paths[row.model].write_bytes(onnx_bytes_for(row.model, shape))
            inputs[row.model] = work / f"{row.model}.input.bin"
            inputs[row.model].write_bytes(np.ascontiguousarray(seeded_inputs(row)[0], dtype="<f4").tobytes())
            refs[row.model] = references(row)[0]
            emxs[row.model] = Emx("skipped (--skip-emx)") if args.skip_emx else prepare_emx(onnx_paths[row.model], work / f"emx-{row.model}")
            print(f"  emx-onnx-cgen {row.model}: {emxs[row.model].error or 'built'}", flush=True)
    sessions = {m: ort_session(p.read_bytes(), args.threads) for m, p in onnx_paths.items()}
    ort_peaks = {m: ort_peak(p, inputs[m]) for m, p in onnx_paths.items()}
    executors = {id(r): ArenaExecutor(r.plan, r.graphs, threads=args.threads) for r in rows if not r.error}
    xs = {id(r): tightfit.api.plan_inputs(r.graphs, r.plan) for r in rows}
    peak_load = load_average()  # the highest 1-minute load sampled while timing (marks the fps [loaded])
    for rnd in range(args.rounds):
        for row in rows:
            if row.error:
                continue
            x = xs[id(row)]
            time_c(row, [np.asarray(t) for t in x], [refs[row.model].size], args.runs, args.threads)
            ex = executors[id(row)]
            ex.run(x)
            for _ in range(args.runs):
                t0 = time.perf_counter()
                ex.run(x)
                row.py_times.append(time.perf_counter() - t0)
            s = sessions[row.model]
            feed = {s.get_inputs()[0].name: np.asarray(x[0])}
            s.run(None, feed)
            for _ in range(args.runs):
                t0 = time.perf_counter()
                s.run(None, feed)
                row.ort_times.append(time.perf_counter() - t0)
        for m, emx in emxs.items():
            time_emx(emx, inputs[m], refs[m])
        peak_load = max(peak_load, load_average())
        print(f"  round {rnd + 1}/{args.rounds} done{loaded()}", flush=True)
    missed = print_part1(rows, emxs, ort_peaks, peak_load, args.threads)
    print_program_sizes(rows)
    for row in missed:
        print_speed_reason(row, onnx_paths[row.model], xs[id(row)], args)
    for row, reuse in print_split_goals(rows, peak_load):
        print_split_reason(row, reuse, args.threads)


# Issue 39 point 8: a split plan's program within this much of its model's reuse program (code +
# constants besides the weights): its step tables grow with the layers and the plan's period, not
# with its bands or tiles.
CODE_GROWTH = 1.10


def print_program_sizes(rows: list[Row]) -> None:
    print()
    print("The programs' own size (issue 39 point 8: repeated steps as loops; code: text + data besides the weights, "
          "`size`; peak: the whole process's VmHWM)")
    head = f"{'plan':<24} {'steps':>6} {'rows':>6} {'code':>9} {'vs reuse':>8} {'peak':>9} {'w+a':>9} {'peak-w-a':>9}  target"
    print(head)
    print("-" * len(head))
    reuse = {r.model: r.code for r in rows if r.label.endswith(" reuse") and not r.error}
    for r in rows:
        if r.error:
            continue
        steps = sum(len(p.steps) for p in r.plan.partitions)
        ratio = r.code / reuse[r.model] if r.model in reuse else float("nan")
        checks = [] if r.label.endswith(" reuse") else [
            (ratio <= CODE_GROWTH, f"code {ratio:.2f}x the reuse program's (> {CODE_GROWTH:.2f}x)")]
        print(f"{r.label:<24} {steps:>6} {r.rows:>6} {human(r.code):>9} {ratio:8.2f} {human(r.c_peak):>9} "
              f"{human(r.weights + r.arena):>9} {human(r.c_peak - r.weights - r.arena):>9}  "
              + (verdict(checks) if checks else "-"))
    print(f"target: a split plan's code + constants within {CODE_GROWTH:.2f}x its model's reuse program's.")


# Issue 39 point 7: the reuse plans the program is to run at >= 1.0x onnxruntime (same thread count).
SPEED_GOAL = ("mobilenet_v2 reuse", "resnet18 reuse", "googlenet reuse", "efficientnet_b0 reuse")


def print_part1(rows: list[Row], emxs: dict, ort_peaks: dict, peak_load: float, threads: int = 1) -> list[Row]:
    """The table and its targets; the reuse rows that missed the speed goal."""
    print()
    said = "one thread" if threads == 1 else f"{threads} threads (C -t, executor threads, onnxruntime intra-op; emx: one)"
    print(f"Part 1: exported C program vs Python executor vs onnxruntime vs emx-onnx-cgen ({said}; peaks: whole process)")
    head = (f"{'plan':<24} {'weights':>9} {'arena':>9} {'C peak':>9} {'w+a+2MiB':>9} {'C fps':>7} {'Py peak':>9} "
            f"{'Py fps':>7} {'ORT peak':>9} {'ORT fps':>7} {'emx peak':>9} {'emx fps':>7} {'C/Py':>5} {'C/ORT':>5} "
            f"{'ORT/C pk':>8}  outputs")
    print(head)
    print("-" * len(head))
    goals, missed = [], []
    for row in rows:
        emx = emxs.get(row.model, Emx("not built"))
        if row.error:
            print(f"{row.label:<24} FAILED: {row.error}")
            goals.append((row.label, [(False, f"export, build or run failed: {row.error}")]))
            continue
        c, py, ort = fps(row.c_times), fps(row.py_times), fps(row.ort_times)
        emx_peak = human(emx.peak) if emx.peak else "-"
        emx_fps = f"{fps(emx.times):7.2f}" if emx.times else f"{'-':>7}"
        ratio_peak = ort_peaks[row.model] / row.c_peak
        print(f"{row.label:<24} {human(row.weights):>9} {human(row.arena):>9} {human(row.c_peak):>9} {human(row.limit):>9} "
              f"{c:7.2f} {human(row.py_peak):>9} {py:7.2f} {human(ort_peaks[row.model]):>9} {ort:7.2f} {emx_peak:>9} "
              f"{emx_fps} {c / py:5.2f} {c / ort:5.2f} {ratio_peak:8.1f}  C {'match' if row.c_ok else 'DIFFER'} "
              f"({row.c_diff:.2g})" + (f"; emx diff {emx.diff:.2g}" if emx.times else "") + load_mark(peak_load))
        if row.note:
            print(f"{'':<24} ({row.note})")
        checks = [(row.c_ok, f"C outputs differ from the reference (max abs diff {row.c_diff:.2g})"),
                  (row.c_peak <= row.limit, f"C peak {human(row.c_peak)} > weights + arena + 2 MiB {human(row.limit)}"),
                  (ratio_peak >= 5, f"C peak only {ratio_peak:.1f}x below onnxruntime's process (< 5x)"),
                  (c >= py, f"C fps {c / py:.2f}x the Python executor's (< 1.0x)")]
        if row.label in SPEED_GOAL:
            checks.append((c >= ort, f"C fps {c / ort:.2f}x onnxruntime's (< 1.0x)"))
            if c < ort:
                missed.append(row)
        goals.append((row.label, checks))
    for m, emx in emxs.items():
        if emx.error:
            print(f"emx-onnx-cgen on {m}: {emx.error}")
    print()
    print("Targets (each: outputs match, C peak <= weights + arena + 2 MiB and >= 5x below onnxruntime's, "
          f"C fps >= 1.0x Python's; on the reuse plans of {', '.join(l.split()[0] for l in SPEED_GOAL)} "
          ">= 1.0x onnxruntime's at the same threads):")
    for label, checks in goals:
        print(f"  {label:<24} {verdict(checks)}{load_mark(peak_load) if len(checks) > 1 else ''}")
    return missed


# onnxruntime's op types counted as one kind with the library's layer ops (its NCHWc reorders: layout
# changes the library's channels-last views do not need).
ORT_KINDS = {"Conv": "conv", "FusedConv": "conv", "MaxPool": "pool", "AveragePool": "pool", "GlobalAveragePool": "global pool",
             "GlobalMaxPool": "global pool", "ReduceMean": "global pool", "Gemm": "gemm", "FusedGemm": "gemm", "MatMul": "gemm",
             "Add": "eltwise", "Sum": "eltwise", "Mul": "eltwise", "Sigmoid": "eltwise", "Concat": "concat",
             "ReorderInput": "layout", "ReorderOutput": "layout", "Transpose": "layout"}
OUR_KINDS = {"conv": "conv", "maxpool": "pool", "avgpool": "pool", "global_pool": "global pool",
             "gemm": "gemm", "add": "eltwise", "mul": "eltwise", "eltwise": "eltwise", "concat": "concat", "input": "input",
             "copy": "copy"}


def ort_kind_seconds(onnx: bytes, x: np.ndarray, work: Path, runs: int = 12) -> dict[str, float]:
    """onnxruntime's own profile of `runs` runs on one thread: each node's least kernel time (the
    least is the one other processes on the cores did not stretch), summed per kind."""
    s = ort_session(onnx, 1, str(work / "ort-profile"))
    feed = {s.get_inputs()[0].name: x}
    for _ in range(runs):
        s.run(None, feed)
    per: dict[str, list[float]] = {}
    kinds: dict[str, str] = {}
    for e in json.loads(Path(s.end_profiling()).read_text()):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per.setdefault(e["name"], []).append(e["dur"] * 1e-6)
            op = e.get("args", {}).get("op_name", "?")
            kinds[e["name"]] = ORT_KINDS.get(op, op)
    out: dict[str, float] = {}
    for name, times in per.items():
        out[kinds[name]] = out.get(kinds[name], 0.0) + min(times[1:] or times)
    return out


def our_kind_seconds(row: Row, repeats: int = 9) -> dict[str, float]:
    """The library's steps each run alone in an arena of its own (as the cost model profiles them),
    on one thread: each step's least CPU time over `repeats` runs of a few copies, summed per kind."""
    out: dict[str, float] = {}
    for p in row.plan.partitions:
        g = row.graphs[p.model]
        for s in p.steps:
            call = _bind_alone(row.plan, row.graphs, s).runs(4)
            call()
            best = float("inf")
            for _ in range(repeats):
                t0 = time.thread_time()
                call()
                best = min(best, (time.thread_time() - t0) / 4)
            kind = OUR_KINDS.get(g.layers[s.layer].op if s.kind == "compute" else s.kind, s.kind)
            out[kind] = out.get(kind, 0.0) + best
    return out


def print_speed_reason(row: Row, onnx_path: Path, x, args) -> None:
    """Where a reuse plan below onnxruntime's speed loses its time, measured (see the module's doc)."""
    ms = 1e3
    c, ort = statistics.median(row.c_times), 1 / fps(row.ort_times)
    feed = np.asarray(x[0])
    theirs, ours = ort_kind_seconds(onnx_path.read_bytes(), feed, onnx_path.parent), our_kind_seconds(row)
    parts = sorted(set(ours) | set(theirs), key=lambda k: ours.get(k, 0.0) - theirs.get(k, 0.0), reverse=True)
    print(f"{row.label}: C {c * ms:.2f} ms a run vs onnxruntime {ort * ms:.2f} ms ({args.threads} thread(s)); where "
          f"the time goes on one thread, per op kind, the library's steps one by one ({sum(ours.values()) * ms:.2f} ms "
          f"in all) vs onnxruntime's profile of its nodes ({sum(theirs.values()) * ms:.2f} ms), least times, "
          "+ where C is slower:")
    print("  " + "; ".join(f"{k} {ours.get(k, 0.0) * ms:.2f} vs {theirs.get(k, 0.0) * ms:.2f} "
                           f"({(ours.get(k, 0.0) - theirs.get(k, 0.0)) * ms:+.2f})" for k in parts))
    if args.threads == 1:
        return
    one = run(row.binary, [np.asarray(t) for t in x], [int(np.prod(g.shape(o))) for g in row.graphs for o in g.outputs],
              2 * args.runs + 1, row.weights_file, preload=True).median_seconds
    s1 = ort_session(onnx_path.read_bytes(), 1)
    name = s1.get_inputs()[0].name
    s1.run(None, {name: feed})
    t1 = []
    for _ in range(2 * args.runs + 1):
        t0 = time.perf_counter()
        s1.run(None, {name: feed})
        t1.append(time.perf_counter() - t0)
    print(f"  threads: C {one / c:.2f}x faster at {args.threads} threads than at one ({one * ms:.2f} ms), onnxruntime "
          f"{statistics.median(t1) / ort:.2f}x ({statistics.median(t1) * ms:.2f} ms){loaded()}")


# Issue 39 point 7: a split plan at (at most) 1/8 of its model's reuse arena within this many times
# the reuse plan's time, the exported program's and the executor's (same threads, interleaved rounds).
SPLIT_GOAL = {"parts": 1.15, "tiling": 1.5}
SPLIT_FRACTION = 8


def median_ratio(a: list, b: list) -> float:
    return statistics.median(a) / statistics.median(b) if a and b else float("nan")


def split_checks(row: Row, reuse: Row) -> list[tuple[bool, str]]:
    """Every condition of a split plan's target against its model's reuse row."""
    goal, cap = SPLIT_GOAL[row.method], reuse.arena // SPLIT_FRACTION
    c, py = median_ratio(row.c_times, reuse.c_times), median_ratio(row.py_times, reuse.py_times)
    return [(row.arena <= cap, f"arena {human(row.arena)} > 1/{SPLIT_FRACTION} of the reuse arena"),
            (c <= goal, f"the program {c:.2f}x the reuse plan's time (> {goal:.2f}x)"),
            (py <= goal, f"the executor {py:.2f}x the reuse plan's time (> {goal:.2f}x)")]


def print_split_goals(rows: list[Row], peak_load: float) -> list[tuple[Row, Row]]:
    """The split plans' targets; (row, its reuse row) for those that missed."""
    reuse = {r.model: r for r in rows if r.method == "reuse" and not r.error}
    split = [r for r in rows if r.frac == SPLIT_FRACTION and r.method in SPLIT_GOAL and r.model in reuse]
    if not split:
        return []
    print()
    print(f"Split plans (issue 39 point 7): a plan at 1/{SPLIT_FRACTION} of the reuse arena within "
          + " / ".join(f"{k} {v:.2f}x" for k, v in SPLIT_GOAL.items()) + " the reuse plan's time; time ratios of "
          "the medians over the interleaved rounds, the program's and the executor's")
    head = f"{'plan':<24} {'arena':>10} {f'1/{SPLIT_FRACTION} reuse':>10} {'steps':>6} {'C ratio':>8} {'Py ratio':>8}  target"
    print(head)
    print("-" * len(head))
    missed = []
    for r in split:
        base = reuse[r.model]
        if r.error:
            print(f"{r.label:<24} NO (export, build or run failed: {r.error})")
            continue
        c, py = median_ratio(r.c_times, base.c_times), median_ratio(r.py_times, base.py_times)
        cap = base.arena // SPLIT_FRACTION
        checks = split_checks(r, base)
        steps = sum(len(p.steps) for p in r.plan.partitions)
        print(f"{r.label:<24} {human(r.arena):>10} {human(cap):>10} {steps:>6} {c:8.2f} {py:8.2f}  {verdict(checks)}"
              + load_mark(peak_load))
        if r.arena > cap and r.note:
            print(f"{'':<24} ({r.note}: what the search reached, not a speed)")
        if not all(ok for ok, _ in checks[1:]):
            missed.append((r, base))
    return missed


def plan_macs(row: Row) -> int:
    """Multiply-adds of the plan's compute steps (a tile's or band's halo counted as often as computed)."""
    from tightfit.ops import get_op

    total = 0
    for p in row.plan.partitions:
        g = row.graphs[p.model]
        for s in p.steps:
            if s.kind == "compute":
                layer = g.layers[s.layer]
                total += get_op(layer.op).macs(layer, s.out.region, [g.shape(t) for t in layer.inputs],
                                               g.shape(layer.output))
    return total


def print_split_reason(row: Row, reuse: Row, threads: int) -> None:
    """Where a split plan's extra time goes, measured, as shares of the reuse plan's time (ratios
    hold on a loaded machine, where wall and CPU times differ): the plans' steps each timed alone
    (our_kind_seconds: one thread, least CPU time). Recompute: the reuse plan's steps scaled by
    the multiply-adds the split plan adds (halos computed twice); per step: what its steps alone
    cost beyond that (small bands and tiles run the kernels less efficiently, each call has its
    fixed cost, windows are compacted by copies); the rest: the program's ratio beyond its steps
    alone (the walk of its tables; caches: a step alone runs on warm weights and arena, a band of
    the plan after its neighbours evicted them)."""
    ms = 1e3
    c_s, c_r = statistics.median(row.c_times), statistics.median(reuse.c_times)
    alone_s, alone_r = our_kind_seconds(row), our_kind_seconds(reuse)
    a_s, a_r = sum(alone_s.values()), sum(alone_r.values())
    macs_s, macs_r = plan_macs(row), plan_macs(reuse)
    recompute = a_r * (macs_s / macs_r - 1)
    steps_s, steps_r = (sum(len(p.steps) for p in r.plan.partitions) for r in (row, reuse))
    print(f"{row.label}: the program {c_s / c_r:.2f}x the reuse plan's time ({c_s * ms:.2f} vs {c_r * ms:.2f} ms, "
          f"{threads} thread(s)); {steps_s} steps vs {steps_r}, {macs_s / macs_r - 1:+.1%} multiply-adds. Its steps each "
          f"alone on one thread: {a_s / a_r:.2f}x ({a_s * ms:.2f} vs {a_r * ms:.2f} ms) = recompute "
          f"{recompute / a_r:+.2f}x, per step {(a_s - a_r - recompute) / a_r:+.2f}x "
          f"({(a_s - a_r - recompute) / max(steps_s - steps_r, 1) * 1e6:.1f} us a step added); the rest, in the "
          f"program (its table walk, caches between steps): {c_s / c_r - a_s / a_r:+.2f}x{loaded()}")
    kinds = sorted(set(alone_s) | set(alone_r), key=lambda k: alone_s.get(k, 0.0) - alone_r.get(k, 0.0), reverse=True)
    print("  steps alone per kind, split vs reuse: " + "; ".join(
        f"{k} {alone_s.get(k, 0.0) * ms:.2f} vs {alone_r.get(k, 0.0) * ms:.2f} ({(alone_s.get(k, 0.0) - alone_r.get(k, 0.0)) * ms:+.2f})"
        for k in kinds))


def part2(args, work: Path) -> None:
    print()
    print("Part 2: MAFAT Table 4.1 as a real process (yolov2-16, 608x608; budgets count weights + the whole process)")
    cc = mafat_compiler(args.mafat_cc)
    print(f"C compiler: {cc} ({'musl' if 'musl' in Path(cc).name else 'the system C library'}, static where it links so), "
          f"flags {' '.join(DEFAULT_CFLAGS)}")
    plan, graphs = tightfit.api.plan("yolov2-16")
    cases = [("unconstrained (reuse)", None, plan, graphs)]
    budgets = [int(b) for b in args.mafat_budgets.split(",")]
    folders = args.mafat_plans.split(",") if args.mafat_plans else [None] * len(budgets)
    for budget_mib, folder in zip(budgets, folders):
        path = Path(folder or fit_yolov2_16(budget_mib, work)) / "plan.json"
        if not path.exists():
            print(f"  {budget_mib} MiB: no fitted plan at {path}")
            cases.append((f"{budget_mib} MiB", budget_mib, None, None))
            continue
        p, g = tightfit.api.load_plan(path)
        report = Path(path).with_name("report.json")
        fits = json.loads(report.read_text()).get("fits", True) if report.exists() else True
        cases.append((f"{budget_mib} MiB" + ("" if fits else " (fit: none fits; closest)"), budget_mib, p, g))
    results, glibc = [], {}
    for label, budget_mib, p, g in cases:
        if p is None:
            results.append((label, budget_mib, None))
            continue
        folder = work / f"mafat-{budget_mib or 'reuse'}"
        sources = export(p, g, folder, force=True)
        chk = check_export(p, g, sources, folder, runs=1, cc=cc)
        limited = {kind: prlimit_run(chk, p, g, sources, folder, kind, budget_mib) for kind in ("data", "as")} if budget_mib else {}
        results.append((label, budget_mib, (chk, limited, p, g, sources)))
        if budget_mib and "musl" in Path(cc).name:  # the same program on the system's libc, for comparison
            glibc[label] = check_export(p, g, export(p, g, work / f"mafat-{budget_mib}-cc", force=True),
                                        work / f"mafat-{budget_mib}-cc", runs=1)
        print(f"  {label}: built and run", flush=True)
    # Latencies: every program timed in turn, --rounds rounds, input read whole first (-p).
    times: dict[str, list[float]] = {label: [] for label, _, res in results if res is not None}
    peak_load = load_average()  # the highest 1-minute load sampled while timing (marks the latencies [loaded])
    for _ in range(args.rounds):
        for label, _, res in results:
            if res is not None:
                chk, _, p, g, sources = res
                times[label].append(time_binary(chk, p, g, sources, args.runs))
        peak_load = max(peak_load, load_average())
    seconds = {label: statistics.median(t) for label, t in times.items()}
    base = seconds.get(results[0][0], float("nan"))
    head = (f"{'budget':<34} {'plan':<44} {'weights':>9} {'arena':>9} {'code':>8} {'w+a+code':>9} {'peak':>9} "
            f"{'within':>6} {'prlimit --data':>15} {'prlimit --as':>13} {'s/image':>8} {'ratio':>6} {'MAFAT ratio':>11}")
    print(head)
    print("-" * len(head))
    for label, budget_mib, res in results:
        mafat = MAFAT_MS[budget_mib or 256] / MAFAT_MS[256]
        if res is None:
            print(f"{label:<34} (no plan)")
            continue
        chk, limited, p = res[:3]
        spec = "; ".join(p.knobs.get("techniques", ())) or f"{p.knobs.get('method', '?')} {p.knobs.get('tiling', '')}".strip()
        within = "-" if budget_mib is None else ("yes" if chk.peak_rss <= budget_mib * MiB else "NO")
        total = chk.weight_bytes + chk.arena_bytes + chk.code_bytes
        print(f"{label:<34} {spec[:44]:<44} {human(chk.weight_bytes):>9} {human(chk.arena_bytes):>9} "
              f"{human(chk.code_bytes):>8} {human(total):>9} {human(chk.peak_rss):>9} {within:>6} "
              f"{limited.get('data', '-'):>15} {limited.get('as', '-'):>13} {seconds[label]:8.3f} "
              f"{seconds[label] / base:6.2f} {mafat:11.2f}" + ("" if chk.ok else "  OUTPUTS DIFFER") + load_mark(peak_load))
    print("Targets (each budget: a plan, its C outputs match, its process's peak within the budget, and the binary "
          "under prlimit --data and --as completes with matching outputs):")
    for label, budget_mib, res in results:
        if budget_mib is not None:
            print(f"  {label:<34} {verdict(mafat_checks(budget_mib, res))}")
    for label, other in glibc.items():
        budget_mib = next(b for l, b, _ in results if l == label)
        print(f"{label}: the same plan built with cc (static, the system C library): peak {human(other.peak_rss)} "
              f"(code {human(other.code_bytes)}), {'within' if other.peak_rss <= budget_mib * MiB else 'NOT within'} "
              f"{budget_mib} MiB by {human(abs(budget_mib * MiB - other.peak_rss))}"
              + ("" if other.ok else "  OUTPUTS DIFFER"))
    for label, budget_mib, res in results:
        if res is not None and budget_mib is not None and res[0].peak_rss > budget_mib * MiB:
            chk = res[0]
            print(f"{label}: weights {human(chk.weight_bytes)} + the smallest arena fit reached {human(chk.arena_bytes)} "
                  f"+ the program's own pages {human(chk.peak_rss - chk.weight_bytes - chk.arena_bytes)} "
                  f"= {human(chk.peak_rss)} measured > {budget_mib} MiB")
    print(f"s/image: median over {args.rounds} interleaved rounds of each program's median of {2 * args.runs + 1} runs; "
          "ratio: latency / the unconstrained plan's, both exported and built the same way; MAFAT ratio: "
          "Table 4.1's best measured latency / its 256 MB latency (15065 ms).")
    print("code: the binary's text + data besides the weights (`size`); peak: the program's VmHWM, input streamed by rows; "
          "prlimit: the same binary under `prlimit --data=BUDGET` / `--as=BUDGET`, exit 0 and outputs compared "
          "(RLIMIT_DATA does not count the const weights, read-only pages of the binary; RLIMIT_AS counts every mapping).")


def mafat_checks(budget_mib: int, res) -> list[tuple[bool, str]]:
    """Every condition of a MAFAT budget's target, from part 2's result (None: no plan)."""
    if res is None:
        return [(False, "no fitted plan")]
    chk, limited = res[0], res[1]
    return [(chk.ok, f"C outputs differ (max abs diff {chk.max_abs_diff:.2g})"),
            (chk.peak_rss <= budget_mib * MiB, f"measured peak {human(chk.peak_rss)} > {budget_mib} MiB"),
            *((limited.get(kind) == "ok, match", f"prlimit --{kind}: {limited.get(kind, 'not run')}") for kind in ("data", "as"))]


def time_binary(chk, plan, graphs, sources, runs: int) -> float:
    """Median seconds of 2 * runs + 1 runs in one process (its first run is cold), input read whole first."""
    folder = chk.built.binary.parent
    x = [np.asarray(t) for t in tightfit.api.plan_inputs(graphs, plan)]
    sizes = [int(np.prod(g.shape(o))) for g in graphs for o in g.outputs]
    weights = folder / "weights.bin" if sources.weights_in_file else None
    return run(chk.built.binary, x, sizes, 2 * runs + 1, weights, preload=True).median_seconds


def fit_yolov2_16(budget_mib: int, work: Path) -> Path:
    """`tightfit fit yolov2-16 --with-params` a margin below the budget (the program's code, libc and
    stack); prints fit's own line where it finds nothing."""
    folder = work / f"fit{budget_mib}"
    fit_budget = budget_mib * MiB - FIT_MARGIN
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tightfit.cli", "fit", "yolov2-16", "--budget", str(fit_budget),
                           "--with-params", "--stream-outputs", "--best-effort", "--out", str(folder), "--force", "--json"],
                          capture_output=True, text=True)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        print(f"  {budget_mib} MiB: fit to {human(fit_budget)} (with params) stopped after {took:.0f} s: "
              f"{one_line(done.stderr) or 'exit ' + str(done.returncode)}")
    else:
        print(f"  {budget_mib} MiB: fitted to {human(fit_budget)} (with params) in {took:.0f} s", flush=True)
    return folder


def mafat_compiler(given: str | None) -> str:
    """The C compiler of part 2: the one given, else musl-gcc where installed (a static musl program
    maps about 0.6 MiB less code than a static glibc one: MAFAT's 16 MiB counts the whole process),
    else cc."""
    return given or ("musl-gcc" if shutil.which("musl-gcc") else "cc")


def prlimit_run(chk, plan, graphs, sources, folder: Path, kind: str, budget_mib: int) -> str:
    """The binary under prlimit --KIND=BUDGET: 'ok' (exit 0, outputs match), or why not."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        return "no prlimit"
    x = [np.asarray(t) for t in tightfit.api.plan_inputs(graphs, plan)]
    refs = [np.asarray(run_reference(g, t)[o]) for g, t in zip(graphs, tightfit.api.plan_inputs(graphs, plan)) for o in g.outputs]
    wrapper = folder / f"limited-{kind}"
    wrapper.write_text(f"#!/bin/sh\nexec {prlimit} --{kind}={budget_mib * MiB} {chk.built.binary} \"$@\"\n")
    wrapper.chmod(0o755)
    try:
        ran = run(wrapper, x, [r.size for r in refs], 1, folder / "weights.bin" if sources.weights_in_file else None)
    except Exception as e:  # noqa: BLE001 -- the refusal is the result
        m = re.search(r"status (-?\d+)", str(e))
        code = int(m.group(1)) if m else None
        return f"FAILED ({'SIGSEGV' if code == -11 else f'exit {code}'})"
    from tightfit.verify import compare

    ok = all(compare(o.reshape(r.shape), r).ok for o, r in zip(ran.outputs, refs))
    return "ok, match" if ok else "ok, DIFFER"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", help="models of part 1, comma-separated")
    ap.add_argument("--threads", type=int, default=1, help="part 1's threads: the program's -t, the executor's, "
                    "onnxruntime's intra-op (default 1)")
    ap.add_argument("--skip-emx", action="store_true")
    ap.add_argument("--search", action="store_true", help="plans from the tiling and parts searches at 1/2 and 1/8 of "
                    "the reuse arena instead of the explicit ones (slow: minutes per plan)")
    ap.add_argument("--split-models", help="models of part 1 that also get plans by parts and tiled within 1/8 of "
                    "their reuse arena (the searches' picks; mobilenet_v2 has them always), comma-separated")
    ap.add_argument("--time-limit", type=float, help="seconds of search per plan searched for (--search, "
                    "--split-models; default no limit)")
    ap.add_argument("--skip-part1", action="store_true")
    ap.add_argument("--skip-mafat", action="store_true")
    ap.add_argument("--mafat-budgets", default=",".join(map(str, MAFAT_BUDGETS_MIB)),
                    help="the MiB budgets of part 2, comma-separated (default 64,32,16)")
    ap.add_argument("--mafat-plans", help="folders written by `tightfit fit yolov2-16 --budget B --with-params --out DIR`"
                    " for the --mafat-budgets, comma-separated (default: fit them here, minutes each)")
    ap.add_argument("--mafat-cc", help="the C compiler of part 2 (default musl-gcc where installed, else cc)")
    ap.add_argument("--keep", help="build here instead of a temporary folder")
    args = ap.parse_args()
    set_torch_threads(1)  # one torch thread (the header says so); --threads sets the programs' own
    header("The exported C program beside the Python executor, onnxruntime and emx-onnx-cgen; MAFAT Table 4.1 as a process")
    print(f"C flags: {' '.join(DEFAULT_CFLAGS)} (static); timings: median over {args.rounds} interleaved rounds x {args.runs} runs "
          f"(C: the median of {2 * args.runs + 1} runs in one process per round, its first run cold)")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-export-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if not args.skip_part1:
            part1(args, work)
        if not args.skip_mafat:
            part2(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
