"""int8 end to end beside TFLite Micro, onnxruntime and the published records (issue 40, point 6).

    python bench/int8.py [--models mv2-1.0-224,mv2-0.35-144,mv2-0.35-128,mv1-0.25-96,resnet18-224]
                         [--only memory,mcu,speed] [--quick] [--skip-emx] [--folder DIR] [--write-docs]

1. Memory. Models: Keras MobileNetV2 1.0 at 224, 0.35 at 144 and 128, MobileNetV1 0.25 at 96, and
the standard basic-block ResNet-18 at 224 built from Keras layers (Keras has none; SAME padding)
(random weights, global average pool + Dense head), converted to int8 .tflite files by
TensorFlow's converter on random calibration data (bench/tflite_models.py; made once with
tensorflow and cached under ~/.cache/tightfit/tflite). For each, on the same file:
- TFLite Micro's smallest arena: `arena_size` bisected (to 16 bytes) with the `tflite-micro`
  interpreter until it no longer allocates (each try in a child process: the interpreter crashes
  on some arenas too small for its persistent data); cached per file in --folder;
- tightfit's plans of the imported graph (bench/inplace.py's `int8_rows`): layer by layer with
  reuse, the smallest plan by parts the parts search finds, the smallest fused tiling the tiling
  search finds (--quick: none), each without and with in-place / overlapping outputs
  (`plan --inplace`). Figures are the checked plan's peak run memory (arena + the largest step's
  kernel temporaries) with the file's int8 input in it, as TFLite Micro's arena holds it;
  "w/o input" is the smallest plan's peak without the input's buffer (MCUNetV2's accounting);
- bit-exactness: the int8 outputs of tightfit's run against TFLite Micro's, on a seeded input.
2. Cortex-M7 (bench/mcu.py): mbv2-0.35-144 (torchvision, quantized by onnxruntime, QDQ) and
   mv1-0.25-96 (the .tflite above): reuse and the smallest plan exported with
   `tightfit export --target cortex-m7`, whole RAM of the link at 256 / 512 KiB (arena + I/O buffer
   + stack + .data + .bss), flash, instructions per inference under qemu, outputs compared; beside
   them emx-onnx-cgen's C for the same model's ONNX QDQ file in the same test program
   (bench/mcu.py's `emx_row`), or the one-line reason it does not compile, fit or run.
3. Host speed at one thread (bench/kernels.py's int8 rows): torchvision mobilenet_v2 and resnet18
   (seeded random weights, 224) quantized by onnxruntime's quantize_static (QDQ), our reuse plan
   beside onnxruntime's int8 session, process CPU time, median.

Verdicts (issue 40's goals): reuse alone <= TFLite Micro's arena on every model, split far below;
MobileNetV2-224 smallest (in-place included) below MCUNetV2's 172 kB, input excluded as MCUNetV2
counts; mbv2-w0.35 at 144 within 256 KiB of RAM whole program, below the 295 kB layer-by-layer
records; host int8 >= 1.0x onnxruntime's int8.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402

import kernels as kernels_bench  # noqa: E402
import mcu as mcu_bench  # noqa: E402
import tflite_models as tm  # noqa: E402
from benchlib import add_write_docs, command_line, docs_section, header, loaded, verdict  # noqa: E402
from inplace import Row, int8_rows  # noqa: E402
from tightfit.frontend.tflite_import import load_tflite  # noqa: E402
from tightfit.graph.ir import Graph  # noqa: E402
from tightfit.reference import run_reference  # noqa: E402

MODELS = ("mv2-1.0-224", "mv2-0.35-144", "mv2-0.35-128", "mv1-0.25-96", "resnet18-224")
MCU_MODELS = ("mbv2-0.35-144", "mv1-0.25-96")
PARTS = ("memory", "mcu", "speed")
KB, KIB = 1000, 1024
MCUNETV2_224 = 172 * KB  # MCUNetV2, MobileNetV2-224 int8 by patches, input excluded
RECORD_LBL = 295 * KB  # TinyEngine / X-CUBE-AI 7.3, mbv2-w0.35 at 144, layer by layer
RAM_GOAL = 256 * KIB
# The published records of issue 40, per model (what each counts).
RECORDS = {
    "mv2-1.0-224": "MCUNetV2: 1372 kB layer by layer, 172 kB by patches (input excluded)",
    "mv2-0.35-144": "TinyEngine / X-CUBE-AI 7.3 on STM32H743: 295 / 296 kB layer by layer; msf-CNN: 8.6 kB at 1.68x MACs",
    "mv2-0.35-128": "STM32Cube.AI 10: 237 KiB activations (input and output included)",
    "mv1-0.25-96": "TFLite Micro's person detection example (its own model): a 136 KiB arena",
    "resnet18-224": "none in issue 40 (TFLite Micro's arena above is the comparison)",
}
GRANULE = 16  # bytes: the bisection's resolution
DEFAULT_FOLDER = Path.home() / ".cache" / "tightfit" / "int8bench"


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


def cached_tflm_arena(path: Path, folder: Path) -> int | None:
    """tflm_smallest_arena, kept in folder/tflm_arena.json per file content (a bisection is ~20
    interpreter starts)."""
    store = folder / "tflm_arena.json"
    known = json.loads(store.read_text()) if store.exists() else {}
    key = hashlib.sha256(path.read_bytes()).hexdigest()
    if key not in known:
        found = tflm_smallest_arena(path)
        if found is None:
            return None
        known[key] = found
        store.write_text(json.dumps(known, indent=1))
    return known[key]


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


def memory_row(name: str, folder: Path, tiling: bool) -> dict:
    path = tm.cached(name)
    g = load_tflite(path)
    assert g.tensors[g.inputs[0]].dtype == "int8", "these files take int8 input, as the graph does"
    return {"model": name, "path": path, "tflm": cached_tflm_arena(path, folder), "rows": int8_rows(path, tiling=tiling),
            "exact": exact(g, path.read_bytes())}


def kib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / KIB:.1f}"


def smallest(rows: list[Row]) -> Row:
    return min(rows, key=lambda r: r.without_input)


def print_memory(found: list[dict]) -> None:
    cols = ("TFLM arena", "reuse", "+in-place", "parts", "+in-place", "tiling", "+in-place")
    print(f"{'model':<14}" + "".join(f"{c:>11}" for c in cols) + f"{'w/o input':>11}  bit-exact vs TFLM")
    print("(KiB; peak run memory of the checked plans with the file's int8 input in it, as TFLite Micro's arena "
          "holds it;\n w/o input: the smallest plan without the input's buffer, as MCUNetV2 counts)")
    for f in found:
        cells = [f["tflm"], *(r.with_input for r in f["rows"])] + [None] * (7 - 1 - len(f["rows"]))
        print(f"{f['model']:<14}" + "".join(f"{kib(v):>11}" for v in cells)
              + f"{kib(smallest(f['rows']).without_input):>11}  {f['exact']}")
    print("\npublished records (each paper's own model and counting, not these files):")
    for f in found:
        print(f"  {f['model']}: {RECORDS.get(f['model'], '-')}")
    print("\nverdicts:")
    for f in found:
        reuse, best = f["rows"][0], smallest(f["rows"])
        if f["tflm"] is not None:
            ok = verdict([(reuse.with_input <= f["tflm"], "reuse above TFLite Micro's arena")])
            print(f"  {f['model']}: reuse alone {kib(reuse.with_input)} KiB <= TFLite Micro's {kib(f['tflm'])} KiB: "
                  f"{ok}; smallest {f['tflm'] / min(r.with_input for r in f['rows']):.1f}x below it (input included)")
        if f["model"] == "mv2-1.0-224":
            print(f"  {f['model']}: smallest {best.without_input / KB:.1f} kB (input excluded, as MCUNetV2 counts; "
                  f"{best.name}) < MCUNetV2's 172 kB: {mcunet_verdict(f['rows'])}")


def mcunet_verdict(rows: list[Row]) -> str:
    """MobileNetV2-224's goal: the smallest plan of any kind (in-place ones included), input excluded."""
    return verdict([(smallest(rows).without_input < MCUNETV2_224, "not below 172 kB")])


def ram_verdict(row: mcu_bench.McuRow) -> str:
    """mbv2-w0.35 at 144's goal: the whole program's RAM at the 256 KiB link, run and equal."""
    ram = row.ram[mcu_bench.LINKS[0]]
    return verdict([(ram is not None and ram <= RAM_GOAL, "not within 256 KiB"),
                    (ram is not None and ram < RECORD_LBL, "not below 295 kB"), (row.ok, "not run, or outputs differ")])


def mcu_section(models: list[str], found: list[dict], folder: Path, emx: bool) -> None:
    """bench/mcu.py's rows; a model whose plans part 1 made (the same file) is not planned again."""
    planned = {f["model"]: f["rows"] for f in found}
    rows: list[mcu_bench.McuRow] = []
    for m in models:
        if m in planned:
            reuse, best = planned[m][0], min(planned[m], key=lambda r: r.with_input)
            chosen = [("reuse", reuse)] + ([] if best is reuse else [("smallest: " + best.name, best)])
            rows += [mcu_bench.plan_row(m, label, r.plan, r.with_input, folder) for label, r in chosen]
        else:
            rows += mcu_bench.mcu_rows(mcu_bench.model_file(m, folder), m, folder)
        if emx:
            rows.append(mcu_bench.emx_row(m, folder))
    print("\n2. Cortex-M7 (qemu mps2-an500): whole RAM of the link at 256 / 512 KiB, flash, instructions per inference")
    mcu_bench.print_rows(rows)
    print("instructions: qemu's count (-icount), not a timing; RAM can be below peak + stack: the program streams\n"
          "the input by rows (no input buffer), the peak counts it")
    if emx:
        print("emx-onnx-cgen: its C (weights as constants) for the model's ONNX QDQ file (mv1-0.25-96: the .tflite's QDQ\n"
              "form) called from the same test program; it computes in float on weights dequantized at run time, its\n"
              "temporaries from malloc (a pool measured in a first run); RAM = pool + float I/O buffer + stack + .data + .bss")
    for m in models:
        emx_line(m, rows)
    for r in rows:
        if r.model == "mbv2-0.35-144" and r.plan.startswith("smallest"):
            print(f"  mbv2-0.35-144 whole program {kib(r.ram[mcu_bench.LINKS[0]])} KiB RAM within 256 KiB, below the "
                  f"295 kB layer-by-layer records: {ram_verdict(r)}")


def emx_line(model: str, rows: list[mcu_bench.McuRow]) -> None:
    """emx-onnx-cgen's program beside our reuse plan's on the same model, where both ran."""
    emx = next((r for r in rows if r.model == model and r.plan == "emx-onnx-cgen"), None)
    reuse = next((r for r in rows if r.model == model and r.plan == "reuse"), None)
    if emx is None or reuse is None or not emx.instructions or not reuse.instructions:
        return
    ram = lambda r: min((v for v in r.ram.values() if v is not None), default=None)  # noqa: E731
    ours, theirs = ram(reuse), emx.whole_ram
    print(f"  {model}: emx-onnx-cgen {emx.instructions:,} instructions per inference, our reuse plan {reuse.instructions:,} "
          f"({emx.instructions / reuse.instructions:.2f}x); whole RAM {kib(theirs)} KiB against {kib(ours)} KiB")


def speed_section() -> None:
    print("\n3. Host speed, one thread, process CPU time (bench/kernels.py's int8 rows): torchvision models at 224, QDQ")
    for name in kernels_bench.INT8_MODELS:
        ours, ort_s = kernels_bench.one_model(name, int8=True)
        ratio = ort_s / ours
        ok = verdict([(ratio >= 1.0, "slower than onnxruntime's int8")])
        print(f"  {name}: tightfit {ours * 1e3:.1f} ms, onnxruntime int8 {ort_s * 1e3:.1f} ms: {ratio:.2f}x >= 1.0x: "
              f"{ok}{loaded()}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="part 1's .tflite models")
    ap.add_argument("--mcu-models", default=",".join(MCU_MODELS), help="part 2's models (bench/mcu.py's)")
    ap.add_argument("--only", default=",".join(PARTS), help="which parts: memory, mcu, speed")
    ap.add_argument("--quick", action="store_true", help="no tiling search (the longest step)")
    ap.add_argument("--skip-emx", action="store_true", help="part 2 without emx-onnx-cgen's programs")
    ap.add_argument("--folder", default=str(DEFAULT_FOLDER), help="where int8 files, exports and TFLM arenas are kept")
    add_write_docs(ap)
    args = ap.parse_args()
    only, folder = set(args.only.split(",")), Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    shown = command_line("int8.py")
    with docs_section("int8", args.write_docs, shown):
        header(__doc__.splitlines()[0], profile_id="- (memory, qemu instruction counts, CPU time)")
        found = []
        if "memory" in only:
            print("\n1. int8 .tflite models: tightfit's plans beside TFLite Micro's smallest arena")
            found = [memory_row(name, folder, not args.quick) for name in args.models.split(",")]
            print_memory(found)
        if "mcu" in only:
            mcu_section(args.mcu_models.split(","), found, folder, not args.skip_emx)
        if "speed" in only:
            speed_section()


if __name__ == "__main__":
    main()
