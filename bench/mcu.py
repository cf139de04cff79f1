"""int8 models on a Cortex-M7 (issue 40 points 5 and 6): instructions per inference under qemu,
whole RAM at 256 KiB and 512 KiB links, and flash.

    python bench/mcu.py [--write-docs] [--folder DIR] [--models mbv2-0.35-144,mv1-0.25-96]

Models: mbv2-0.35-144, torchvision's mobilenet_v2(width_mult=0.35) at 144 quantized by
onnxruntime's `quantize_static` (bench/inplace.py's `quantized_mbv2`; a QDQ file, float input
quantized by its first layer); mv1-0.25-96, Keras' MobileNet 0.25 at 96 with random weights as
an int8 .tflite (bench/tflite_models.py, int8 input). Plans (bench/inplace.py's `int8_rows`):
layer by layer with reuse, and the smallest plan (peak with input) of reuse / parts / tiling, each
with and without in-place outputs.

Each plan is exported with `tightfit export --target cortex-m7` (weights in flash), linked for
256 KiB and for 512 KiB of RAM with 2 MiB of flash. RAM = the link's whole RAM use: arena + I/O
buffer + stack reserved (8 KiB) + .data + .bss, from the ELF's sections; "no fit" is the linker's
overflow. flash = code + weights + .data's initial values. The program is then run under qemu's
mps2-an500 (`-icount shift=0`) on the link's smallest RAM that holds it (the board's 4 MiB where
neither does), its output compared with the Python executor's; "instructions" is what the test
program's SysTick count says one inference executed (one instruction = 1 ns of qemu's virtual
clock; the count includes reading a streamed input's rows through semihosting). Instructions are
the emulator's, not a Cortex-M7's cycles: they compare plans and programs, not wall time.

`mcu_rows(path)` gives these figures for any int8 model file (the rows bench/int8.py prints).

emx-onnx-cgen beside us (`emx_row`, bench/int8.py's part 2): its C for the same model's ONNX QDQ
file (mbv2-0.35-144's own; mv1-0.25-96's .tflite as the QDQ model it means,
`tflite_import.tflite_as_onnx`), generated with its weights as C constants (`--large-weight-threshold
0`), its `model()` called from tightfit's own Cortex-M7 test program (the same startup, linker
script, compiler flags, SysTick count under `-icount shift=0`: `export.mcu.build_mcu` and
`run_qemu_measured` on a wrapper that looks like an exported library). emx's program computes in
float on weights it dequantizes at run time and takes its temporaries from malloc: newlib's
malloc draws them from the wrapper's pool (a bounded `_sbrk` that records its high-water mark).
A first link (RAM in the board's 16 MiB PSRAM, a 256 KiB stack) measures the pool and the stack it
uses; the program is then linked again with exactly that pool and the stack it used (at least 8
KiB): RAM = that link's whole RAM (pool + float I/O buffer + stack + .data + .bss), which a 256 /
512 KiB link holds or not. Its outputs are compared with onnxruntime's on the same ONNX file, in
LSBs of the output's quantization step.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from benchlib import add_write_docs, command_line, docs_section, emx_program, header
from inplace import int8_rows, quantized_mbv2
from tflite_models import cached, edge_quant, random_int8
from tightfit.errors import TightfitError
from tightfit.export.mcu import DEFAULT_STACK_BYTES, build_mcu, run_qemu_measured
from tightfit.files import write_plan
from tightfit.frontend.tflite_import import load_tflite, tflite_as_onnx
from tightfit.options import ExportOptions
from tightfit.pipeline import export

KIB = 1024
LINKS = (256 * KIB, 512 * KIB)
BOARD_RAM = 4 * 2**20  # mps2-an500's data memory: where a plan no link holds still runs
FLASH_BYTES = 2 * 2**20
MODELS = ("mbv2-0.35-144", "mv1-0.25-96")


@dataclass(frozen=True)
class McuRow:
    model: str
    plan: str
    peak: int | None               # the checked plan's peak run memory, input included (None: no plan)
    ram: dict[int, int | None]     # link RAM size -> whole RAM used (None: the link overflowed)
    flash: int
    instructions: int | None       # per inference under qemu; None when the run failed
    ok: bool                       # outputs equal the Python executor's
    note: str = ""
    outputs: str = ""              # how the outputs compared, where not with the executor
    whole_ram: int | None = None   # emx-onnx-cgen's program: the whole RAM of its link, whatever the LINKS sizes


def model_file(name: str, folder: Path) -> Path:
    """The int8 file of a bench model (made once per folder, or from tflite_models' cache)."""
    if name == "mbv2-0.35-144":
        return quantized_mbv2(0.35, 144, folder)
    return cached(name)


def _export(plan_path: Path, out: Path, ram: int, check: bool):
    return export(ExportOptions(str(plan_path), str(out), force=True, target="cortex-m7", ram=f"{ram}B",
                                flash=f"{FLASH_BYTES}B", check=check, runs=1))


def plan_row(model: str, label: str, plan, peak: int, folder: Path) -> McuRow:
    """One plan linked at every LINKS size, then run under qemu on the smallest that holds it."""
    stem = folder / f"{model}.{'reuse' if label == 'reuse' else 'smallest'}"
    plan_path = Path(f"{stem}.plan.json")
    write_plan(plan, str(plan_path))
    ram: dict[int, int | None] = {}
    flash = 0
    for size in LINKS:
        try:
            result = _export(plan_path, Path(f"{stem}.{size // KIB}k"), size, check=False)
            ram[size], flash = result.report["mcu"]["ram_used"], result.report["mcu"]["flash_used"]
        except TightfitError:
            ram[size] = None  # the linker's overflow
    run_at = next((size for size in LINKS if ram[size] is not None), BOARD_RAM)
    try:
        result = _export(plan_path, Path(f"{stem}.run"), run_at, check=True)
    except TightfitError as e:
        return McuRow(model, label, peak, ram, flash, None, False, str(e).splitlines()[0][:120])
    flash = flash or result.report["mcu"]["flash_used"]
    got = result.report.get("mcu_check", {})
    return McuRow(model, label, peak, ram, flash, got.get("instructions"), bool(got.get("ok")),
                  "" if run_at in LINKS else f"run with {run_at // KIB} KiB of RAM")


def mcu_rows(path: Path, model: str, folder: Path) -> list[McuRow]:
    """Reuse and the smallest plan of an int8 model file on the Cortex-M7 (see the module text)."""
    rows = int8_rows(path)
    reuse = rows[0]
    smallest = min(rows, key=lambda r: r.with_input)
    chosen = [("reuse", reuse)] + ([] if smallest is reuse else [("smallest: " + smallest.name, smallest)])
    return [plan_row(model, label, r.plan, r.with_input, folder) for label, r in chosen]


EMX_RAM = 16 * 2**20  # the measuring link: RAM in the board's 16 MiB PSRAM
EMX_FLASH = 4 * 2**20  # the board's code memory
EMX_STACK = 256 * KIB  # the measuring run's stack
EMX_MARGIN = 64 * KIB  # of the measuring link's RAM, left to .data, .bss and padding besides pool, I/O and stack

EMX_HEADER = """/* emx-onnx-cgen's model() (model.c, generated) behind the interface of a library tightfit
 * exports, so that tightfit's Cortex-M test program runs it (bench/mcu.py). */
#ifndef EMX_H
#define EMX_H
#define EMX_ARENA_BYTES {pool} /* malloc's pool: emx's temporaries */
#define EMX_INPUT_ELEMS {inputs}
#define EMX_OUTPUT_ELEMS {outputs} /* the model's outputs, then the pool's high-water mark */
int emx_run(void *arena, float *io);
void emx_read_output(void *arena, float *io);
#endif
"""

EMX_WRAPPER = r"""#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "emx.h"
#include "model.c"

static uint8_t *emx_pool;
static size_t emx_used, emx_high;
static int emx_failed;
static float emx_out[EMX_OUTPUT_ELEMS - 1];

/* newlib's malloc takes its memory here: from the arena, bounded and counted (libnosys' own
 * _sbrk grows without a bound, so a program could use RAM no link accounts). */
void *_sbrk(ptrdiff_t incr)
{
    if ((incr < 0 && (size_t)-incr > emx_used) || (incr > 0 && (size_t)incr > EMX_ARENA_BYTES - emx_used)) {
        emx_failed = 1;
        errno = ENOMEM;
        return (void *)-1;
    }
    void *at = emx_pool + emx_used;
    emx_used = (size_t)((ptrdiff_t)emx_used + incr);
    if (emx_used > emx_high) {
        emx_high = emx_used;
    }
    return at;
}

int emx_run(void *arena, float *io)
{
    emx_pool = arena;
    model((const float (*)%(input)s)io, (float (*)%(output)s)emx_out);
    return emx_failed; /* emx's model() returns early, its output unset, when a malloc fails */
}

void emx_read_output(void *arena, float *io)
{
    uint32_t high = (uint32_t)emx_high;
    (void)arena;
    memcpy(io, emx_out, sizeof emx_out);
    memcpy(io + EMX_OUTPUT_ELEMS - 1, &high, sizeof high);
}
"""


def emx_onnx(model: str, folder: Path) -> Path:
    """The model's ONNX QDQ file: mbv2-0.35-144's own, a .tflite's QDQ form (written once)."""
    path = model_file(model, folder)
    if path.suffix != ".tflite":
        return path
    out = folder / f"{model}.qdq.onnx"
    if not out.exists():
        onnx.save(tflite_as_onnx(path), out)
    return out


def emx_input(model: str, folder: Path, onnx_path: Path) -> np.ndarray:
    """A seeded input in the ONNX file's layout: a .tflite's random int8 image as its real values
    (what tightfit's run of the .tflite takes, quantized back exactly), else standard normal."""
    path = model_file(model, folder)
    if path.suffix == ".tflite":
        g = load_tflite(path)
        (scale, zero), _ = edge_quant(g)
        return (random_int8(g, 0).astype(np.float32) - np.float32(zero)) * np.float32(scale)
    shape = [d.dim_value for d in onnx.load(onnx_path, load_external_data=False).graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(0).standard_normal(shape, dtype=np.float32)


def output_step(m: onnx.ModelProto) -> float | None:
    """The quantization step of the model's output where a DequantizeLinear makes it."""
    node = next((n for n in m.graph.node if m.graph.output[0].name in n.output), None)
    consts = {t.name: t for t in m.graph.initializer}
    if node is None or node.op_type != "DequantizeLinear" or node.input[1] not in consts:
        return None
    return float(onnx.numpy_helper.to_array(consts[node.input[1]]).reshape(-1)[0])


def write_emx_library(lib: Path, x: np.ndarray, outputs: int, pool: int) -> None:
    """emx.h / emx.c around model.c, and the tf_kernels.c a library has (empty: no tightfit kernel)."""
    dims = lambda shape: "".join(f"[{d}]" for d in shape[1:])  # noqa: E731
    (lib / "emx.h").write_text(EMX_HEADER.format(pool=pool, inputs=x.size, outputs=outputs + 1))
    (lib / "emx.c").write_text(EMX_WRAPPER % {"input": dims(x.shape), "output": f"[{outputs}]"})
    (lib / "tf_kernels.c").write_text("/* emx-onnx-cgen's program uses no tightfit kernel: its code is model.c */\n")


def emx_row(model: str, folder: Path) -> McuRow:
    """emx-onnx-cgen's program for the model on the Cortex-M7 (the module text says how)."""
    none = {size: None for size in LINKS}
    emx, src = emx_program(), emx_onnx(model, folder)
    if not emx.exists():
        return McuRow(model, "emx-onnx-cgen", None, none, 0, None, False, "emx-onnx-cgen not installed (pip install -e .[bench])")
    lib = folder / f"{model}.emx"
    lib.mkdir(parents=True, exist_ok=True)
    gen = subprocess.run([str(emx), "compile", "--model-name", "model", "--large-weight-threshold", "0", str(src),
                          str(lib / "model.c")], capture_output=True, text=True)
    if gen.returncode != 0:
        return McuRow(model, "emx-onnx-cgen", None, none, 0, None, False, "emx-onnx-cgen: " + _one_line(gen.stderr + gen.stdout))
    import onnxruntime as ort

    m, x = onnx.load(src), emx_input(model, folder, src)
    ref = ort.InferenceSession(m.SerializeToString()).run(None, {m.graph.input[0].name: x})[0].reshape(-1)
    pool = EMX_RAM - EMX_STACK - 4 * x.size - EMX_MARGIN
    try:
        write_emx_library(lib, x, ref.size, pool)
        measure = build_mcu(lib, "emx", "cortex-m7", EMX_RAM, EMX_FLASH, lib / "measure.elf", stack_bytes=EMX_STACK)
    except TightfitError as e:
        return McuRow(model, "emx-onnx-cgen", None, none, 0, None, False, _one_line(str(e)))
    try:
        ran = run_qemu_measured(measure, x, timeout_s=1800)
    except TightfitError as e:
        why = (f"does not fit: its temporaries need more than the {pool / 2**20:.1f} MiB pool qemu's 16 MiB board "
               "RAM leaves (a malloc failed)") if "emx_run failed" in str(e) else _one_line(str(e))
        return McuRow(model, "emx-onnx-cgen", None, none, measure.flash_used, None, False, why, "not run")
    used = int(ran.output[-1:].view(np.uint32)[0])
    stack = max(DEFAULT_STACK_BYTES, -(-ran.stack_used // 1024) * 1024)
    try:
        write_emx_library(lib, x, ref.size, -(-used // 16) * 16)
        final = build_mcu(lib, "emx", "cortex-m7", EMX_RAM, EMX_FLASH, lib / "emx.elf", stack_bytes=stack)
    except TightfitError as e:
        return McuRow(model, "emx-onnx-cgen", None, none, measure.flash_used, ran.instructions, False, _one_line(str(e)))
    off = float(np.abs(ran.output[:-1] - ref).max()) / (output_step(m) or 1.0)
    ram = {size: final.ram_used if final.ram_used <= size else None for size in LINKS}
    return McuRow(model, "emx-onnx-cgen", None, ram, final.flash_used, ran.instructions, off <= 1.0,
                  f"whole RAM {final.ram_used / KIB:.1f} KiB: pool {used / KIB:.1f} KiB, float I/O buffer "
                  f"{final.io_buffer / KIB:.1f} KiB, stack {stack // KIB} KiB", f"max {off:.2g} LSB from onnxruntime's",
                  final.ram_used)


def _one_line(text: str) -> str:
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return ([l for l in lines if "error" in l.lower()] or lines[-1:] or ["?"])[0][:120]


def _ram_text(n: int | None) -> str:
    return "no fit" if n is None else f"{n / KIB:.1f} KiB"


def print_rows(rows: list[McuRow]) -> None:
    print(f"{'model':<14} {'plan':<48} {'peak kB':>8} {'RAM @256K':>10} {'RAM @512K':>10} {'flash KiB':>9} "
          f"{'instructions':>14} outputs")
    for r in rows:
        ins = f"{r.instructions:,}" if r.instructions is not None else "-"
        peak = f"{r.peak / 1e3:>8.1f}" if r.peak is not None else f"{'-':>8}"
        outputs = r.outputs or ("equal" if r.ok else "NOT RUN/DIFFER")
        print(f"{r.model:<14} {r.plan[:48]:<48} {peak} {_ram_text(r.ram[LINKS[0]]):>10} "
              f"{_ram_text(r.ram[LINKS[1]]):>10} {r.flash / KIB:>9.1f} {ins:>14} "
              f"{outputs}{' (' + r.note + ')' if r.note else ''}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", default=None, help="where the int8 files and exports are made; default a temporary one")
    ap.add_argument("--models", default=",".join(MODELS))
    add_write_docs(ap)
    args = ap.parse_args()
    shown = command_line("mcu.py")
    with tempfile.TemporaryDirectory() as tmp, docs_section("mcu", args.write_docs, shown):
        folder = Path(args.folder or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        header(__doc__.splitlines()[0])
        rows = [row for m in args.models.split(",") for row in mcu_rows(model_file(m, folder), m, folder)]
        print_rows(rows)
        print("instructions: qemu's count (-icount), not a timing, so the load does not change them; RAM can be below\n"
              "peak + stack: the program streams the input by rows (no input buffer), the peak counts it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
