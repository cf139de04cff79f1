"""The plan: one format for every technique (DESIGN.md).

A plan is ordered steps per partition plus buffers placed in one arena. A step computes one region
of one layer's output (or copies a region between buffers, or loads a region of the model input),
and names, for its output and each input, the buffer and the buffer coordinates where that region
lives. So a buffer's index map (whole tensor, H-window used as a ring or shifted, tile, sample
range) is explicit in the accesses, and the executor needs to know none of the planners.

How a plan splits N and H (and W): a step's `region` is a box over (N, H, W) of the layer's output.
A buffer's `shape` is the logical block it stores, (n, C, h, w): a whole tensor has the tensor's
shape; a window of rows has h < H; a tile has h < H and w < W; a sample range has n < N. Any
combination is allowed: e.g. b samples of a window of rows is a block (b, C, rows, W).

The two splits are independent and compose per step:
- along N (variable batch size, techniques/vbs/graph_dp.py): the model's `batch` is the request; a step
  covers samples [n0, n1) and, today, all rows. Each tensor's samples live in *groups*
  (maximal sample ranges no step straddles), one buffer per group with its own lifetime; an
  access's `at[0]` is n0 minus the group's first sample. Nothing is shifted along N.
- along H (processing by parts, techniques/parts/planner.py): a step covers rows [h0, h1) of all the
  batch's samples; a tensor lives in one window buffer of `rows` rows whose `at[1]` is h0
  minus the window's base, moved to the top by copy steps when full (mode "shift").
To combine them (b samples by row bands): run each sample group's row-band steps in the parts
order with regions [n0, n1) x [h0, h1), give every (tensor, sample group) its own window buffer
(b, C, rows, W), and index it with at = (n0 - group start, h0 - window base, 0). Ops already
give the exact input window of any (N, H, W) region (`input_windows`), the checker simulates
any such index map, and the executor shifts along any one dimension, so no other part changes;
the memory a DP over N counts for a group is then its window's bytes instead of the whole
tensor's.

Serialised as JSON with a format version; `load_plan` validates it against the models it names.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any, Mapping

from tightfit.errors import TightfitError
from tightfit.ops.base import Region

FORMAT = "tightfit-plan"
VERSION = 1
LAYOUTS = ("nchw", "nhwc")
BUFFER_KINDS = ("whole", "window", "tile", "samples")
STEP_KINDS = ("compute", "input", "copy", "output")


class PlanError(TightfitError):
    """A plan file that is malformed, for another model, or fails the checker."""


@dataclass(frozen=True)
class ModelRef:
    """A model a plan runs: how to load it, and the imported graph's fingerprint (graph/fingerprint.py).
    A model file is named, in a written plan, by its path relative to the plan file's folder
    (`spec`) and by its absolute path when the plan was written (`location`), so that a plan
    folder runs from any working folder, and after it is moved away from the model; the
    fingerprint says whether the file found is still the model the plan was made for."""

    spec: str
    input_shape: tuple[int, ...]
    fingerprint: str
    batch: int = 1
    location: str = ""
    # A model of several inputs: (name, NCHW shape) of each, in its input order (`input_shape` is
    # the first's); empty for a model of one input.
    inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def shapes(self) -> "tuple[int, ...] | dict[str, tuple[int, ...]]":
        """The input shape(s) as a model is loaded with them: one shape, or {input name: shape}."""
        return dict(self.inputs) if self.inputs else self.input_shape


@dataclass(frozen=True)
class Buffer:
    """A block of the arena. `offsets` has one entry per copy (a FIFO between pipelined
    partitions has two: frame f uses copy f % copies)."""

    id: int
    kind: str
    shape: tuple[int, ...]
    layout: str
    offsets: tuple[int, ...]
    itemsize: int = 4
    mode: str = ""  # for windows: "ring" or "shift"
    # (host buffer id, bytes from the host's offset): this buffer lies there and may share the
    # host's bytes while both are live, row by row as rows fall dead (plan/overlay.py); the
    # checker's simulation proves no element is overwritten before it is read.
    overlay: tuple[int, int] | None = None

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.itemsize

    @property
    def copies(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True)
class Access:
    """Region `region` (tensor coordinates) of `tensor` lives in `buffer` at buffer coordinates
    `at` = (n, h, w) of the region's first element."""

    tensor: str
    buffer: int
    region: Region
    at: tuple[int, int, int]


@dataclass(frozen=True)
class Step:
    """kind 'compute': layer `layer` of model `model` computes `out.region` from `inputs`
    (one access per layer input, each exactly the window the op needs).
    kind 'input': region `out.region` of the model input arrives from the source (a row-band
    source is asked for bands of whole-width rows, as many at a time as `scratch` holds twice).
    kind 'copy': inputs[0]'s region is copied to `out`.
    kind 'output': region `out.region` of a model output, computed already, is handed to the caller
    (a sink) from where `out` says; inputs == (out,): it reads what it hands over, writes nothing.
    A plan that streams an output hands every element of it over exactly once, and never holds it
    whole for the caller (plan/lifetimes.streamed_outputs).
    `scratch` is the bytes of kernel temporaries the step allocates besides the arena."""

    kind: str
    model: int
    layer: int
    out: Access
    inputs: tuple[Access, ...] = ()
    scratch: int = 0


@dataclass(frozen=True)
class Partition:
    id: int
    model: int
    layers: tuple[int, ...]
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Plan:
    models: tuple[ModelRef, ...]
    dtype: str
    buffers: tuple[Buffer, ...]
    partitions: tuple[Partition, ...]
    # Sets of partition ids that run at the same time (pipeline stages on successive inputs);
    # partitions in no set run one after another in id order.
    concurrent: tuple[tuple[int, ...], ...] = ()
    arena_bytes: int = 0
    knobs: Mapping[str, Any] = field(default_factory=dict)
    cost_profile: str = ""

    def steps(self) -> list[Step]:
        """All steps in execution order for one input (concurrent partitions concatenated)."""
        return [s for p in self.partitions for s in p.steps]


# --- JSON -------------------------------------------------------------------------------------

def _region_json(r: Region) -> list[int]:
    return [r.n0, r.n1, r.h0, r.h1, r.w0, r.w1]


def _access_json(a: Access) -> dict[str, Any]:
    return {"tensor": a.tensor, "buffer": a.buffer, "region": _region_json(a.region), "at": list(a.at)}


def plan_to_json(plan: Plan) -> dict[str, Any]:
    return {
        "format": FORMAT, "version": VERSION, "dtype": plan.dtype, "arena_bytes": plan.arena_bytes,
        "cost_profile": plan.cost_profile, "knobs": dict(plan.knobs),
        "models": [{"spec": m.spec, "input_shape": list(m.input_shape), "fingerprint": m.fingerprint, "batch": m.batch,
                    **({"location": m.location} if m.location else {}),
                    **({"inputs": [{"name": n, "shape": list(sh)} for n, sh in m.inputs]} if m.inputs else {})}
                   for m in plan.models],
        "buffers": [{"id": b.id, "kind": b.kind, "shape": list(b.shape), "layout": b.layout, "offsets": list(b.offsets),
                     "itemsize": b.itemsize, "mode": b.mode, "overlay": None if b.overlay is None else list(b.overlay)}
                    for b in plan.buffers],
        "partitions": [{"id": p.id, "model": p.model, "layers": list(p.layers), "steps": [
            {"kind": s.kind, "model": s.model, "layer": s.layer, "out": _access_json(s.out),
             "inputs": [_access_json(a) for a in s.inputs], "scratch": s.scratch} for s in p.steps]}
            for p in plan.partitions],
        "concurrent": [list(c) for c in plan.concurrent],
    }


def dumps(plan: Plan) -> str:
    """Deterministic text: the same plan gives the same bytes."""
    return json.dumps(plan_to_json(plan), sort_keys=True, separators=(",", ":")) + "\n"


def _need(d: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(d, dict):
        raise PlanError(f"plan {where}: expected an object")
    if key not in d:
        raise PlanError(f"plan {where}: missing {key!r}")
    v = d[key]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise PlanError(f"plan {where}: {key!r} has the wrong type")
    return v


def _ints(v: Any, n: int | None, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or (n is not None and len(v) != n) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise PlanError(f"plan {where}: expected a list of {n or 'some'} integers")
    return tuple(v)


def _access(d: Any, where: str) -> Access:
    if not isinstance(d, dict):
        raise PlanError(f"plan {where}: an access must be an object")
    r = _ints(_need(d, "region", list, where), 6, where)
    return Access(_need(d, "tensor", str, where), _need(d, "buffer", int, where), Region(*r), _ints(_need(d, "at", list, where), 3, where))  # type: ignore[arg-type]


def plan_from_json(d: Any) -> Plan:
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise PlanError("not a tightfit plan (missing format marker)")
    if d.get("version") != VERSION:
        raise PlanError(f"plan format version {d.get('version')!r} is not supported (this tightfit reads {VERSION})")
    models = tuple(ModelRef(_need(m, "spec", str, "model"), _ints(_need(m, "input_shape", list, "model"), None, "model"),
                            _need(m, "fingerprint", str, "model"), _need(m, "batch", int, "model"),
                            _need(m, "location", str, "model") if "location" in m else "",
                            tuple((_need(i, "name", str, "model input"), _ints(_need(i, "shape", list, "model input"), 4, "model input"))
                                  for i in _need(m, "inputs", list, "model")) if "inputs" in m else ())
                   for m in _need(d, "models", list, "top"))
    buffers = []
    for i, b in enumerate(_need(d, "buffers", list, "top")):
        where = f"buffer {i}"
        kind, layout = _need(b, "kind", str, where), _need(b, "layout", str, where)
        if kind not in BUFFER_KINDS or layout not in LAYOUTS + ("flat",):
            raise PlanError(f"plan {where}: unknown kind {kind!r} or layout {layout!r}")
        overlay = b.get("overlay")
        buffers.append(Buffer(_need(b, "id", int, where), kind, _ints(_need(b, "shape", list, where), None, where), layout,
                              _ints(_need(b, "offsets", list, where), None, where), _need(b, "itemsize", int, where),
                              _need(b, "mode", str, where), None if overlay is None else _ints(overlay, 2, where)))  # type: ignore[arg-type]
    partitions = []
    for p in _need(d, "partitions", list, "top"):
        steps = []
        for j, s in enumerate(_need(p, "steps", list, "partition")):
            where = f"step {j}"
            kind = _need(s, "kind", str, where)
            if kind not in STEP_KINDS:
                raise PlanError(f"plan {where}: unknown step kind {kind!r}")
            steps.append(Step(kind, _need(s, "model", int, where), _need(s, "layer", int, where), _access(s.get("out"), where),
                              tuple(_access(a, where) for a in _need(s, "inputs", list, where)), _need(s, "scratch", int, where)))
        partitions.append(Partition(_need(p, "id", int, "partition"), _need(p, "model", int, "partition"),
                                    _ints(_need(p, "layers", list, "partition"), None, "partition"), tuple(steps)))
    concurrent = tuple(_ints(c, None, "concurrent") for c in _need(d, "concurrent", list, "top"))
    return Plan(models, _need(d, "dtype", str, "top"), tuple(buffers), tuple(partitions), concurrent,
                _need(d, "arena_bytes", int, "top"), dict(_need(d, "knobs", dict, "top")), _need(d, "cost_profile", str, "top"))


# Parse limits for files from anywhere: a plan of DenseNet-121 by parts is a few MB, its deepest
# value (a knob's table) is nested fewer than 10 levels, and every integer in it is a byte count
# or an index well below 2**62.
MAX_PLAN_BYTES = 256 * 2**20
MAX_DEPTH = 32
MAX_INT_DIGITS = 19


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS or abs(int(text)) >= 2**62:
        raise PlanError(f"plan holds the integer {text[:24]}{'...' if len(text) > 24 else ''}, beyond any size or index")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise PlanError(f"plan holds the number {text[:24]}, which is not finite")
    return value


def _parse_constant(text: str) -> float:
    raise PlanError(f"plan holds {text}, which is not a JSON number")


def _depth(data: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((c, depth + 1) for c in children)
    return deepest


def loads(text: str | bytes) -> Plan:
    """A plan from JSON text (bytes must be UTF-8), within the parse limits above."""
    if len(text) > MAX_PLAN_BYTES:
        raise PlanError(f"plan of {len(text)} bytes is larger than the {MAX_PLAN_BYTES // 2**20} MiB a plan may take")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PlanError(f"plan is not UTF-8 text (byte {e.start})") from None
    try:
        data = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except json.JSONDecodeError as e:
        raise PlanError(f"plan is not valid JSON: {e}") from None
    except RecursionError:
        raise PlanError(f"plan is nested deeper than {MAX_DEPTH} levels") from None
    if _depth(data) > MAX_DEPTH:
        raise PlanError(f"plan is nested deeper than {MAX_DEPTH} levels")
    return plan_from_json(data)


def read_plan(path: str | Path) -> Plan:
    """A plan file, its size checked before it is read."""
    p = Path(path)
    try:
        if not p.is_file():
            raise PlanError(f"plan file not found: {p}")
        if p.stat().st_size > MAX_PLAN_BYTES:
            raise PlanError(f"plan file {p} of {p.stat().st_size} bytes is larger than the {MAX_PLAN_BYTES // 2**20} MiB a plan may take")
        data = p.read_bytes()
    except OSError as e:
        raise PlanError(f"cannot read plan file {p}: {e.strerror or e}") from None
    return loads(data)
