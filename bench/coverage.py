"""Coverage of the corpus (issue 22): every model of tightfit.frontend.corpus, exported to ONNX
at opset 17 (and 11 with --opsets 17,11), through every stage tightfit has.

    python bench/coverage.py                      # the whole corpus, opset 17
    python bench/coverage.py resnet18 crnn        # some models
    python bench/coverage.py --opsets 17,11 --fit # both exports, and `fit --budget` (half the reuse arena)
    python bench/coverage.py --hybrids --opsets 17,11 # issue 38's hybrids beside their pure-CNN peers

Columns: layers (after fusion) and distinct ops; parameters counted by `inspect` against torch's
count (parameters and batch-norm statistics); the reference executor against onnxruntime; the
reuse arena over its lower bound, and the reuse plan's run memory (arena + its largest kernel
temporary: a linear Resize to the segmentation models' 520x520 holds one as large as its output);
the run memory (arena + kernel temporaries) of the plan the
parts search and the tiling search pick within half the reuse arena ("<=1/2"), or, where half is
out of their reach, of the smallest plan they found (">1/2"), and whether that plan runs and
matches the reference executor; with --fit, `tightfit fit --budget <half the reuse arena>
--best-effort`: "ok" (a plan within half ran and verified) or "smallest N MB" (nothing fits half:
its smallest plan ran and verified). A model that does not import shows its error (the
unsupported ops and the first node of each). 'convs' and 'blocks': in the parts plan that splits
every layer it can at one row per phase, the most bytes live at a step outside, and while, a
tensor a whole step reads or writes is live: what the convolutional stages need at their finest
split, and what the layers no plan splits (attention over all tokens, dense) hold.

The searches' times come from a stand-in (one unit per step, within SEARCH_SECONDS of search),
so they measure nothing and the table does not depend on the machine's load; `fit` uses the
real cost model.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_write_docs, docs_section, header  # noqa: E402
from tightfit.errors import TightfitError, UnsupportedOpsError  # noqa: E402
from tightfit.frontend import corpus  # noqa: E402
from tightfit.frontend.onnx_import import load_onnx  # noqa: E402
from tightfit.graph.ir import Graph  # noqa: E402
from tightfit.plan.check import check_plan  # noqa: E402
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import plan_reuse  # noqa: E402
from tightfit.reference import run_reference
from tightfit.runtime.reference import random_input  # noqa: E402
from tightfit.verify import compare, verify_with_onnxruntime  # noqa: E402

# Issue 38: each hybrid CNN + attention model beside a pure CNN of its class (MobileViT's paper
# compares with MobileNetV2; EfficientFormer-L1 runs as fast as the small EfficientNets; SVTR is
# CRNN's trunk with attention blocks).
PEERS = {"mobilevit_xxs": "mobilenet_v2", "efficientformer_l1": "efficientnet_b0", "svtr": "crnn"}

SEARCH_SECONDS = 60.0  # the parts search's limit and fit's --time-limit (a stopped search answers with its best so far)


@dataclass
class Row:
    name: str
    opset: int
    error: str = ""
    layers: int = 0
    ops: int = 0
    params: int = 0  # the ONNX file's weights as `inspect` counts them
    file_params: int = 0  # the same counted from the file directly (initializers and Constant nodes)
    torch_params: int = 0  # torch's parameters and batch-norm statistics
    torch_path_params: int = 0  # `inspect` on the PyTorch path (exported without constant folding)
    torch_path_ok: bool = False  # the PyTorch path's reference run against the module itself
    ort_ok: bool = False
    ort_diff: float = 0.0
    reuse: int = 0
    reuse_run: int = 0  # the reuse plan's run memory: its arena and its largest kernel temporary
    lower_bound: int = 0
    parts_bytes: int = 0
    parts_ok: bool = False
    tiling_bytes: int = 0
    tiling_ok: bool = False
    fit: str = ""
    convs: int = 0  # with every splittable layer at one row per phase: the most bytes a step of the others needs
    blocks: int = 0  # ... and the most a whole step needs (attention, layer norm, dense: no plan splits them)
    seconds: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def half(self) -> int:
        return self.reuse // 2


def load(name: str, opset: int) -> tuple[Path, Graph]:
    path = corpus.onnx_path(name, opset)
    with contextlib.redirect_stderr(io.StringIO()):  # opset 11's dynamic batch note: said once per model, not here
        return path, load_onnx(path)


def file_parameters(path: Path) -> int:
    """Float weights in the file: initializers and Constant nodes (an exporter's folding merges
    batch norms into convolutions, so this is not torch's count)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    operands = {t for n in model.graph.node if n.op_type in ("Resize", "Upsample") for t in n.input[1:]}
    arrays = [numpy_helper.to_array(i) for i in model.graph.initializer if i.name not in operands]
    arrays += [numpy_helper.to_array(a.t) for n in model.graph.node if n.op_type == "Constant" and n.output[0] not in operands
               for a in n.attribute if a.name == "value"]
    return sum(int(a.size) for a in arrays if a.dtype.kind == "f" and a.ndim > 0)  # (float scalars are operands)


@functools.lru_cache(maxsize=None)  # (the same for every opset of a model)
def torch_path(name: str) -> tuple[int, int, bool]:
    """(torch's count, `inspect`'s count on the PyTorch path, whether that graph's reference run
    matches the module's own output)."""
    from tightfit.frontend.torch_import import from_module

    module = corpus.module(name)
    shape = corpus.entry(name).input_shape
    names = getattr(module, "input_names", None)  # a model of several inputs: each of the entry's shape
    g = from_module(module, {n: shape for n in names} if names else shape, name)
    x = random_input(g)
    got = run_reference(g, x)
    with torch.no_grad():  # random_input gives numpy since read_inputs does
        want = module(*[torch.as_tensor(x[n]) for n in names]) if names else module(torch.as_tensor(x))
    want = want if isinstance(want, (tuple, list)) else (want,)
    ok = len(want) == len(g.outputs) and all(compare(got[t], w).ok for t, w in zip(g.outputs, want))
    return corpus.parameter_count(name), g.original_param_count, ok


def matches_reference(plan, graph: Graph, x: torch.Tensor, want: dict[str, torch.Tensor]) -> bool:
    """The plan run by the arena executor (arena filled with NaN first) against the reference."""
    from tightfit.api import execute

    outs, _ = execute(plan, [graph], [x], fill_nan=True)
    return all(compare(outs[0][t], want[t]).ok for t in graph.outputs)


def run_memory(plan) -> int:
    return plan.arena_bytes + max((s.scratch for s in plan.steps()), default=0)


class StepCount:
    """A stand-in prediction, one unit per step: the searches pick by memory and step count alone,
    measure nothing, and answer the same on a loaded machine."""

    id = "one unit per step"  # (a plan's knobs name the profile its times came from)

    @staticmethod
    def plan_seconds(plan, graphs) -> float:
        return float(len(plan.steps()))

    @staticmethod
    def steps_seconds(plan, graphs, steps) -> float:
        return float(len(steps))


def split_plan(kind: str, model: PlannedModel, budget: int):
    """(the plan `kind`'s search picks within `budget`, whether it fits it): where nothing it
    reaches fits, the smallest it found (BudgetError.smallest), which a second timed search may
    not reach again."""
    from tightfit.api import plan_for_budget
    from tightfit.errors import BudgetError
    from tightfit.techniques.interface import Config

    try:
        return plan_for_budget(kind, model, budget, Config(), StepCount(), SEARCH_SECONDS), True
    except BudgetError as e:
        if e.smallest is None:
            raise
        return e.smallest, False


def check_model(name: str, opset: int = 17, fit: bool = False, split: bool = True, pytorch: bool = True) -> Row:
    """Every stage on one corpus model (the PyTorch path, the same at every opset, only with
    `pytorch`); a stage that raises a tightfit error ends the row there."""
    row = Row(name, opset)
    t0 = time.perf_counter()
    try:
        path, g = load(name, opset)
    except UnsupportedOpsError as e:  # the ops alone (the first node of each is in the error itself)
        row.error = "unsupported " + ", ".join(f"{op}" if ":" not in node else f"{op} ({node.split(': ', 1)[1]})"
                                               for op, node in sorted(e.unsupported.items()))
        return row
    except TightfitError as e:
        row.error = str(e)
        return row
    row.seconds["import"] = time.perf_counter() - t0
    row.layers, row.ops = len(g.layers), len({l.op for l in g.layers})
    row.params, row.file_params = g.original_param_count, file_parameters(path)
    if pytorch:
        t0 = time.perf_counter()
        try:
            row.torch_params, row.torch_path_params, row.torch_path_ok = torch_path(name)
        except TightfitError as e:
            row.error = f"the PyTorch path: {e}"
            return row
        row.seconds["torch"] = time.perf_counter() - t0
    x = random_input(g)
    t0 = time.perf_counter()
    want = run_reference(g, x)
    c = verify_with_onnxruntime(str(path), None, g, x, want)
    row.ort_ok, row.ort_diff = c.ok, c.max_abs_diff / max(c.max_abs_ref, 1e-30)
    row.seconds["verify"] = time.perf_counter() - t0
    model = PlannedModel(g, str(path))
    t0 = time.perf_counter()
    reuse = plan_reuse(model, "improve")
    report = check_plan(reuse, [g])
    row.reuse, row.lower_bound, row.reuse_run = report.arena_bytes, report.lower_bound, run_memory(reuse)
    row.seconds["reuse"] = time.perf_counter() - t0
    if split:
        for kind in ("parts", "tiling"):
            t0 = time.perf_counter()
            try:
                plan, _ = split_plan(kind, model, row.half)
                check_plan(plan, [g])
                setattr(row, f"{kind}_bytes", run_memory(plan))
                setattr(row, f"{kind}_ok", matches_reference(plan, g, x, want))
            except Exception as e:  # a planner's bug: shown in the table, the other stages still run
                row.problems.append(f"{kind}: {type(e).__name__}: {str(e)[:120]}")
            row.seconds[kind] = time.perf_counter() - t0
    if split:
        t0 = time.perf_counter()
        row.convs, row.blocks = row_floors(model)
        row.seconds["floors"] = time.perf_counter() - t0
    if fit:
        t0 = time.perf_counter()
        row.fit = fit_half(path, row.half)
        row.seconds["fit"] = time.perf_counter() - t0
    return row


def row_floors(model: PlannedModel) -> tuple[int, int]:
    """(run memory of the split steps, of the whole steps) of the parts plan that computes every
    splittable layer one row per phase: what the convolutional stages need at their finest split,
    and what the layers no plan splits need. Where the second is larger, the whole-step blocks
    set the floor of every split plan (parts and tiling end a group at them)."""
    from tightfit.analysis.memory import whole_step_peaks
    from tightfit.techniques.parts.planner import phases_for_rows, plan_parts

    phases, source = phases_for_rows(model.graph, 1)
    peaks = whole_step_peaks(plan_parts(model, phases, source), [model.graph])
    return peaks.split, peaks.blocks


def fit_half(path: Path, budget: int) -> str:
    """`tightfit fit PATH --budget B --best-effort`: "ok" (a plan within B ran and verified),
    "smallest N MB" (nothing it reaches fits B: its smallest plan ran and verified instead), or
    its one error line (fit verifies its pick itself and fails when the outputs differ)."""
    from tightfit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["fit", str(path), "--budget", str(budget), "--best-effort",
                     "--time-limit", str(int(SEARCH_SECONDS)), "--json"])
    if code != 0:
        return f"exit {code}: {err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ''}"
    report: dict[str, Any] = json.loads(out.getvalue())
    return "ok" if report["fits"] else f"smallest {_mb(report['chosen']['memory_bytes'])} MB"


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f}"


def line(row: Row) -> str:
    if row.error:
        return f"{row.name:<30} {row.opset:>2}  does not import: {row.error[:200]}"
    params = ("=" if row.torch_path_params == row.torch_params else f"{row.torch_path_params - row.torch_params:+d}"
              ) if row.torch_params else "-"
    params += "" if row.params == row.file_params else f" file{row.params - row.file_params:+d}"
    params += "" if row.torch_path_ok or not row.torch_params else " DIFF"
    half = lambda b: "<=1/2" if b and b <= row.half else ">1/2 "  # noqa: E731
    parts = f"{_mb(row.parts_bytes):>7} {half(row.parts_bytes)} {'ok' if row.parts_ok else 'DIFF'}" if row.parts_bytes else f"{'-':>16}"
    tiling = f"{_mb(row.tiling_bytes):>7} {half(row.tiling_bytes)} {'ok' if row.tiling_ok else 'DIFF'}" if row.tiling_bytes else f"{'-':>16}"
    return (f"{row.name:<30} {row.opset:>2} {row.layers:>6} {row.ops:>4} {row.params / 1e6:>8.3f} {params:>12}  "
            f"{'ok' if row.ort_ok else 'DIFF'} {row.ort_diff:8.1e}  {_mb(row.reuse):>7} {row.reuse / max(row.lower_bound, 1):6.3f} {_mb(row.reuse_run):>7}  "
            f"{parts}  {tiling}  {_mb(row.convs) if row.convs else '-':>7} {_mb(row.blocks) if row.blocks else '-':>7}  "
            f"{row.fit or '-':<6} {sum(row.seconds.values()):6.1f}"
            + "".join(f"\n{'':<33}{p}" for p in row.problems))


HEAD = (f"{'model':<30} {'op':>2} {'layers':>6} {'ops':>4} {'params M':>8} {'torch':>12}  {'onnxruntime':<11}  "
        f"{'reuse MB':>7} {'/LB':>6} {'run MB':>7}  {'parts MB':>7} {'':<5} {'run':<4}  {'tiling MB':>7} {'':<5} {'run':<4}  {'convs MB':>7} {'blocks MB':>7}  "
        f"{'fit':<6} {'s':>6}")


def peer_table(rows: list[Row]) -> str:
    """The hybrids beside their pure-CNN peers (issue 38): reuse, the smallest parts and tiling
    plans, and what the whole steps cost a split plan: the convolutional stages at one row per
    phase ('convs') against the steps that keep a whole-step layer's tensors whole ('blocks')."""
    by = {(r.name, r.opset): r for r in rows if not r.error}
    out = [f"{'hybrid / peer':<22} {'op':>2} {'params M':>8} {'reuse MB':>8} {'parts MB':>8} {'tiling MB':>9} "
           f"{'convs MB':>8} {'blocks MB':>9}  whole steps bind"]
    for (name, opset), r in by.items():
        peer = by.get((PEERS.get(name, ""), opset))
        if name not in PEERS:
            continue
        for x in (r, peer) if peer else (r,):
            binds = "yes" if x.blocks > x.convs else "no"
            out.append(f"{x.name:<22} {x.opset:>2} {x.params / 1e6:>8.3f} {_mb(x.reuse):>8} {_mb(x.parts_bytes):>8} "
                       f"{_mb(x.tiling_bytes):>9} {_mb(x.convs):>8} {_mb(x.blocks) if x.blocks else '-':>9}  {binds}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help=f"corpus models (default: all {len(corpus.names())})")
    ap.add_argument("--opsets", default="17", help="comma-separated export opsets (17, 11)")
    ap.add_argument("--fit", action="store_true", help="also `tightfit fit --budget` half the reuse arena")
    ap.add_argument("--no-split", action="store_true", help="skip the parts and tiling searches")
    ap.add_argument("--hybrids", action="store_true", help="only the hybrid models and their pure-CNN peers (issue 38)")
    add_write_docs(ap)
    args = ap.parse_args(argv)
    if args.hybrids:
        args.models = [m for pair in PEERS.items() for m in pair]
    shown = "python bench/coverage.py " + " ".join(a for a in (argv if argv is not None else sys.argv[1:]) if a != "--write-docs")
    # The whole corpus is one section, the hybrids beside their peers another.
    with docs_section("coverage-hybrids" if args.hybrids else "coverage", args.write_docs, shown.strip()):
        table(args)
    return 0


def table(args: argparse.Namespace) -> None:
    header("corpus coverage (issue 22): import, onnxruntime, reuse vs lower bound, parts and tiling at half the reuse arena")
    print("params: the ONNX file's weights as inspect counts them (M; 'fileN': N more than the file holds); torch: the PyTorch\n"
          "path's count against torch's parameters + batch-norm statistics ('=' equal; 'DIFF': its run differs from the module's)")
    print("parts / tiling: run memory (MB = 1e6 bytes) of the plan picked within half the reuse arena ('<=1/2'), or of the\n"
          "smallest found where half is out of reach ('>1/2'), and that plan run against the reference executor; convs /\n"
          "blocks: see the hybrids' table below\n")
    print(HEAD, flush=True)
    rows = []
    for name in args.models or corpus.names():
        for opset in (int(o) for o in args.opsets.split(",")):
            row = check_model(name, opset, fit=args.fit, split=not args.no_split)
            rows.append(row)
            print(line(row), flush=True)
            print(f"{name} {opset}: " + ", ".join(f"{k} {v:.0f} s" for k, v in row.seconds.items()), file=sys.stderr, flush=True)
    if any(r.name in PEERS for r in rows) and not args.no_split:
        print("\nhybrids beside their pure-CNN peers: convs / blocks = the most bytes live (and scratch) at a step of the\n"
              "parts plan at one row per phase, outside / while a tensor of a whole step (attention over all tokens,\n"
              "a dense layer, a squeeze-excitation product) is live; 'whole steps bind': blocks above convs\n")
        print(peer_table(rows))
    ok = [r for r in rows if not r.error]
    print(f"\n{len(ok)} of {len(rows)} exports import; {sum(r.ort_ok for r in ok)} match onnxruntime; "
          f"{sum(r.reuse == r.lower_bound for r in ok)} reuse plans at the lower bound")


if __name__ == "__main__":
    sys.exit(main())
