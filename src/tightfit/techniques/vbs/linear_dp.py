"""Variable batch size across layers (Choudhury et al., Sec. III): the dynamic program over a
linear network. A pure function of per-layer profiles; what it returns is a schedule of
(layer, sub-batch) steps, the per-layer profile of the paper's Fig. 9.

OPT[i, j, b, m]: least time per sample to take b samples from the input of layer i to the output
of layer j, every layer with batches of at most b, in at most m memory units (inputs of i and
outputs of j included). OPTExact: the same with some layer run on all b samples at once.

    OPTExact[i, j, b, m] = min_k OPT[i, k-1, b, m] + OPTExact[k, k, b, m] + OPT[k+1, j, b, m]   (1)
    OPT[i, j, b, m] = 1/b min_b1 b1 OPTExact[i, j, b1, m - in(i, b-b1)]
                                 + (b-b1) OPT[i, j, b-b1, m - out(j, b1)]                     (2)
    OPTExact[i, i, b, m] = time(i, b) if in(i, b) + out(i, b) + ws(i, b) <= m, else inf       (3)

Layers are numbered from 0 here; the paper's from 1. Tables are numpy arrays over the memory
axis, so each recurrence is a few vector operations per (i, j, b).

`solve` counts memory as the paper does (samples freed one at a time; its worked example);
`solve_plans` counts it as plans hold buffers (see there), which is what graph_dp.py uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

INF = float("inf")


@dataclass(frozen=True)
class LinearProfile:
    """Per layer i and batch size b = 1..B (index b; index 0 unused): time per sample, and the
    input, output and workspace memory in whole memory units."""

    time: np.ndarray  # (n, B + 1) seconds per sample
    inp: np.ndarray  # (n, B + 1) units
    out: np.ndarray
    ws: np.ndarray

    @property
    def layers(self) -> int:
        return self.time.shape[0]

    @property
    def max_batch(self) -> int:
        return self.time.shape[1] - 1


@dataclass(frozen=True)
class Tables:
    """OPT and OPTExact for every i <= j (index [i, j, b, m]); OPT[i, i-1] = 0 is implicit."""

    profile: LinearProfile
    memory: int
    opt: np.ndarray
    exact: np.ndarray
    best_b1: np.ndarray  # argmin of (2)
    best_k: np.ndarray  # argmin of (1)

    def opt_at(self, i: int, j: int, b: int, m: int) -> float:
        if i > j or b == 0:
            return 0.0 if m >= 0 else INF
        return float(self.opt[i, j, b, m]) if 0 <= m <= self.memory else INF

    def exact_at(self, i: int, j: int, b: int, m: int) -> float:
        return float(self.exact[i, j, b, m]) if 0 <= m <= self.memory else INF

    @cached_property
    def per_sample(self) -> float:
        """The answer for the whole network and the largest batch."""
        return self.opt_at(0, self.profile.layers - 1, self.profile.max_batch, self.memory)


def solve(profile: LinearProfile, memory: int, latency: float | None = None) -> Tables:
    """Fill both tables by increasing j - i, as Algorithm 1 does. With a `latency` bound
    (seconds), an OPTExact entry whose b samples take longer than it from layer i to layer j is
    infinite (the paper's extension of recurrence (1))."""
    n, big_b = profile.layers, profile.max_batch
    mems = np.arange(memory + 1)
    shape = (n, n, big_b + 1, memory + 1)
    opt, exact = np.full(shape, INF), np.full(shape, INF)
    best_b1 = np.zeros(shape, dtype=np.int16)
    best_k = np.zeros(shape, dtype=np.int16)
    for i in range(n):
        for b in range(1, big_b + 1):
            need = profile.inp[i, b] + profile.out[i, b] + profile.ws[i, b]
            exact[i, i, b] = np.where(mems >= need, profile.time[i, b], INF)
    for d in range(n):
        for i in range(n - d):
            j = i + d
            for b in range(1, big_b + 1):
                if d > 0:
                    _fill_exact(opt, exact, best_k, i, j, b)
                _cap_latency(exact[i, j, b], b, latency)
                _fill_opt(profile, opt, exact, best_b1, i, j, b)
    return Tables(profile, memory, opt, exact, best_b1, best_k)


def _cap_latency(row: np.ndarray, b: int, latency: float | None) -> None:
    if latency is not None:
        row[row * b > latency] = INF


def _fill_exact(opt, exact, best_k, i: int, j: int, b: int) -> None:
    """Recurrence (1): layer k takes all b samples; the layers before and after it may not."""
    best = np.full(exact.shape[3], INF)
    arg = np.zeros(exact.shape[3], dtype=np.int16)
    for k in range(i, j + 1):
        before = opt[i, k - 1, b] if k > i else 0.0
        after = opt[k + 1, j, b] if k < j else 0.0
        total = before + exact[k, k, b] + after
        better = total < best
        best = np.where(better, total, best)
        arg = np.where(better, k, arg)
    exact[i, j, b], best_k[i, j, b] = best, arg


def _fill_opt(profile: LinearProfile, opt, exact, best_b1, i: int, j: int, b: int, reserve: bool = True) -> None:
    """Recurrence (2): b1 samples go through layers i..j first (at exactly b1), the other b - b1
    wait at layer i's input; then those go through while the first b1 wait at layer j's output."""
    m = exact.shape[3]
    best = np.full(m, INF)
    arg = np.zeros(m, dtype=np.int16)
    for b1 in range(1, b + 1):
        rest = b - b1
        first = b1 * _shifted(exact[i, j, b1], profile.inp[i, rest] if rest and reserve else 0)
        second = rest * _shifted(opt[i, j, rest], profile.out[j, b1] if reserve else 0) if rest else 0.0
        total = (first + second) / b
        better = total < best
        best = np.where(better, total, best)
        arg = np.where(better, b1, arg)
    opt[i, j, b], best_b1[i, j, b] = best, arg


def _shifted(row: np.ndarray, units: int) -> np.ndarray:
    """row[m - units] for every m (inf where m - units < 0)."""
    units = int(units)
    if units <= 0:
        return row
    out = np.full_like(row, INF)
    if units < len(row):
        out[units:] = row[: len(row) - units]
    return out


# --- the same recurrences counting memory as plans hold it ------------------------------------
#
# A plan keeps each tensor's samples in buffers placed once in an arena: the b samples a pivot
# layer reads (or writes) at once are one buffer, alive while the layers before it fill it (or
# the layers after it empty it); samples are not freed one at a time. So, for plans:
#   - (1) reserves the pivot's input buffer, in(k, b), while the part before it runs split
#     (OPT), and its output buffer, out(k, b), while the part after it runs split; a part run
#     uniformly at b (every layer once, ALL) holds only each step's own input and output, exactly;
#   - (2) reserves nothing: the input and output of the segment are buffers of the caller;
#   - the pivot's own step needs its input and output unless the caller holds them, plus what
#     `base` says (a layer: nothing more, its scratch lives outside the arena; the model's first
#     layer: its input chunk, loaded just before it; a special layer: its branches, then its
#     join's output only when the join runs).
# The held memory a table entry counts is never less than what the plan made from it holds.


@dataclass(frozen=True)
class PlanTables:
    """Tables of the plans accounting: opt/exact as above, all_in/all_out the uniform runs whose
    last (all_out: before a pivot) or first (all_in: after a pivot) tensor the step counts."""

    profile: LinearProfile
    memory: int
    base: np.ndarray  # (n, B + 1, memory + 1): per-sample seconds of a pivot step with m left
    base_out: np.ndarray  # the same when the step must also hold its output buffer
    opt: np.ndarray
    exact: np.ndarray
    all_out: np.ndarray
    all_in: np.ndarray
    best_b1: np.ndarray
    best_k: np.ndarray
    uniform_before: np.ndarray  # the part before the pivot runs uniformly (else split)
    uniform_after: np.ndarray

    def opt_at(self, i: int, j: int, b: int, m: int) -> float:
        return float(self.opt[i, j, b, m]) if 0 <= m <= self.memory else INF


def layer_base(profile: LinearProfile, memory: int, first_input: bool = True) -> np.ndarray:
    """Pivot steps of plain layers: time per sample whenever there is room for the model's input
    chunk (the first layer, with `first_input`) or unconditionally (inputs and outputs are
    counted by the tables)."""
    n, big_b = profile.layers, profile.max_batch
    base = np.full((n, big_b + 1, memory + 1), INF)
    for k in range(n):
        for b in range(1, big_b + 1):
            need = int(profile.inp[k, b]) if (k == 0 and first_input) else 0
            base[k, b, need:] = profile.time[k, b]
    return base


def solve_plans(profile: LinearProfile, memory: int, base: np.ndarray | None = None,
                latency: float | None = None, base_out: np.ndarray | None = None) -> PlanTables:
    """Recurrences (1) and (2) in the plans accounting, by increasing j - i. `base_out[k]`
    (default: `base[k]` shifted by out(k, b)) is the pivot step when it holds its output too; a
    special layer allocates its join's output only when the join runs, after its branches."""
    n, big_b = profile.layers, profile.max_batch
    base = layer_base(profile, memory) if base is None else base
    if base_out is None:
        base_out = np.stack([np.stack([_shifted(base[k, b], profile.out[k, b]) for b in range(big_b + 1)])
                             for k in range(n)])
    shape = (n, n, big_b + 1, memory + 1)
    t = PlanTables(profile, memory, base, base_out, np.full(shape, INF), np.full(shape, INF), np.full(shape, INF),
                   np.full(shape, INF), np.zeros(shape, np.int16), np.zeros(shape, np.int16),
                   np.zeros(shape, bool), np.zeros(shape, bool))
    for b in range(1, big_b + 1):
        _fill_uniform(t, b)
    for d in range(n):
        for i in range(n - d):
            j = i + d
            for b in range(1, big_b + 1):
                _fill_exact_plans(t, i, j, b)
                _cap_latency(t.exact[i, j, b], b, latency)
                _fill_opt(profile, t.opt, t.exact, t.best_b1, i, j, b, reserve=False)
    return t


def _in_need(p: LinearProfile, k: int, b: int, count_in: bool) -> int:
    return int(p.inp[k, b]) if count_in else 0


def _pivot(t: PlanTables, k: int, b: int, count_in: bool, count_out: bool) -> np.ndarray:
    """Per-sample seconds of unit k's step at b for every memory left around it, when it holds
    its input buffer (`count_in`) and its output buffer (`count_out`) itself."""
    return _shifted((t.base_out if count_out else t.base)[k, b], _in_need(t.profile, k, b, count_in))


def _fill_uniform(t: PlanTables, b: int) -> None:
    """Every layer of i..j once at b. all_out[i, j]: the step of j counts its output (a pivot
    after it holds that buffer); all_in[i, j]: the step of i counts its input."""
    p, n = t.profile, t.profile.layers
    for i in range(n):
        # acc_*: the layers i..j-1 of a run that goes on past j-1 (each counts its output).
        acc_out = _pivot(t, i, b, False, True)
        acc_in = _pivot(t, i, b, True, True)
        t.all_out[i, i, b] = acc_out
        t.all_in[i, i, b] = _pivot(t, i, b, True, False)
        for j in range(i + 1, n):
            mid = _pivot(t, j, b, True, True)
            t.all_out[i, j, b] = acc_out + mid
            t.all_in[i, j, b] = acc_in + _pivot(t, j, b, True, False)
            acc_out, acc_in = acc_out + mid, acc_in + mid


def _fill_exact_plans(t: PlanTables, i: int, j: int, b: int) -> None:
    p = t.profile
    m = t.memory + 1
    best, arg = np.full(m, INF), np.zeros(m, np.int16)
    arg_before, arg_after = np.zeros(m, bool), np.zeros(m, bool)
    for k in range(i, j + 1):
        before, uni_b = np.zeros(m), np.zeros(m, bool)
        if k > i:
            split = _shifted(t.opt[i, k - 1, b], p.inp[k, b])
            uni = t.all_out[i, k - 1, b]
            uni_b = uni <= split
            before = np.minimum(uni, split)
        after, uni_a = np.zeros(m), np.zeros(m, bool)
        if k < j:
            split = _shifted(t.opt[k + 1, j, b], p.out[k, b])
            uni = t.all_in[k + 1, j, b]
            uni_a = uni <= split
            after = np.minimum(uni, split)
        pivot = _pivot(t, k, b, k > i, k < j)
        total = before + pivot + after
        better = total < best
        best = np.where(better, total, best)
        arg = np.where(better, k, arg)
        arg_before = np.where(better, uni_b, arg_before)
        arg_after = np.where(better, uni_a, arg_after)
    t.exact[i, j, b], t.best_k[i, j, b] = best, arg
    t.uniform_before[i, j, b], t.uniform_after[i, j, b] = arg_before, arg_after


@dataclass(frozen=True)
class PivotStep:
    """Unit `unit` runs `batch` samples at once with `memory` units left around the buffers it
    reads (what a special layer's branches may use)."""

    unit: int
    batch: int
    memory: int


def plans_schedule(t: PlanTables, batch: int, memory: int) -> list[PivotStep]:
    """The optimal order for `batch` samples through all units within `memory` units ([] if
    none); the caller holds the model output."""
    if t.opt_at(0, t.profile.layers - 1, batch, memory) == INF:
        return []
    out: list[PivotStep] = []
    _plans_opt(t, 0, t.profile.layers - 1, batch, memory, out)
    return out


def _plans_opt(t: PlanTables, i: int, j: int, b: int, m: int, out: list) -> None:
    while b > 0:
        b1 = int(t.best_b1[i, j, b, m])
        _plans_exact(t, i, j, b1, m, out)
        b -= b1


def _plans_exact(t: PlanTables, i: int, j: int, b: int, m: int, out: list) -> None:
    p = t.profile
    k = int(t.best_k[i, j, b, m])
    if k > i:
        if t.uniform_before[i, j, b, m]:
            out.extend(PivotStep(u, b, m - _in_need(p, u, b, u > i)) for u in range(i, k))
        else:
            _plans_opt(t, i, k - 1, b, m - int(p.inp[k, b]), out)
    out.append(PivotStep(k, b, m - _in_need(p, k, b, k > i)))
    if k < j:
        if t.uniform_after[i, j, b, m]:
            out.extend(PivotStep(u, b, m - _in_need(p, u, b, True)) for u in range(k + 1, j + 1))
        else:
            _plans_opt(t, k + 1, j, b, m - int(p.out[k, b]), out)


@dataclass(frozen=True)
class Step:
    """Run `layer` on `batch` samples."""

    layer: int
    batch: int


def schedule(tables: Tables, batch: int | None = None) -> list[Step]:
    """The optimal execution order for `batch` samples (default the largest) through the whole
    network, following the recorded choices of (1) and (2)."""
    b = tables.profile.max_batch if batch is None else batch
    if tables.opt_at(0, tables.profile.layers - 1, b, tables.memory) == INF:
        return []
    out: list[Step] = []
    _opt_steps(tables, 0, tables.profile.layers - 1, b, tables.memory, out)
    return out


def _opt_steps(t: Tables, i: int, j: int, b: int, m: int, out: list[Step]) -> None:
    if i > j or b == 0:
        return
    b1 = int(t.best_b1[i, j, b, m])
    rest = b - b1
    _exact_steps(t, i, j, b1, m - (int(t.profile.inp[i, rest]) if rest else 0), out)
    _opt_steps(t, i, j, rest, m - int(t.profile.out[j, b1]), out)


def _exact_steps(t: Tables, i: int, j: int, b: int, m: int, out: list[Step]) -> None:
    k = i if i == j else int(t.best_k[i, j, b, m])
    _opt_steps(t, i, k - 1, b, m, out)
    out.append(Step(k, b))
    _opt_steps(t, k + 1, j, b, m, out)


def fixed_batch(profile: LinearProfile, memory: int, request: int) -> tuple[int, float]:
    """FBS: the largest uniform batch b that fits, and its time per sample. The request runs in
    chunks of b samples (the last one shorter) through every layer; as in the DP, memory holds
    the inputs still waiting and the outputs already done. (0, inf) if no batch fits."""
    n = profile.layers
    for b in range(min(request, profile.max_batch), 0, -1):
        chunks = [b] * (request // b) + ([request % b] if request % b else [])
        done, total, fits = 0, 0.0, True
        for c in chunks:
            held = profile.inp[0, request - done - c] + profile.out[n - 1, done]
            if any(held + profile.inp[i, c] + profile.out[i, c] + profile.ws[i, c] > memory for i in range(n)):
                fits = False
                break
            total += sum(c * profile.time[i, c] for i in range(n))
            done += c
        if fits:
            return b, total / request
    return 0, INF


def greedy_vbs(profile: LinearProfile, memory: int, request: int) -> tuple[list[int], float]:
    """Greedy-VBS: layer after layer over all `request` samples, each with the largest batch that
    fits while the inputs and outputs of all the samples are held; ([], inf) if some layer
    cannot run at all."""
    batches, total = [], 0.0
    for i in range(profile.layers):
        fits = [b for b in range(1, min(request, profile.max_batch) + 1)
                if profile.inp[i, request] + profile.out[i, request] + profile.ws[i, b] <= memory]
        if not fits:
            return [], INF
        b = max(fits)
        full, rest = divmod(request, b)
        total += full * b * profile.time[i, b] + (rest * profile.time[i, rest] if rest else 0.0)
        batches.append(b)
    return batches, total / request


def linear_chain(graph) -> list[int] | None:
    """Layer ids in order when every layer reads only the previous layer's output (the graph's
    input for the first); None for a graph with branches."""
    prev = graph.inputs[0]
    chain = []
    for layer in graph.layers:
        if list(layer.inputs) != [prev]:
            return None
        chain.append(layer.id)
        prev = layer.output
    return chain


def linear_profile(graph, max_batch: int, unit_bytes: int, layer_seconds, dtype: str = "fp32") -> LinearProfile:
    """The DP's profiles of a linear graph: in, out and ws from the analyser's own accounting
    (so the DP and the plan made from it agree about memory), rounded up to whole units (the
    paper's granularity; rounding up never lets a step exceed its budget); time per sample from
    `layer_seconds(layer_id, batch)`, the time of one step running `batch` samples."""
    from tightfit.analysis.memory import layer_workspace
    from tightfit.errors import OptionError

    chain = linear_chain(graph)
    if chain is None:
        raise OptionError(f"{graph.name}: the linear dynamic program needs a graph without branches")
    n = len(chain)
    shape = (n, max_batch + 1)
    time, inp, out, ws = np.full(shape, INF), np.zeros(shape, int), np.zeros(shape, int), np.zeros(shape, int)
    units = lambda nbytes: -(-int(nbytes) // unit_bytes)  # noqa: E731
    for i, lid in enumerate(chain):
        layer = graph.layers[lid]
        for b in range(1, max_batch + 1):
            inp[i, b] = units(graph.tensors[layer.inputs[0]].nbytes(dtype, b))
            out[i, b] = units(graph.tensors[layer.output].nbytes(dtype, b))
            ws[i, b] = units(layer_workspace(graph, lid, dtype, batch=b))
            time[i, b] = layer_seconds(lid, b) / b
    return LinearProfile(time, inp, out, ws)
