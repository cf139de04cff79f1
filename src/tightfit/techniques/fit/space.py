"""fit's space: the application, one CNN's genome and the plans it decodes to (memoised), the
candidates the techniques offered, and one application plan merged from every CNN's plan."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from tightfit.graph.ir import Graph, spatial
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import _fifo_copies
from tightfit.plan.schema import Buffer, Partition, Plan, Step
from tightfit.techniques.interface import SEARCH_PLANNER, Point, run_memory

MAX_GROUPS = 8
# A CNN this large (DenseNet-121: 250 layers; the zoo's next is 124) takes about a second per plan
# to build and time (finest parts: ~6,700 steps), so by default it is searched quickly: its layer
# seeds are reuse only and parts everywhere (one alignment), its tiling source searches grids up to
# techniques/tiling's QUICK_GRID_LIMIT over QUICK_CUTS cuts, the parts search is left out (the
# parts-everywhere seed stands for it), and the genetic search does not run. `thorough` searches
# it as any other.
QUICK_LAYERS = 160
HEAD = 4  # genes before the groups: technique, order, align, source

# One evaluated application plan: its genome (Point.genes), run memory (+ parameters when the
# budget bounds them), predicted seconds and what it runs, per CNN.
FitPoint = Point


@dataclass(frozen=True)
class Candidate:
    """A one-model plan a technique source offers for one CNN (model index 0, one partition)."""

    technique: str
    label: str
    build: Callable[[], Plan]
    # The source's smallest plan, found by its memory side (no time looked at): the same under
    # any cost profile, so it may seed the search's memory side.
    exact: bool = False


@dataclass(frozen=True)
class FitApp:
    """CNNs, their partitions (model, layer ids) in run order, and the partitions that run at the
    same time (pipeline sets of partition ids)."""

    models: tuple[PlannedModel, ...]
    names: tuple[str, ...]
    partitions: tuple[tuple[int, tuple[int, ...]], ...]
    concurrent: tuple[tuple[int, ...], ...] = ()

    @staticmethod
    def single(model: PlannedModel, name: str | None = None) -> "FitApp":
        return FitApp((model,), (name or model.spec,), ((0, tuple(range(len(model.graph.layers)))),))

    @property
    def graphs(self) -> list[Graph]:
        return [m.graph for m in self.models]


# --- one CNN's space ----------------------------------------------------------------------------

def _log2_top(h: int) -> int:
    """The largest gene that still changes phases for h rows: 2^gene >= h first at this gene."""
    return max(0, math.ceil(math.log2(h))) if h > 1 else 0


@dataclass
class CNNSpace:
    """The genome of one CNN and the plans it decodes to (memoised)."""

    index: int
    model: PlannedModel
    partitions: tuple[tuple[int, ...], ...]  # this CNN's partitions' layers, app order
    pids: tuple[int, ...]  # their partition ids in the application
    local_concurrent: tuple[tuple[int, ...], ...]  # pipeline sets in local partition indices
    groups: tuple[tuple[int, ...], ...]
    source_top: int
    candidates: tuple[Candidate, ...] = ()
    layout: str = "nhwc"
    dtype: str = "fp32"
    quick: bool = False  # searched quickly (QUICK_LAYERS)
    stream_outputs: bool = False  # parts plans hand the outputs over by rows (PartsOptions.stream_outputs)
    _plans: dict = field(default_factory=dict)
    _memory: dict = field(default_factory=dict)
    planned_steps: int = 0

    @property
    def width(self) -> int:
        return HEAD + len(self.groups)

    def upper(self) -> list[int]:
        g = self.model.graph
        tops = [max(_log2_top(spatial(g.shape(g.layers[l].output))[0]) for l in grp) for grp in self.groups]
        return [len(self.candidates), 1, 1, self.source_top] + tops

    def decode(self, genes: Sequence[int]) -> tuple:
        """A canonical key: genomes that give the same plan give the same key."""
        technique, order, align, source, *levels = (int(v) for v in genes)
        if technique > 0:
            return ("candidate", technique)
        g = self.model.graph
        phases = {}
        for grp, level in zip(self.groups, levels):
            for l in grp:
                p = min(2 ** level, spatial(g.shape(g.layers[l].output))[0])
                if p > 1:
                    phases[l] = p
        src = min(2 ** source, spatial(g.shape(g.inputs[0]))[0])
        if not phases and src == 1:
            return ("whole", ("imported", "memory")[order])
        return ("parts", tuple(sorted(phases.items())), src, bool(align))

    def label(self, key: tuple) -> str:
        if key[0] == "candidate":
            return self.candidates[key[1] - 1].label
        if key[0] == "whole":
            return f"layer by layer, {key[1]} order"
        return f"by parts: {len(key[1])} layers split, input in {key[2]} bands" + (", aligned rows" if key[3] else "")

    def plan(self, key: tuple) -> Plan:
        """This CNN's plan: model index 0, its steps split into its partitions."""
        if key not in self._plans:
            self._plans[key] = split_partitions(self._one_partition(key), self.model.graph, self.partitions,
                                                self.local_concurrent)
            self.planned_steps += sum(len(p.steps) for p in self._plans[key].partitions)
        return self._plans[key]

    def memory(self, key: tuple) -> int:
        """Run memory of this CNN's plan alone."""
        if key not in self._memory:
            self._memory[key] = run_memory(self.plan(key), [self.model.graph])
        return self._memory[key]

    def _one_partition(self, key: tuple) -> Plan:
        from tightfit.techniques.parts.planner import PartsOptions, draft_parts
        from tightfit.techniques.reuse.planner import plan_reuse

        if key[0] == "candidate":
            return self.candidates[key[1] - 1].build()
        if key[0] == "whole":
            return plan_reuse(self.model, SEARCH_PLANNER, key[1], self.layout, self.dtype)
        return draft_parts(self.model, dict(key[1]), key[2], self.layout, self.dtype,
                           PartsOptions(align=key[3], stream_outputs=self.stream_outputs))


def _groups(g: Graph, layers: Sequence[int], max_groups: int) -> tuple[tuple[int, ...], ...]:
    """One group per layer if few; else runs of layers with the same output rows, adjacent runs
    merged (the smallest pair first) down to `max_groups`, or the longest run cut after its
    smallest output up to `max_groups` (a whole group after a split one then starts from a
    small tensor: the split layers' windows die there and their memory is reused)."""
    if len(layers) <= max_groups:
        return tuple((l,) for l in layers)
    rows = lambda l: spatial(g.shape(g.layers[l].output))[0]  # noqa: E731
    runs: list[list[int]] = []
    for l in layers:
        if runs and rows(runs[-1][-1]) == rows(l):
            runs[-1].append(l)
        else:
            runs.append([l])
    while len(runs) > max_groups:
        i = min(range(len(runs) - 1), key=lambda i: len(runs[i]) + len(runs[i + 1]))
        runs[i:i + 2] = [runs[i] + runs[i + 1]]
    while len(runs) < max_groups:
        i = max(range(len(runs)), key=lambda i: len(runs[i]))
        run = runs[i]
        if len(run) < 4:
            break
        cut = min(range(1, len(run) - 1), key=lambda k: (g.tensors[g.layers[run[k]].output].nbytes(), -k)) + 1
        runs[i:i + 1] = [run[:cut], run[cut:]]
    return tuple(tuple(r) for r in runs)


def _fixed_whole(g: Graph, partitions: Sequence[Sequence[int]]) -> tuple[set[int], bool]:
    """Layers that must stay whole because a tensor they write or read crosses partitions, and
    whether an input crosses (then the inputs arrive whole)."""
    if len(partitions) < 2:
        return set(), False
    part_of = {l: i for i, p in enumerate(partitions) for l in p}
    producer = {l.output: l.id for l in g.layers}
    fixed: set[int] = set()
    for layer in g.layers:
        for t in layer.inputs:
            if t in producer and part_of[producer[t]] != part_of[layer.id]:
                fixed.update((producer[t], layer.id))
    return fixed, any(len({part_of[l.id] for l in g.consumers(t)}) > 1 for t in g.inputs)


def cnn_spaces(app: FitApp, max_groups: int = MAX_GROUPS, layout: str = "nhwc", dtype: str = "fp32",
               thorough: bool = False, stream_outputs: bool = False) -> list[CNNSpace]:
    from tightfit.techniques.parts.phase_search import splittable_layers

    spaces = []
    for m, model in enumerate(app.models):
        g = model.graph
        pids = tuple(i for i, (mm, _) in enumerate(app.partitions) if mm == m)
        parts = tuple(tuple(app.partitions[i][1]) for i in pids)
        local = tuple(tuple(pids.index(i) for i in c if i in pids) for c in app.concurrent)
        local = tuple(c for c in local if len(c) > 1)
        fixed, input_crosses = _fixed_whole(g, parts)
        layers = [l for l in splittable_layers(g) if l not in fixed]
        source_top = 0 if input_crosses else _log2_top(spatial(g.shape(g.inputs[0]))[0])
        spaces.append(CNNSpace(m, model, parts, pids, local, _groups(g, layers, max_groups), source_top,
                               layout=layout, dtype=dtype, quick=not thorough and len(g.layers) >= QUICK_LAYERS,
                               stream_outputs=stream_outputs))
    return spaces


def split_partitions(plan: Plan, g: Graph, partitions: Sequence[Sequence[int]],
                     concurrent: Sequence[Sequence[int]] = ()) -> Plan:
    """A one-partition plan's steps distributed over `partitions` (layer ids), each keeping its
    order: a compute step goes with its layer, a copy with the tensor's producer, the input
    with its first consumer. Valid when every tensor crossing partitions is written whole
    before it is read (the fit genome keeps the layers next to crossing tensors whole)."""
    if len(partitions) == 1:
        return replace(plan, partitions=(replace(plan.partitions[0], layers=tuple(partitions[0])),))
    part_of = {l: i for i, p in enumerate(partitions) for l in p}
    producer = {l.output: l.id for l in g.layers}
    first_use = {t: min(part_of[l.id] for l in g.consumers(t)) for t in g.inputs if g.consumers(t)}
    per: list[list[Step]] = [[] for _ in partitions]
    for s in plan.steps():
        if s.kind == "compute":
            k = part_of[s.layer]
        else:
            k = part_of[producer[s.out.tensor]] if s.out.tensor in producer else first_use[s.out.tensor]
        per[k].append(s)
    parts = tuple(Partition(i, 0, tuple(l for l in plan.partitions[0].layers if part_of[l] == i), tuple(steps))
                  for i, steps in enumerate(per))
    return replace(plan, partitions=parts, concurrent=tuple(tuple(c) for c in concurrent))


def merge(app: FitApp, plans: Sequence[Plan]) -> Plan:
    """One application plan from every CNN's plan: buffers renumbered, steps and partitions
    given their model and application ids, FIFO copies for buffers two concurrent partitions
    share; offsets not placed yet."""
    buffers: list[Buffer] = []
    slots: list[tuple[int, Partition]] = []  # (application partition id, partition)
    knobs = []
    for m, plan in enumerate(plans):
        base = len(buffers)
        buffers.extend(replace(b, id=b.id + base, offsets=(0,), overlay=None if b.overlay is None else
                               (b.overlay[0] + base, b.overlay[1])) for b in plan.buffers)
        pids = [i for i, (mm, _) in enumerate(app.partitions) if mm == m]
        for pid, p in zip(pids, plan.partitions):
            steps = p.steps if base == 0 and all(s.model == m for s in p.steps) else tuple(
                replace(s, model=m, out=replace(s.out, buffer=s.out.buffer + base),
                        inputs=tuple(replace(a, buffer=a.buffer + base) for a in s.inputs)) for s in p.steps)
            slots.append((pid, Partition(pid, m, p.layers, steps)))
        knobs.append(dict(plan.knobs))
    parts = tuple(p for _, p in sorted(slots, key=lambda s: s[0]))
    copies = _fifo_copies(parts, app.concurrent, len(buffers))
    # Overlays are for plans whose steps run one after another (the checker's simulation is
    # sequential): with concurrent partitions they are dropped (more memory, still correct).
    buffers = [replace(b, offsets=(0,) * c, overlay=b.overlay if not app.concurrent else None) for b, c in zip(buffers, copies)]
    dtype = plans[0].dtype
    return Plan(tuple(m.ref() for m in app.models), dtype, tuple(buffers), parts,
                tuple(tuple(c) for c in app.concurrent), 0, {"method": "fit", "cnns": knobs})
