"""The cost model's measuring side: step times measured on this machine with tightfit's own
kernels, kept in a profile. The prediction from them is analysis/predict.py.

Every step of a plan has a key (analysis/predict.step_key). A key is timed once, by binding the
step exactly as the executor does (kernels/step_args.py, kernels/library.py) to views of the same
shapes in an arena of its own and running it through the library's `tf_run`, as the executor does:
the median of several runs, each after the caches are stirred ("stirred": the step's code and
data are in the last-level cache only) and of several runs back to back ("hot"). Times are kept
on disk in a profile whose id names the machine, the kernels' code and flags, and our Python code,
so every planner and search shares one set of measurements. Searches never measure: they read a
frozen snapshot (`CostModel.frozen`), and the command layer measures what they missed
(`measure_missing`, runtime/profiling.py).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import statistics
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from tightfit.analysis.predict import (ARENA_CHUNK, CACHE_BYTES, CODE_KEY, CODE_PROBE_BYTES, CODE_PROBE_SHRINK,
                                      COLD_PROBE_BYTES, Predictor, Profile, Terms, _footprint, _op_kind, step_key)
from tightfit.cache import JournaledTable, is_seconds
from tightfit.graph.ir import Graph
from tightfit.plan.schema import Plan, Step
from tightfit.kernels import library as kernels

if TYPE_CHECKING:
    from tightfit.kernels.step_args import Args

PROFILE_VERSION = 5
SAMPLES = 7
# A step shorter than this is timed as a run of copies of it back to back lasting about this long
# (at most BATCH_MAX copies), which leaves the call and the clock around one step out.
BATCH_SECONDS = 20e-6
BATCH_MAX = 100
# A timing stops after MIN_SAMPLES runs once they took ENOUGH_SECONDS: a step of milliseconds
# varies by little (vgg19's bands spent 10 minutes being profiled at 7 samples), while a hot step of
# microseconds takes up to HOT_SAMPLES, spread over more than one moment of a shared core's load
# (7 of them, taken within 0.2 ms, put mobilenet_v1_025's one-row plan 0-20% high at load 6).
MIN_SAMPLES = 3
HOT_SAMPLES = 51
ENOUGH_SECONDS = 0.01
STIR_BYTES = 4 * 2**20  # several times L2 and well inside L3 on the machines we profile
COLD_BYTE_REPEATS = 7
# The llc_decay probe (`_llc_decay`): its block, its waits, the wait after which the block
# counts as gone, the reads per timing, the share lost beyond which a read says little, and the
# probes of which the median (about 0.3 s each).
DECAY_PROBE_BYTES = 4 * 2**20
DECAY_WAITS = (0.002, 0.004, 0.008)
DECAY_GONE_SECONDS = 0.032
DECAY_SAMPLES = 9
DECAY_GONE_SAMPLES = 5
DECAY_MAX_LOST = 0.95
DECAY_REPEATS = 5


def profile_id() -> str:
    """Names what the measurements depend on: CPU, core count, the kernels' code and flags (one
    thread: the library runs a step on the calling thread)."""
    cpu = platform.processor()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    text = f"{cpu}|{os.cpu_count()}|{PROFILE_VERSION}|{_kernel_code()}"
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _kernel_code() -> str:
    """A digest of the code a step runs (the kernels, their flags, the ops, how steps bind and run):
    changed kernels, new profile."""
    import tightfit.kernels.step_args as step_args
    import tightfit.ops as ops
    import tightfit.runtime.executor as executor

    here = Path(ops.__file__).parent
    files = sorted(here.glob("*.py")) + [Path(executor.__file__), Path(kernels.__file__), Path(step_args.__file__),
                                         Path(__file__)]
    return hashlib.sha1(b"".join(f.read_bytes() for f in files) + kernels.code_digest().encode()).hexdigest()


def default_path() -> Path | None:
    from tightfit.cache import cache_dir

    base = cache_dir()
    return None if base is None else base / "cost" / f"{profile_id()}.json"


class CostModel:
    """Step times of one profile, measured on first need and kept in `path` (None: in memory)."""

    def __init__(self, path: Path | None = None, reprofile: bool = False):
        self.id = profile_id()
        self.path = path
        self.seconds: dict[str, float] = {}
        self.hot_seconds: dict[str, float] = {}  # per step key, its time run back to back
        self.native: set[str] = set()  # the step keys that run on our own kernels
        self.cold: dict[str, float] = {}  # per key of a large step, its seconds per byte fetched from memory
        # On disk: every timing appended as it is measured (a killed search keeps them; processes
        # sharing the profile merge under a lock); a damaged or wrongly shaped file is measured again.
        self._store = None if path is None else JournaledTable(path, _valid_entry)
        self._new: dict[str, dict] = {}  # measured here since the last save
        if self._store is not None and not reprofile:
            for key, entry in self._store.load().items():
                self._take(key, entry)
        self._code_probe_bytes: dict[str, int] = {}  # per code key measured here, its probe's bytes
        # Profiling done through this model: step shapes measured and the seconds it took
        # (reported apart from a search's time, which does not count it).
        self.profiled = 0
        self.profiled_seconds = 0.0

    @classmethod
    def default(cls, reprofile: bool = False) -> "CostModel":
        return cls(default_path(), reprofile)

    @property
    def loop_seconds(self) -> float:
        """The executor's loop overhead per step (a call of a bound step that does nothing)."""
        return self._once("loop", _loop_overhead)

    @property
    def native_call_seconds(self) -> float:
        """The cost of calling tf_run from Python (on no steps): every step runs in the library, a
        partition's steps in one call."""
        return self._once("native_call", _native_call_overhead)

    @property
    def cold_byte_seconds(self) -> float:
        """Seconds per weight byte a convolution takes longer when its weights are not in cache."""
        return self._once("cold_byte", _cold_byte_seconds)

    @property
    def partition_seconds(self) -> float:
        """The executor's cost of running a partition besides its steps (the run's no_grad
        context, the input's checks and patches: 3 us here, 7% of minakova5's run)."""
        return self._once("partition", _partition_overhead)

    @property
    def llc_decay(self) -> float:
        """The chance per second that a line of ours in the last-level cache is lost to other work
        on the host (analysis/predict.cold_fetches)."""
        return self._once("llc_decay", _llc_decay)

    CONSTANT_MEASURES = {"loop": "loop_seconds", "native_call": "native_call_seconds", "cold_byte": "cold_byte_seconds",
                         "partition": "partition_seconds", "llc_decay": "llc_decay"}

    def _once(self, key: str, measure: Callable[[], float]) -> float:
        """A profile constant, measured on first need."""
        if key not in self.seconds:
            with self._profiling():
                self.record(key, measure())
        return self.seconds[key]

    def frozen(self) -> Profile:
        """A read-only snapshot of the profile for a search (later measurements do not change it)."""
        return Profile.frozen(self.id, self.seconds, self.hot_seconds, self.native, self.cold)

    def measure_missing(self, missing: dict) -> int:
        """Measure what a prediction found missing (`Predictor.missing`); the keys measured."""
        for key, how in missing.items():
            if how is None:
                getattr(self, self.CONSTANT_MEASURES[key])
            else:
                self._measure(*how, key)
        self.save()
        return sum(1 for key in missing if key in self.seconds)

    def _live(self) -> Predictor:
        """A prediction over this model's own tables (measured first where they lack a key)."""
        return Predictor(Profile(self.id, self.seconds, self.hot_seconds, self.native, self.cold))

    def plan_seconds(self, plan: Plan, graphs: Sequence[Graph], program: bool = False) -> float:
        """Predicted seconds of one run of the plan (one frame of every partition) on the Python
        executor, or with `program` as the exported program (Predictor.plan_seconds); step shapes
        the profile lacks are measured first."""
        for p in plan.partitions:
            self._measure_steps(plan, graphs, p.steps)
        total = self._live().plan_seconds(plan, graphs, program)
        self.save()
        return total

    def plan_terms(self, plan: Plan, graphs: Sequence[Graph], program: bool = False) -> Terms:
        """`plan_seconds` by its terms (analysis/predict.Terms); step shapes the profile lacks are
        measured first."""
        for p in plan.partitions:
            self._measure_steps(plan, graphs, p.steps)
        terms = self._live().plan_terms(plan, graphs, program)
        self.save()
        return terms

    def steps_seconds(self, plan: Plan, graphs: Sequence[Graph], steps: Sequence[Step]) -> float:
        """Predicted seconds of `steps` run in order, again and again (one run of a stream)."""
        self._measure_steps(plan, graphs, steps)
        return self._live().steps_seconds(plan, graphs, steps)

    def _measure_steps(self, plan: Plan, graphs: Sequence[Graph], steps: Sequence[Step]) -> None:
        for s in steps:
            self._measure(plan, graphs, s, step_key(plan, graphs, s))
        self.loop_seconds, self.native_call_seconds, self.cold_byte_seconds, self.partition_seconds, self.llc_decay  # noqa: B018 (measured on first need)

    def step_seconds(self, plan: Plan, graphs: Sequence[Graph], step: Step) -> float:
        """The step's stirred time (its code and data in the last-level cache only)."""
        key = step_key(plan, graphs, step)
        self._measure(plan, graphs, step, key)
        return self.seconds[key]

    def _measure(self, plan: Plan, graphs: Sequence[Graph], step: Step, key: str) -> None:
        if key not in self.seconds or key not in self.hot_seconds:
            with self._profiling():
                self._profile(plan, graphs, step, key)
            self.profiled += 1

    @contextmanager
    def _profiling(self):
        """Count the seconds spent profiling (once, however nested)."""
        self._depth = getattr(self, "_depth", 0) + 1
        t0 = time.monotonic()
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth:
                self.profiled_seconds += time.monotonic() - t0

    def _profile(self, plan: Plan, graphs: Sequence[Graph], step: Step, key: str) -> None:
        """Time a step shape the profile lacks (stirred, hot, and its op's code if new)."""
        bound = _bind_alone(plan, graphs, step)
        run = bound.runs(1)
        alone_hot, stirred = _median_seconds(run, HOT_SAMPLES, stir_bytes=0), _median_seconds(run)
        hot = self._in_loop_seconds(bound, alone_hot)
        # A stir costs a step the same however it is timed; a single call's timing also carries
        # what the call and the clock cost around it, which the loop's own time replaces.
        entry = {"s": hot + max(0.0, stirred - alone_hot), "h": hot, "n": True}
        touched = _footprint(plan, graphs, step, ARENA_CHUNK)[0]
        if touched >= COLD_PROBE_BYTES:
            # Evicted by a stir of the whole last-level cache, as the cold_byte constant is.
            evicted = _median_seconds(run, stir_bytes=2 * CACHE_BYTES)
            entry["c"] = max(0.0, evicted - stirred) / touched
        self._keep(key, entry)
        code_key = CODE_KEY + _op_kind(graphs, step)
        probed = self._code_probe_bytes.get(code_key, math.inf if code_key not in self.seconds else 0)
        if touched <= CODE_PROBE_BYTES and touched * CODE_PROBE_SHRINK <= probed:
            # Evicted data on a step this small costs little next to evicted code.
            cold = _median_seconds(run, stir_bytes=4 * CACHE_BYTES)
            self.record(code_key, max(0.0, cold - stirred - touched * self.cold_byte_seconds))
            self._code_probe_bytes[code_key] = touched

    def _in_loop_seconds(self, bound: "_Alone", alone: float) -> float:
        """A step's own seconds inside a run of steps, back to back: k copies in one table run by
        one tf_run call (k so that they take BATCH_SECONDS), less the call's overhead, over k. A
        one-step timing carries the call from Python and the clock's reading around it
        (mobilenet_v1_025 by one-row bands: 1-5 us steps timed 0.5-1 us long each)."""
        k = max(1, min(BATCH_MAX, math.ceil(BATCH_SECONDS / max(alone, 1e-9))))
        if k == 1:  # long enough that the lone timing is the step's, but for the call
            return max(0.0, alone - self.native_call_seconds)
        return max(0.0, (_median_seconds(bound.runs(k), HOT_SAMPLES, stir_bytes=0) - self.native_call_seconds) / k)

    def record(self, key: str, seconds: float) -> None:
        """Keep a time measured outside this model (e.g. a whole run), saved with the step times."""
        self._keep(key, {"s": seconds})

    def _keep(self, key: str, entry: dict) -> None:
        """Take a measured entry and save it at once (appended to the profile's journal)."""
        self._take(key, entry)
        self._new.setdefault(key, {}).update(entry)
        if self._store is not None:
            self._store.append(key, entry)

    def _take(self, key: str, entry: dict) -> None:
        if "s" in entry:
            self.seconds[key] = entry["s"]
        if "h" in entry:
            self.hot_seconds[key] = entry["h"]
        if entry.get("n"):
            self.native.add(key)
        if "c" in entry:
            self.cold[key] = entry["c"]

    def save(self) -> None:
        """Fold the journal into the profile file (written whole, atomically), merged under the
        lock with what other processes sharing the profile measured. Every timing is on disk
        already; this keeps the journal short."""
        if self._store is None or not self._new:
            return
        self._store.compact(self._new)
        self._new = {}



class _Alone:
    """One step bound in an arena of its own (random values), run through tf_run."""

    def __init__(self, args: "Args", floats: int, weights: np.ndarray, indices: np.ndarray, x: np.ndarray | None):
        self.args = args
        self.arena = np.random.default_rng(0).standard_normal(max(floats, 1), dtype=np.float32)
        self.weights, self.indices, self.x = weights, indices, x
        self.tensor = None if x is None else kernels.Tensor(x.ctypes.data, *x.shape[1:4], x.itemsize)
        # an input step's source: x, whichever input the step names (one source per index up to it;
        # the step's fields end with that index and the bytes a value)
        # (an output step's sink likewise: x then takes the rows it hands over)
        count = 1 + (int(args.fields[-2]) if args.kind in ("input", "output") else 0)
        self.sources = None if x is None or args.kind == "output" else (kernels.Source * count)(
            *[kernels.Source(kernels.tensor_input(), ctypes.addressof(self.tensor))] * count)
        self.store = None if x is None or args.kind != "output" else kernels.Store(x.ctypes.data, *x.shape[1:4], x.itemsize)
        self.sinks = None if self.store is None else (kernels.Sink * count)(
            *[kernels.Sink(kernels.tensor_store(), ctypes.addressof(self.store))] * count)
        self.tables: dict[int, kernels.StepTable] = {}

    def runs(self, k: int) -> Callable[[], None]:
        """A call of tf_run over k copies of the step."""
        table = self.tables.setdefault(k, kernels.StepTable([self.args] * k))
        run, sources = kernels.library().tf_run, None if self.sources is None else ctypes.addressof(self.sources)
        sinks = None if self.sinks is None else ctypes.addressof(self.sinks)
        pointers = (self.arena.ctypes.data, self.weights.ctypes.data, self.indices.ctypes.data)
        call = functools.partial(run, *pointers, table.address, table.count, sources, sinks, 1)
        call.keep = self  # type: ignore[attr-defined]  # the arena and tables the pointers point into
        return call


def _bind_alone(plan: Plan, graphs: Sequence[Graph], step: Step) -> _Alone:
    """The step with the buffers it touches placed one after another in an arena of their own."""
    from tightfit.kernels.step_args import Context, _dims4, step_args

    at, buffers = 0, list(plan.buffers)
    for a in dict.fromkeys(x.buffer for x in (step.out,) + step.inputs):
        b = buffers[a]
        buffers[a] = replace(b, offsets=(at,) * len(b.offsets))
        at += -(-b.nbytes // 64) * 64
    ctx = Context(replace(plan, buffers=tuple(buffers)), graphs, 0)
    args = step_args(ctx, step)
    x = None
    if step.kind == "input":
        g = graphs[step.model]
        shape = _dims4((plan.models[step.model].batch,) + tuple(g.shape(step.out.tensor)[1:]))
        rng = np.random.default_rng(1)
        x = (rng.integers(-128, 128, shape, dtype=np.int8) if plan.buffers[step.out.buffer].itemsize == 1
             else rng.standard_normal(shape, dtype=np.float32))  # an int8 input's values, as it arrives
    elif step.kind == "output":  # where its rows go: the whole output, outside the arena
        g = graphs[step.model]
        shape = _dims4((plan.models[step.model].batch,) + tuple(g.shape(step.out.tensor)[1:]))
        x = np.zeros(shape, np.int8 if plan.buffers[step.out.buffer].itemsize == 1 else np.float32)
    return _Alone(args, at // 4, ctx.weights.array(), ctx.indices.array(), x)


def _valid_entry(key: str, entry: dict) -> bool:
    """The shape of one profile entry: stirred seconds "s", hot seconds "h", native "n", seconds
    per byte fetched from memory "c"."""
    return (bool(entry) and set(entry) <= {"s", "h", "n", "c"}
            and all(is_seconds(entry[k]) for k in ("s", "h", "c") if k in entry)
            and isinstance(entry.get("n", False), bool))


def _cold_byte_seconds() -> float:
    """Measured on a one-row band of a 512-channel 3x3 convolution (9.4 MB of weights, the
    kind that dominates the effect): its time with the weights evicted minus its time with them
    in cache, per weight byte. Evicted by a stir of the whole last-level cache (twice
    CACHE_BYTES), the least that makes a block cold (more than CACHE_BYTES touched since its last
    use); a stir of twice that costs the band 50% more again (memory pages and their table
    entries evicted too), which put plans by one-row bands through resnet18's, resnet50's and the
    inceptions' large layers 11-17% slow, their weights fetched again every few steps."""
    from tightfit.kernels.step_args import Acts, Args, Code, View

    c = 512
    # Output row 3 of a 7x7 map (input rows 2-4 whole width, padding left and right), channels last.
    x = View(0, (1, c, 3, 7), (3 * 7 * c, 1, 7 * c, c))
    y = View(3 * 7 * c, (1, c, 1, 7), (7 * c, 1, 7 * c, c))
    weights = np.random.default_rng(0).standard_normal(9 * c * c + c, dtype=np.float32)
    args = Args("conv", "tf_conv_args", (x, y, 0, 9 * c * c, Code("CONV", "dense"), 1, 3, 3, 1, 1, 1, 1, 0, 1,
                                         -math.inf, math.inf, Acts(())))
    run = _Alone(args, 4 * 7 * c, weights, np.zeros(1, np.int32), None).runs(1)
    weight_bytes = 9 * c * c * 4
    # The median of COLD_BYTE_REPEATS differences, each of two medians taken one after the other:
    # a single difference moved 2x with a moment's load on the shared last-level cache, and
    # every cold byte of every plan in the profile with it.
    differences = [_median_seconds(run, 21, stir_bytes=2 * CACHE_BYTES) - _median_seconds(run, 21)
                   for _ in range(COLD_BYTE_REPEATS)]
    return max(statistics.median(differences), 0.0) / weight_bytes


def _llc_decay() -> float:
    """How fast other work on the host takes our lines from the last-level cache: a block of
    DECAY_PROBE_BYTES (beyond L2) is read, the core spins touching nothing for a wait, and the
    block is read again. The share of it lost, f = (t - held) / (gone - held), "gone" after
    DECAY_GONE_SECONDS, grows as 1 - exp(-decay x wait) (here, with other tenants on the host:
    20-35% after 2 ms, 30-45% after 4, 50-75% after 8; decay 80-190 per second, some probes 500).
    The slope of -log(1 - f) over DECAY_WAITS leaves out what the spin itself costs the read; the
    median of DECAY_REPEATS slopes. (A stir of the whole cache is no reference: a read after a
    16 ms spin took up to twice as long as one after the stir.)"""
    block = np.ones(DECAY_PROBE_BYTES // 4, np.float32)

    def read_after(wait: float, samples: int = DECAY_SAMPLES) -> float:
        times = []
        for _ in range(samples):
            block.sum()
            _spin(wait)
            times.append(timed(block.sum))
        return statistics.median(times)

    slopes = []
    for _ in range(DECAY_REPEATS):
        held, gone = read_after(0.0), read_after(DECAY_GONE_SECONDS, DECAY_GONE_SAMPLES)
        lost = [min(max((read_after(wait) - held) / max(gone - held, 1e-9), 0.0), DECAY_MAX_LOST) for wait in DECAY_WAITS]
        slopes.append(statistics.linear_regression(DECAY_WAITS, [-math.log1p(-f) for f in lost]).slope)
    return max(statistics.median(slopes), 0.0)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _median_seconds(run: Callable[[], None], samples: int = SAMPLES, stir_bytes: int = STIR_BYTES) -> float:
    """Median of single runs, each after `stir_bytes` are written ("stirred": inside a plan a step
    finds its data in the last-level cache but not in L1/L2, which the steps in between have
    overwritten), or with `stir_bytes` 0 back to back ("hot": a band repeated with little in
    between); `steps_seconds` blends the two."""
    stir = _stir_buffer(stir_bytes) if stir_bytes else None  # none: back-to-back runs ("hot")
    run()  # warm-up: pages touched on the first call, as in a plan's first run
    times: list[float] = []
    while len(times) < samples and (len(times) < MIN_SAMPLES or sum(times) < ENOUGH_SECONDS):
        if stir is not None:
            stir.fill(1.0)
        times.append(timed(run))
    return max(0.0, statistics.median(times))



def timed(run: Callable[[], object]) -> float:
    """Seconds of one call of `run`, as steps and plans are timed. The kernel library runs on the
    calling thread, so the thread's CPU time is the run's own: on a shared
    machine it leaves out the time other processes held the core (a 25 ms plan measured 3x slow
    at load 10 on 2 cores; a profile timed so stayed slow). The CPU clock has no vDSO path (a
    reading costs 0.6 us here, and its empty interval varies by a tenth of that, which hundreds
    of one-row steps add up), so the wall interval is taken when it is the shorter: not
    preempted."""
    wall_empty, cpu_empty = _empty_intervals()
    c0 = time.thread_time()
    w0 = time.perf_counter()
    run()
    w1 = time.perf_counter()
    c1 = time.thread_time()
    return max(0.0, min(w1 - w0 - wall_empty, c1 - c0 - cpu_empty))


@functools.lru_cache(maxsize=None)
def _empty_intervals() -> tuple[float, float]:
    """What `timed` reads on the wall and the CPU clock around nothing (medians)."""
    wall, cpu = [], []
    for _ in range(2001):
        c0 = time.thread_time()
        w0 = time.perf_counter()
        w1 = time.perf_counter()
        c1 = time.thread_time()
        wall.append(w1 - w0)
        cpu.append(c1 - c0)
    return statistics.median(wall), statistics.median(cpu)


_STIR: dict[int, np.ndarray] = {}


def _stir_buffer(nbytes: int) -> np.ndarray:
    if nbytes not in _STIR:
        _STIR[nbytes] = np.empty(nbytes // 4, np.float32)
    return _STIR[nbytes]


def _loop_overhead() -> float:
    """A Python loop's iteration with a call (the predictor's cost of a step run from Python; the
    executor runs none so, its steps all run inside tf_run)."""
    steps = [_nothing] * 1000

    def run() -> None:
        for st in steps:
            st()

    return _median_seconds(run, 21) / len(steps)


def _nothing() -> None:
    pass


def _native_call_overhead() -> float:
    """A call of tf_run from Python on no steps."""
    from tightfit.kernels.step_args import Args

    run = _Alone(Args("copy", "tf_copy_args", ()), 1, np.zeros(1, np.float32), np.zeros(1, np.int32), None).runs(0)
    return _median_seconds(lambda: [run() for _ in range(1000)], 21) / 1000


def _partition_overhead() -> float:
    """A run of an executor whose one partition has no steps, on the path a tensor input takes."""
    from types import SimpleNamespace

    from tightfit.runtime.executor import ArenaExecutor, _Partition

    x = np.empty((1, 1, 1, 1), np.float32)
    ex = ArenaExecutor.__new__(ArenaExecutor)
    ex.plan = SimpleNamespace(partitions=[SimpleNamespace(model=0)])
    ex.lib, ex._tensor_fn = kernels.library(), kernels.tensor_input()
    arena = np.zeros(1, np.float32)
    ex.arena, ex._pointers = arena, (arena.ctypes.data, arena.ctypes.data, arena.ctypes.data)
    ex.frames, ex._outputs = [[_Partition(kernels.StepTable([]), (("x", tuple(x.shape)),), {}, (x.dtype,))]], [[{}]]
    return _median_seconds(lambda: ex.run(x), 201, stir_bytes=0)
