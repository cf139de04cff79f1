"""Threads (issue 39 point 7): the exported program and the Python executor at 1 and 2 threads beside
onnxruntime at 1 and 2 intra-op threads, on reuse plans.

    .venv/bin/python bench/threads.py [--models mobilenet_v2,...] [--rounds 3] [--runs 5] [--threads 1,2]

Per model: its reuse plan, exported (weights.bin) and built with the check's default flags
(-std=c99 -O3 -march=native -ffp-contract=fast, static), timed with the input read whole first
(`-p`; `-t N` for N threads); tightfit's arena executor on the same plan (`threads=N`: tf_run
shares each convolution's output rows among N threads); onnxruntime on the same ONNX bytes
(`verify.onnx_bytes_for`), N intra-op threads, one inter-op thread, sequential. Timed interleaved:
every round times every variant `--runs` times; the median over all rounds is printed. Outputs are
checked first: every thread count gives the same bits as one thread (C and executor), and one
thread matches onnxruntime within the export check's tolerance. The machine's load average is
printed before and after: on a shared machine, threads compete with other work, and the figures
say so rather than hide it. So is the round trip of a cache line between the first two cores
(two threads passing a counter back and forth), before and after: on a virtual machine the host
may run its two cores in one core complex (about 50 ns on the EPYC measured) or in two (about 330
ns), and a shared step's data moves between the threads' caches ten times slower in the second
placement, which changes over time: 2-thread figures are comparable only at the same placement.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from benchlib import header, load_average, load_mark, verdict  # noqa: E402

import tightfit  # noqa: E402
from tightfit.api import plan_inputs  # noqa: E402
from tightfit.export import export  # noqa: E402
from tightfit.export.build import build, run  # noqa: E402
from tightfit.runtime.executor import ArenaExecutor  # noqa: E402
from tightfit.tolerance import compare  # noqa: E402
from tightfit.verify import onnx_bytes_for  # noqa: E402


def ort_session(onnx: bytes, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(onnx, opts, providers=["CPUExecutionProvider"])


def prepare(model: str, threads: list[int], work: Path) -> dict:
    """Every variant of `model` as a callable timing `k` runs; the outputs checked first."""
    plan, graphs = tightfit.api.plan(model, method="reuse")
    x = plan_inputs(graphs, plan)[0]
    sources = export(plan, graphs, work / model, weights="file")
    binary, weights = build(work / model, sources.name).binary, work / model / "weights.bin"
    shape = graphs[0].shape(graphs[0].inputs[0])
    onnx = onnx_bytes_for(model, shape)
    variants, outs = {}, {}
    for t in threads:
        ex = ArenaExecutor(plan, graphs, threads=t)
        sess = ort_session(onnx, t)
        feed = {sess.get_inputs()[0].name: x}
        outs[("py", t)] = next(iter(ex.run(x)[0].values())).copy()
        ref_size = outs[("py", t)].size
        outs[("c", t)] = run(binary, [x], [ref_size], 1, weights, preload=True, threads=t).outputs[0]
        outs[("ort", t)] = sess.run(None, feed)[0]
        variants[f"C {t}t"] = lambda k, t=t: [run(binary, [x], [ref_size], k, weights, preload=True, threads=t).median_seconds]
        variants[f"Python {t}t"] = lambda k, ex=ex: _timed(lambda: ex.run(x), k)
        variants[f"ORT {t}t"] = lambda k, sess=sess, feed=feed: _timed(lambda: sess.run(None, feed), k)
    _check(model, outs, threads)
    return variants


def _check(model: str, outs: dict, threads: list[int]) -> None:
    one = threads[0]
    for kind in ("c", "py"):
        for t in threads[1:]:
            if not np.array_equal(outs[(kind, t)].reshape(-1), outs[(kind, one)].reshape(-1)):
                raise SystemExit(f"{model}: {kind} at {t} threads differs from {one} thread")
    for kind in ("c", "py"):
        c = compare(outs[(kind, one)].reshape(outs[("ort", one)].shape), outs[("ort", one)])
        if not c.ok:
            raise SystemExit(f"{model}: {kind} differs from onnxruntime (max abs diff {c.max_abs_diff:.3g})")
    print(f"  {model}: outputs checked (same bits at every thread count; onnxruntime within tolerance)", flush=True)


ROUND_TRIP_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>
static volatile long flag;
enum { N = 2000 };
static void pin(int cpu) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
static void *other(void *arg) {
    (void)arg; pin(1);
    for (long i = 0; i < N; i++) { while (__atomic_load_n(&flag, __ATOMIC_ACQUIRE) != 2 * i + 1) {} __atomic_store_n(&flag, 2 * i + 2, __ATOMIC_RELEASE); }
    return NULL;
}
int main(void) {
    pthread_t t; struct timespec a, b;
    pthread_create(&t, NULL, other, NULL); pin(0);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < N; i++) { __atomic_store_n(&flag, 2 * i + 1, __ATOMIC_RELEASE); while (__atomic_load_n(&flag, __ATOMIC_ACQUIRE) != 2 * i + 2) {} }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, NULL);
    printf("%.0f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / N);
    return 0;
}
"""


def round_trip(work: Path) -> str:
    """The round trip of a cache line between cores 0 and 1 (ns, the median of 5), or why not measured."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return "not measured (no C compiler)"
    src, exe = work / "round_trip.c", work / "round_trip"
    src.write_text(ROUND_TRIP_C)
    built = subprocess.run([cc, "-O2", "-pthread", "-o", str(exe), str(src)], capture_output=True, text=True)
    if built.returncode != 0:
        return "not measured (did not build)"
    times = []
    for _ in range(5):
        try:
            done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=10)
            times.append(float(done.stdout))
        except (subprocess.TimeoutExpired, ValueError):
            return "not measured (the two cores were busy)"
    return f"{statistics.median(times):.0f} ns"


def _timed(fn, k: int) -> list[float]:
    times = []
    for _ in range(k):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mobilenet_v2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", default="1,2")
    args = p.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    header("threads: the exported program and the executor beside onnxruntime (issue 39 point 7)")
    peak = load_average()
    with tempfile.TemporaryDirectory(prefix="tightfit-threads-") as tmp:
        print(f"core-to-core round trip at start: {round_trip(Path(tmp))} (about 50: one core complex; 300 or more: two)")
        variants = {m: prepare(m, threads, Path(tmp)) for m in args.models.split(",")}
        times: dict = {(m, v): [] for m, vs in variants.items() for v in vs}
        for _ in range(args.rounds):
            for m, vs in variants.items():
                for v, fn in vs.items():
                    times[(m, v)] += fn(args.runs)
                    peak = max(peak, load_average())
        print(f"core-to-core round trip at end: {round_trip(Path(tmp))}")
    print(f"\nmedian fps over {args.rounds} interleaved rounds of {args.runs} runs (C: the program's own median per "
          f"round){load_mark(peak)}")
    print("model | variant | fps | vs ORT at the same threads | vs itself at 1 thread")
    for (m, v), ts in times.items():
        fps = 1 / statistics.median(ts)
        kind, t = v.split()
        ort = 1 / statistics.median(times[(m, f"ORT {t}")])
        own = 1 / statistics.median(times[(m, f"{kind} {threads[0]}t")])
        print(f"{m} | {v} | {fps:.1f} | {fps / ort:.2f}x | {fps / own:.2f}x")
    for m in variants:
        for t in threads[1:]:
            c, o = (statistics.median(times[(m, f"{k} {t}t")]) for k in ("C", "ORT"))
            print(f"{m} at {t} threads: the program >= 1.0x onnxruntime: "
                  + verdict([(o / c >= 1.0, f"{o / c:.2f}x")]) + load_mark(peak))
    return 0


if __name__ == "__main__":
    sys.exit(main())
