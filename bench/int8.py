"""int8 memory beside TFLite Micro and the published records (issue 40, point 6: the memory part).

Models: Keras MobileNetV2 1.0 at 224, 0.35 at 144 and 128, MobileNetV1 0.25 at 96 (random weights,
global average pool + Dense head), converted to int8 .tflite files by TensorFlow's converter on
random calibration data (bench/tflite_models.py; made once with tensorflow and cached under
~/.cache/tightfit/tflite). For each, on the same file:

- TFLite Micro's smallest arena: `arena_size` bisected (to 16 bytes) with the `tflite-micro`
  interpreter until it no longer allocates (each try in a child process: the interpreter crashes on
  some arenas too small for its persistent data);
- tightfit's plans of the imported graph: reuse (whole tensors), parts (one output row per phase
  everywhere) and the smallest fused tiling the tiling search reaches, the arena as the checker
  counts it, of the plans as they run: the graph takes the file's int8 input as TFLite Micro does
  (no quantize step; the arena holds the int8 input), so the figures compare with TFLite Micro's
  arena. A parts plan reads its input by row bands from outside the arena (input excluded, as
  MCUNetV2 counts);
- bit-exactness: the int8 outputs of tightfit's run against TFLite Micro's, on a seeded input.

Verdicts: ours (reuse alone) <= TFLite Micro's arena on every model; MobileNetV2-224 split
(parts or tiling, the smaller) below MCUNetV2's 172 kB (input excluded).

    python bench/int8.py [--models mv2-1.0-224,mv2-0.35-144,mv2-0.35-128,mv1-0.25-96] [--write-docs]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402

import tflite_models as tm  # noqa: E402
from benchlib import add_write_docs, docs_section, header, verdict  # noqa: E402
from tightfit.frontend.tflite_import import load_tflite  # noqa: E402
from tightfit.graph.ir import Graph  # noqa: E402
from tightfit.plan.check import check_plan  # noqa: E402
from tightfit.reference import run_reference  # noqa: E402
from tightfit.techniques.interface import Config, PlannedModel  # noqa: E402
from tightfit.techniques.parts import draft as parts_draft  # noqa: E402
from tightfit.techniques.reuse.planner import plan_reuse  # noqa: E402
from tightfit.techniques.tiling import config_of as tiling_config  # noqa: E402
from tightfit.techniques.tiling import draft as tiling_draft  # noqa: E402
from tightfit.techniques.tiling.config_search import search_tiling  # noqa: E402

MODELS = ("mv2-1.0-224", "mv2-0.35-144", "mv2-0.35-128", "mv1-0.25-96")
KB, KIB = 1000, 1024
MCUNETV2_224 = 172 * KB  # MCUNetV2, MobileNetV2-224 int8 by patches, input excluded
# The published records of issue 40, per model (what each counts).
RECORDS = {
    "mv2-1.0-224": "MCUNetV2: 1372 kB layer by layer, 172 kB by patches (input excluded)",
    "mv2-0.35-144": "TinyEngine / X-CUBE-AI 7.3 on STM32H743: 295 / 296 kB layer by layer; msf-CNN: 8.6 kB at 1.68x MACs",
    "mv2-0.35-128": "STM32Cube.AI 10: 237 KiB activations (input and output included)",
    "mv1-0.25-96": "TFLite Micro's person detection example (its own model): a 136 KiB arena",
}
GRANULE = 16  # bytes: the bisection's resolution


# One allocation try in a child process: TFLite Micro's interpreter crashes (a null pointer) on
# some arenas too small for its persistent data instead of failing, which must not end the bench.
_TRY = """
import sys
from tflite_micro.python.tflite_micro import runtime
try:
    runtime.Interpreter.from_bytes(open(sys.argv[1], "rb").read(), arena_size=int(sys.argv[2]))
except Exception:
    sys.exit(1)
"""


def tflm_smallest_arena(path: Path) -> int | None:
    """The smallest `arena_size` with which TFLite Micro's interpreter allocates the model."""
    try:
        import tflite_micro  # noqa: F401
    except ImportError:
        return None

    def fits(n: int) -> bool:
        run = subprocess.run([sys.executable, "-c", _TRY, str(path), str(n)], capture_output=True, timeout=300)
        return run.returncode == 0

    lo, hi = 0, 1 << 16
    while not fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > GRANULE:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def arenas(g: Graph, name: str) -> tuple[int, int]:
    """(reuse, parts one row per phase) arena bytes, as the checker counts them."""
    model = PlannedModel(g, name)
    reuse = check_plan(plan_reuse(model, "improve"), [g]).arena_bytes
    parts = check_plan(parts_draft(model, Config(settings={"rows": 1})), [g]).arena_bytes
    return reuse, parts


def smallest_tiling(g: Graph, name: str) -> int:
    """The arena of the smallest configuration the tiling search reaches (asked for 1 byte, so
    that it opens its fine space; memory only, every step timed 0)."""
    model = PlannedModel(g, name)
    found = search_tiling(model, lambda plan, steps: 0.0, budget_bytes=1)
    return check_plan(tiling_draft(model, tiling_config(found.chosen.config, planner="improve")), [g]).arena_bytes


def exact(g: Graph, data: bytes) -> str:
    """Whether tightfit's int8 outputs equal TFLite Micro's on a seeded input."""
    try:
        x = tm.random_int8(g, 0)
        ref = tm.tflm_outputs(data, x).reshape(-1)
    except ImportError:
        return "n/a"
    ours = tm.as_int8_output(g, run_reference(g, tm.as_graph_input(g, x))[g.outputs[0]]).reshape(-1)
    off = ours != ref
    return "yes" if not off.any() else f"{off.mean():.2%} off (max {np.abs(ours.astype(int) - ref).max()} LSB)"


def one_model(name: str) -> dict:
    path = tm.cached(name)
    data = path.read_bytes()
    g = load_tflite(path)
    assert g.tensors[g.inputs[0]].dtype == "int8", "these files take int8 input, as the graph does"
    reuse, parts = arenas(g, name)
    return {"model": name, "tflm": tflm_smallest_arena(path), "reuse": reuse, "parts": parts,
            "tiling": smallest_tiling(g, name), "exact": exact(g, data)}


def kib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / KIB:.1f}"


def print_table(rows: list[dict]) -> None:
    cols = ("model", "TFLM arena", "reuse", "parts", "tiling", "bit-exact vs TFLM")
    print(f"{cols[0]:<14}" + "".join(f"{c:>16}" for c in cols[1:-1]) + f"  {cols[-1]}")
    print("(KiB, the plans as run: the file's int8 input in the arena as TFLite Micro holds it; parts and tiling "
          "read it by row bands)")
    for r in rows:
        cells = (r["tflm"], r["reuse"], r["parts"], r["tiling"])
        print(f"{r['model']:<14}" + "".join(f"{kib(v):>16}" for v in cells) + f"  {r['exact']}")
    print("\npublished records (each paper's own model and counting, not these files):")
    for r in rows:
        print(f"  {r['model']}: {RECORDS[r['model']]}")
    print("\nverdicts:")
    for r in rows:
        if r["tflm"] is not None:
            ok = verdict([(r["reuse"] <= r["tflm"], "reuse above TFLite Micro's arena")])
            print(f"  {r['model']}: reuse alone {kib(r['reuse'])} KiB <= TFLite Micro's {kib(r['tflm'])} KiB: {ok}; "
                  f"split {r['tflm'] / min(r['parts'], r['tiling']):.1f}x below it")
        if r["model"] == "mv2-1.0-224":
            split = min(r["parts"], r["tiling"])
            ok = verdict([(split < MCUNETV2_224, "not below 172 kB")])
            print(f"  {r['model']}: split {split / KB:.1f} kB (input excluded) < MCUNetV2's 172 kB: {ok}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    add_write_docs(ap)
    args = ap.parse_args()
    with docs_section("int8", args.write_docs, f"python bench/int8.py --models {args.models}"):
        header("int8 .tflite models: tightfit's arena beside TFLite Micro's smallest", profile_id="- (memory only)")
        rows = []
        for name in args.models.split(","):
            rows.append(one_model(name))
        print_table(rows)


if __name__ == "__main__":
    main()
