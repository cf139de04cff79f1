"""The prediction: seconds of a plan's steps from a frozen profile of step times (measured by
runtime/cost.py on this machine with tightfit's own kernels). Pure: it reads the profile and
never measures; a step shape the profile lacks is noted (`Predictor.missing`, with a step to
measure it by) and predicted from the kernels' rates (`KernelRates`: seconds per unit of work of
its op, fitted to the shapes the profile holds), so the command layer can measure what a search
needed, as far as its time limit allows, and search again over the completed profile.

Every step of a plan has a key: what it computes or copies and the shapes of the views it reads
and writes (so the same layer settings share one entry, and a border band with its padding is
timed apart from a middle band). The profile holds per key the median "stirred" time (the step's
code and data in the last-level cache only) and the "hot" one (run back to back).

A plan's predicted time walks its steps in order (`Predictor.steps_seconds`):
- each step costs between its hot and its stirred time, by how many bytes the steps since the
  same key last ran have touched (a one-row band repeated 100 times a run finds its code, weights
  and neighbours in L2; a layer run once a run does not); a step on our own kernels, at its hot
  time (it fetches no interpreter or torch code on the way);
- plus the executor's per-step loop overhead (timed too), except that a run of consecutive steps
  on our own kernels (ops/native.py) is one call from Python: each run costs one call (timed;
  a step's own time leaves the loop and the call out);
- plus the time to fetch from memory what the stirred timing found in cache: of the layer's
  weights, the arena bytes it reads and writes and the band of the input, what a cache that
  evicts at random can expect to have lost since they were last used, to the run's own misses
  and to other work on the host over the seconds in between (`cold_fetches`; e.g. resnet18 by
  one-row bands runs each of layer4's 9.4 MB convolutions 7 times with all other layers in
  between; a layer-by-layer plan writes its first activations over arena bytes last used a whole
  run earlier; a classifier read once a run loses its weights to other tenants even where the
  run's blocks fit). Per cold byte, the step's
  own rate where the profile has one (`Profile.cold`: a step touching COLD_PROBE_BYTES or more,
  timed with the whole cache evicted), else the profile's constant: a classifier's
  matrix-vector product streams its weights at memory speed (mobilenet_v2's 5 MB: 180 us
  predicted at a convolution's rate, 400 measured), where a convolution hides most of the fetch
  behind its arithmetic;
- plus, for a step whose op has not run for as long, the time to fetch the op's code and torch's
  data on the way to it (measured once per op: a global pool run once a run takes 50-85 us
  instead of its 13 us alone).
Partitions that run concurrently count as their slowest member.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from math import inf, prod
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from tightfit.graph.ir import Graph
from tightfit.ops import get_op
from tightfit.plan.schema import Plan, Step


def _sysfs_cache_bytes(index: int, default: int) -> int:
    try:
        text = Path(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size").read_text().strip()
        return int(text.rstrip("KMG")) * {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1], 1)
    except (OSError, ValueError):
        return default


# The last-level cache a step can count on: half of it (it is shared with other cores and, on a
# VM, other tenants).
CACHE_BYTES = _sysfs_cache_bytes(3, 32 * 2**20) // 2
# What a run's steps find held of the last-level cache, taken as one that evicts at random (see
# `cold_fetches`). Fitted on bench/predict.py's plans of seven zoo models (35 plans, three
# profiles and timings each): largest error 11.5% at 6 MB of this host's 32 MB (shared with other
# tenants), 12.2% at 8 MB, 18.8% at 4 MB; 14.9% with the least-recently-used 16 MB it replaces.
HELD_BYTES = 3 * CACHE_BYTES // 8
# A key that ran this many bytes ago runs at its stirred time; nearer, it finds part of its code
# and data still in L2 (twice L2: half of what an L2-sized stir writes still evicts).
WARM_BYTES = 2 * _sysfs_cache_bytes(2, 2**20)
# A block used again within this many bytes touched is still in L2 (private to the core and
# least recently used): it cannot miss.
NEAR_BYTES = _sysfs_cache_bytes(2, 2**20)
# The fixed point's rounds (each a pass over the run's accesses) and the change that ends them.
MISS_ROUNDS = 100
MISS_TOLERANCE = 1e-4
# The profile constants (measured once per profile by runtime/cost.py).
CONSTANTS = ("loop", "native_call", "cold_byte", "partition", "llc_decay")
# The kernels' rates before anything is measured (an empty profile), per unit of work: a
# multiply-add of a convolution or matrix product, an element of any other step. This host's
# library runs mobilenet_v2 at about 30 GMAC/s on one thread; elementwise steps move about 1
# element a nanosecond.
DEFAULT_MAC_SECONDS = 1 / 20e9
DEFAULT_ELEMENT_SECONDS = 1e-9


@dataclass(frozen=True)
class Profile:
    """Step times of one profile, read-only: per key its stirred and hot seconds, the keys that
    run on our own kernels, the constants (CONSTANTS) and the code keys (CODE_KEY) in `seconds`;
    per key of a large step, the seconds per byte it fetches from memory (`cold`)."""

    id: str
    seconds: Mapping[str, float] = field(default_factory=dict)
    hot: Mapping[str, float] = field(default_factory=dict)
    native: frozenset[str] = frozenset()
    cold: Mapping[str, float] = field(default_factory=dict)

    @staticmethod
    def frozen(id: str, seconds: Mapping[str, float], hot: Mapping[str, float], native,
               cold: Mapping[str, float]) -> "Profile":
        """A snapshot that later measurements do not change."""
        return Profile(id, MappingProxyType(dict(seconds)), MappingProxyType(dict(hot)), frozenset(native),
                       MappingProxyType(dict(cold)))


def step_work(key: str) -> tuple[str, int]:
    """(the family of a step key: its op, or its kind for a step that computes nothing; its work:
    multiply-adds where its first parameter is a weight it multiplies by, e.g. a convolution's
    (out, in/groups, kh, kw) or a matrix product's, else output elements), read off the key."""
    fields = json.loads(key)
    compute = len(fields) == 7
    out_view = fields[4] if compute else fields[1]
    shape, (n, h, w) = out_view[0], out_view[2]
    pixels = max(n * h * w, 1)
    elements = pixels * (shape[1] if len(shape) > 1 else 1)
    params = fields[2] if compute else []
    if params and len(params[0]) >= 2:
        return fields[0], max(pixels * prod(params[0]), elements)
    return fields[0], elements


def _is_step_key(key: str) -> bool:
    """Whether a profile key is a step's (its output view a list where step_work reads it)."""
    if not key.startswith("["):
        return False
    fields = json.loads(key)
    view = fields[4] if len(fields) == 7 else fields[1] if len(fields) > 1 else None
    return isinstance(view, list)


class KernelRates:
    """Seconds per unit of work (`step_work`) of each step family, the median over the shapes of
    that family a profile holds (less the per-step loop): what a step shape not measured yet is
    predicted at. A family the profile has no shape of takes the median of all families of its
    kind (computing or not); an empty profile the DEFAULT_* rates."""

    def __init__(self, profile: Profile):
        loop = profile.seconds.get("loop", 0.0)
        per_family: dict[str, list[float]] = {}
        per_kind: dict[bool, list[float]] = {True: [], False: []}
        for key, seconds in profile.seconds.items():
            if not _is_step_key(key):
                continue  # a constant, an op's code, or a VBS calibration's runs (vbs_calibration)
            family, work = step_work(key)
            rate = max(seconds - loop, 0.0) / work
            per_family.setdefault(family, []).append(rate)
            per_kind[len(json.loads(key)) == 7].append(rate)
        self.loop = loop
        self.family = {f: float(np.median(r)) for f, r in per_family.items()}
        self.kind = {k: float(np.median(r)) if r else (DEFAULT_MAC_SECONDS if k else DEFAULT_ELEMENT_SECONDS)
                     for k, r in per_kind.items()}

    def seconds(self, key: str) -> float:
        family, work = step_work(key)
        rate = self.family.get(family)
        if rate is None:
            rate = self.kind[len(json.loads(key)) == 7]
        return self.loop + rate * work


@dataclass(frozen=True)
class Terms:
    """A prediction by its terms, in seconds: the steps' own times (between hot and stirred), the
    fetch from memory of what the cache lost (`cold_fetches`), the ops' code fetched again, and the
    executor's calls (its loop, its ctypes calls of tf_run and its Python per partition; none for
    the exported program)."""

    steps: float
    fetch: float
    code: float
    calls: float

    @property
    def total(self) -> float:
        return self.steps + self.calls + self.fetch + self.code  # steps_seconds' order of old: the same bits


class Predictor:
    """`plan_seconds(plan, graphs)` and its parts, over one profile. A key the profile lacks is
    noted in `missing` (key -> (plan, graphs, step) to measure it by; a constant -> None) with
    how often it was asked for (`asked`), and is predicted from the kernels' rates (a constant:
    0); `complete` says whether every prediction so far had all it needed."""

    def __init__(self, profile: Profile):
        self.profile = profile
        self.id = profile.id
        self.missing: dict[str, tuple[Plan, Sequence[Graph], Step] | None] = {}
        self.asked: dict[str, int] = {}
        self._rates: KernelRates | None = None
        self._estimates: dict[str, float] = {}

    def estimate(self, key: str) -> float:
        """A missing step key's seconds from the kernels' rates."""
        if key not in self._estimates:
            self._rates = self._rates or KernelRates(self.profile)
            self._estimates[key] = self._rates.seconds(key)
        return self._estimates[key]

    @property
    def complete(self) -> bool:
        return not self.missing

    def _constant(self, key: str) -> float:
        if key not in self.profile.seconds:
            self.missing.setdefault(key, None)
            return 0.0
        return self.profile.seconds[key]

    @property
    def loop_seconds(self) -> float:
        """The executor's loop overhead per step (a call of a bound step that does nothing)."""
        return self._constant("loop")

    @property
    def native_call_seconds(self) -> float:
        """The cost of calling a run of native steps from Python (a run of none)."""
        return self._constant("native_call")

    @property
    def cold_byte_seconds(self) -> float:
        """Seconds per weight byte a convolution takes longer when its weights are not in cache."""
        return self._constant("cold_byte")

    @property
    def partition_seconds(self) -> float:
        """The executor's cost of running a partition besides its steps."""
        return self._constant("partition")

    @property
    def llc_decay(self) -> float:
        """The chance per second that a line of ours in the last-level cache is lost to other work
        on the host (none on a host of our own)."""
        return self._constant("llc_decay")

    def plan_seconds(self, plan: Plan, graphs: Sequence[Graph], program: bool = False) -> float:
        """Predicted seconds of one run of the plan (one frame of every partition) on the Python
        executor, or with `program` as the exported program: the same steps in the same tf_run
        calls, made from C, so without the executor's Python around each partition (its
        `partition_seconds`) and its ctypes call of tf_run (`native_call_seconds`): 4-8 us a run
        here, a tenth or more of minakova5's 40 us."""
        per_part = [self.steps_seconds(plan, graphs, p.steps, program) for p in plan.partitions]
        together = {i for c in plan.concurrent for i in c}
        total = sum(t for i, t in enumerate(per_part) if i not in together)
        total += sum(max(per_part[i] for i in c) for c in plan.concurrent)
        return total + (0.0 if program else len(plan.partitions) * self.partition_seconds)

    def plan_terms(self, plan: Plan, graphs: Sequence[Graph], program: bool = False) -> "Terms":
        """`plan_seconds` by its terms (`Terms`, adding up to it but for rounding): where a
        prediction that misses went wrong."""
        per_part = [self.steps_terms(plan, graphs, p.steps, program) for p in plan.partitions]
        together = {i for c in plan.concurrent for i in c}
        parts = [t for i, t in enumerate(per_part) if i not in together]
        parts += [max((per_part[i] for i in c), key=lambda t: t.total) for c in plan.concurrent]
        calls = 0.0 if program else len(plan.partitions) * self.partition_seconds
        return Terms(*(sum(getattr(t, f) for t in parts) for f in ("steps", "fetch", "code")),
                     sum(t.calls for t in parts) + calls)

    def _known(self, plan: Plan, graphs: Sequence[Graph], step: Step, key: str) -> bool:
        p = self.profile
        if key in p.seconds and key in p.hot:
            return True
        self.missing.setdefault(key, (plan, graphs, step))
        self.asked[key] = self.asked.get(key, 0) + 1
        return False

    def steps_seconds(self, plan: Plan, graphs: Sequence[Graph], steps: Sequence[Step], program: bool = False) -> float:
        """Predicted seconds of `steps` run in order, again and again (one run of a stream); with
        `program`, called from C (no executor's calls, see `plan_seconds`)."""
        return self.steps_terms(plan, graphs, steps, program).total

    def steps_terms(self, plan: Plan, graphs: Sequence[Graph], steps: Sequence[Step], program: bool = False) -> "Terms":
        """`steps_seconds` by its terms."""
        p = self.profile
        keys = [step_key(plan, graphs, s) for s in steps]
        known = [self._known(plan, graphs, s, k) for k, s in zip(keys, steps)]
        prints = footprints(plan, graphs, steps)
        since = bytes_since_same_key(keys, [touched for touched, _ in prints])
        # A step on our own kernels runs at its hot time: it fetches no interpreter or torch code
        # and data on the way (mobilenet_v2 by one-row bands: 4.9 ms predicted so, 5.8 blended
        # by the bytes since, 4.7 measured); what its data fetches from memory is `cold` below.
        warm = [p.hot[k] + (0.0 if k in p.native else (p.seconds[k] - p.hot[k]) * min(1.0, d / WARM_BYTES)) if ok
                else self.estimate(k) for k, d, ok in zip(keys, since, known)]
        cold, cold_code = cold_fetches(prints, seconds=warm, decay=self.llc_decay)
        rate = self.cold_byte_seconds
        fetch = sum(c * p.cold.get(k, rate) for k, c in zip(keys, cold))
        code = sum(chance * p.seconds.get(CODE_KEY + op, 0.0) for op, chance in filter(None, cold_code))
        # Every step runs on the kernel library; one not measured yet, too.
        calls = 0.0 if program else self._call_seconds([k in p.native or not ok for k, ok in zip(keys, known)])
        return Terms(sum(warm), fetch, code, calls)

    def _call_seconds(self, native: Sequence[bool]) -> float:
        """The executor's calls of the steps (`native`: which run on our own kernels): a loop
        iteration per other step, one call per run of native steps (a step's own time leaves
        both out: runtime/cost.py times it among copies of itself)."""
        runs = sum(1 for i, n in enumerate(native) if n and (i == 0 or not native[i - 1]))
        return (len(native) - sum(native)) * self.loop_seconds + runs * self.native_call_seconds

    def step_seconds(self, plan: Plan, graphs: Sequence[Graph], step: Step) -> float:
        """The step's stirred time (its code and data in the last-level cache only)."""
        key = step_key(plan, graphs, step)
        return self.profile.seconds[key] if self._known(plan, graphs, step, key) else self.estimate(key)


def step_key(plan: Plan, graphs: Sequence[Graph], step: Step) -> str:
    """What a step's time depends on: the op and its settings, parameter shapes, and for every
    view the buffer block it lies in and the region (with border padding) it covers."""
    def view(a) -> list:
        b = plan.buffers[a.buffer]
        r = a.region
        return [list(b.shape), b.layout, [r.n, r.h, r.w]]

    if step.kind != "compute":
        # A shift within one buffer runs in chunks of the shift's size.
        same = bool(step.inputs) and step.inputs[0].buffer == step.out.buffer
        shift = [a - b for a, b in zip(step.inputs[0].at, step.out.at)] if same else 0
        return json.dumps([step.kind, view(step.out), [view(a) for a in step.inputs], shift])
    g = graphs[step.model]
    layer = g.layers[step.layer]
    batch = plan.models[step.model].batch
    in_shapes = [(batch,) + g.shape(t)[1:] for t in layer.inputs]
    windows = get_op(layer.op).input_windows(layer, step.out.region, in_shapes)
    return json.dumps([layer.op, repr(sorted(layer.attrs.items())), [list(g.params[p].shape) for p in layer.params],
                       in_shapes, view(step.out), [view(a) for a in step.inputs],
                       [[w.region.n, w.region.h, w.region.w, list(w.pad)] for w in windows]])


Footprint = tuple[int, list[tuple[tuple, float]]]


def bytes_since_same_key(keys: Sequence[str], touched: Sequence[int]) -> list[int]:
    """Per step (its key and the bytes it touches), the bytes touched by the steps since the
    previous step of the same key, in this run or the previous one."""
    last: dict[str, int] = {}
    total, since = 0, [0] * len(keys)
    for round_ in range(2):  # the first round only finds each key's last step in the previous run
        for i, key in enumerate(keys):
            if round_:
                since[i] = total - last[key]
            total += touched[i]
            last[key] = total
    return since


def cold_fetches(prints: Sequence[Footprint], cache_bytes: int = HELD_BYTES, seconds: Sequence[float] = (),
                 decay: float = 0.0) -> tuple[list[float], list[tuple[str, float] | None]]:
    """Per step (its `footprints`), the bytes it can expect to read or write from memory although
    its stirred timing found them in cache, and (its op kind, the chance the op's code was evicted).

    The cache is taken as one that evicts a line at random per miss, in its steady state over
    runs of the steps: a block (a layer's weights, a chunk of the arena or of the model input, an
    op's code) is still held at its next use with chance exp(-M / cache_bytes), M the bytes
    missed in between, in this run or the previous one; so misses make misses, and a run whose
    blocks all fit misses none of its own. Unlike a least-recently-used cache of the same size, a
    block written by the step just before can miss once the run's blocks exceed the cache
    (mobilenet_v2 layer by layer: a depthwise layer reading the 4.8 MB its expansion has just
    written, 183 us with only the layers before it run, 370 in a whole run, 665 from memory).
    Other work on the host evicts too: with `seconds` (per step, its time) and `decay` (the
    profile's "llc_decay", per second), a block is also lost with chance 1 - exp(-decay x the
    seconds in between) (onnxzoo-shufflenet's classifier, 2 MB read once a 6 ms run of 6 MB of
    blocks: 49 us back to back, 224 after a 6 ms spin that touches nothing, 350 in the run)."""
    step_of, block_of, nbytes, code_blocks = _accesses(prints)
    sizes = np.zeros(int(block_of.max(initial=-1)) + 1)
    np.maximum.at(sizes, block_of, nbytes)
    overflows = sizes.sum() > cache_bytes
    aged = None
    if decay > 0.0 and len(seconds) and len(step_of):
        aged = np.zeros(len(nbytes))
        first = np.r_[True, step_of[1:] != step_of[:-1]]
        aged[first] = decay * np.asarray(seconds, dtype=np.float64)[step_of[first]]  # a step's time, at its first access
    if overflows or aged is not None:
        missed = _steady_misses(block_of, nbytes, cache_bytes if overflows else inf, aged)
    else:
        missed = np.zeros(len(nbytes))
    cold = np.bincount(step_of, weights=missed * nbytes, minlength=len(prints))
    code: list[tuple[str, float] | None] = [None] * len(prints)
    for a, op in code_blocks:
        if missed[a] > 0.0:
            code[step_of[a]] = (op, float(missed[a]))
    return cold.tolist(), code


def _accesses(prints: Sequence[Footprint]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, str]]]:
    """The steps' block accesses in order: step, block number, bytes; and (access, op) of code."""
    index: dict[tuple, int] = {}
    step_of, block_of, nbytes, code = [], [], [], []
    for i, (_, blocks) in enumerate(prints):
        for block, n in blocks:
            if block[0] == "code":
                code.append((len(nbytes), block[1]))
            step_of.append(i)
            block_of.append(index.setdefault(block, len(index)))
            nbytes.append(n)
    return (np.array(step_of, dtype=np.int64), np.array(block_of, dtype=np.int64),
            np.array(nbytes, dtype=np.float64), code)


def _steady_misses(block_of: np.ndarray, nbytes: np.ndarray, cache_bytes: float, aged: np.ndarray | None) -> np.ndarray:
    """Per access, the chance it misses: the fixed point of miss = 1 - exp(-M / cache_bytes - A),
    A the sum of `aged` (per access, decay x seconds) since the block's previous access, reached
    from all misses (each round can only lower M, so the misses fall to it)."""
    n = len(block_of)
    order = np.argsort(block_of, kind="stable")
    group_start = np.r_[True, block_of[order][1:] != block_of[order][:-1]]
    starts = np.flatnonzero(group_start)
    ends = np.r_[starts[1:], n] - 1
    previous_sorted = np.roll(order, 1)
    previous_sorted[starts] = order[ends]  # a block's first use follows its last in the run before
    previous = np.empty(n, dtype=np.int64)
    previous[order] = previous_sorted
    here = np.arange(n)
    wraps = previous >= here

    def since_previous(per_access: np.ndarray) -> np.ndarray:
        """Per access, the sum of `per_access` over the accesses since its block's previous one."""
        before = np.r_[0.0, np.cumsum(per_access)]
        return before[here] - before[previous + 1] + np.where(wraps, before[-1], 0.0)

    near = since_previous(nbytes) < NEAR_BYTES
    lost = 0.0 if aged is None else since_previous(aged)
    missed = np.ones(n)
    for _ in range(MISS_ROUNDS):
        updated = np.where(near, 0.0, -np.expm1(-since_previous(missed * nbytes) / cache_bytes - lost))
        done = np.abs(updated - missed).max() < MISS_TOLERANCE
        missed = updated
        if done:
            break
    return missed


# Profile keys of the seconds a step of an op takes longer when the op's code was evicted, measured
# on a step of the op that touches at most CODE_PROBE_BYTES, again on one that touches a
# CODE_PROBE_SHRINK-th as much: what is left after the data's fetch at the cold_byte rate is
# taken off, the less data the truer (inception_v3's convolutions: 213 us from a whole layer of
# its layer-by-layer plan, profiled first, 9 us from a band; its band plans 15% slow or 1%).
CODE_KEY = "code:"
CODE_PROBE_BYTES = 2**20
CODE_PROBE_SHRINK = 4
# A step touching this much or more has its own rate of seconds per byte fetched from memory.
COLD_PROBE_BYTES = 2**20
ARENA_CHUNK = 64 * 2**10  # the reuse walk follows the arena in chunks of at least this size
MAX_CHUNKS = 1024  # and at most this many (a 500 MB arena in chunks of 0.5 MB)


def footprints(plan: Plan, graphs: Sequence[Graph], steps: Sequence[Step]) -> list[Footprint]:
    """Per step, the bytes it touches (views and weights) and what it reads and writes as
    (block, bytes in it); its op's code (and the interpreter's and torch's data on the way to it)
    counts as a block of no bytes."""
    chunk = max(ARENA_CHUNK, plan.arena_bytes // MAX_CHUNKS)
    return [_footprint(plan, graphs, s, chunk) for s in steps]


def _footprint(plan: Plan, graphs: Sequence[Graph], step: Step, chunk: int) -> Footprint:
    blocks: list[tuple[tuple, float]] = [(("code", _op_kind(graphs, step)), 0.0)]
    w = _weight_bytes(graphs, step)
    if w:  # a convolution's weights are packed once per input shape (ops/conv.PackedWeights)
        shapes = tuple((a.region.n, a.region.h, a.region.w) for a in step.inputs)
        blocks.append((("weights", step.model, step.layer, shapes), w))
    touched = w
    for a in (step.out,) + step.inputs:
        nbytes = _view_bytes(plan, a)
        touched += nbytes
        blocks += _chunked(("arena",), *_arena_span(plan, a), nbytes, chunk)
    if step.kind == "input":  # the band of the model input it reads (rows of that input tensor)
        g = graphs[step.model]
        shape = g.shape(step.out.tensor)
        row = prod(shape[1:]) * plan.buffers[step.out.buffer].itemsize // (shape[2] if len(shape) == 4 else 1)
        r = step.out.region
        blocks += _chunked(("input", step.model, step.out.tensor), r.h0 * row, r.h1 * row, _view_bytes(plan, step.out), chunk)
    return touched, blocks


def _chunked(space: tuple, first: int, end: int, nbytes: int, chunk: int) -> list[tuple[tuple, float]]:
    ids = range(first // chunk, max(first, end - 1) // chunk + 1)
    return [(space + (c,), nbytes / len(ids)) for c in ids]


def _arena_span(plan: Plan, a) -> tuple[int, int]:
    """The arena bytes from an access's first element to past its last (frame copy 0)."""
    b = plan.buffers[a.buffer]
    r, (n, h, w) = a.region, a.at
    if len(b.shape) == 4 and b.layout == "nhwc":
        _, c, hh, ww = b.shape
        first = ((n * hh + h) * ww + w) * c
        end = (((n + r.n - 1) * hh + h + r.h - 1) * ww + w + r.w) * c
    elif len(b.shape) == 4:
        _, c, hh, ww = b.shape
        first = (n * c * hh + h) * ww + w
        end = (((n + r.n - 1) * c + c - 1) * hh + h + r.h - 1) * ww + w + r.w
    else:
        row = prod(b.shape[1:])
        first, end = n * row, (n + r.n) * row
    return b.offsets[0] + first * b.itemsize, b.offsets[0] + end * b.itemsize


def _op_kind(graphs: Sequence[Graph], step: Step) -> str:
    return graphs[step.model].layers[step.layer].op if step.kind == "compute" else step.kind


def _weight_bytes(graphs: Sequence[Graph], step: Step) -> int:
    if step.kind != "compute":
        return 0
    g = graphs[step.model]
    return sum(g.params[p].nbytes for p in g.layers[step.layer].params)


def _view_bytes(plan: Plan, a) -> int:
    b = plan.buffers[a.buffer]
    return a.region.numel(b.shape) * b.itemsize
