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
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchlib import add_write_docs, command_line, docs_section, header
from inplace import int8_rows, quantized_mbv2
from tflite_models import cached
from tightfit.errors import TightfitError
from tightfit.files import write_plan
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
    peak: int                      # the checked plan's peak run memory, input included
    ram: dict[int, int | None]     # link RAM size -> whole RAM used (None: the link overflowed)
    flash: int
    instructions: int | None       # per inference under qemu; None when the run failed
    ok: bool                       # outputs equal the Python executor's
    note: str = ""


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


def _ram_text(n: int | None) -> str:
    return "no fit" if n is None else f"{n / KIB:.1f} KiB"


def print_rows(rows: list[McuRow]) -> None:
    print(f"{'model':<14} {'plan':<48} {'peak kB':>8} {'RAM @256K':>10} {'RAM @512K':>10} {'flash KiB':>9} "
          f"{'instructions':>14} outputs")
    for r in rows:
        ins = f"{r.instructions:,}" if r.instructions is not None else "-"
        print(f"{r.model:<14} {r.plan[:48]:<48} {r.peak / 1e3:>8.1f} {_ram_text(r.ram[LINKS[0]]):>10} "
              f"{_ram_text(r.ram[LINKS[1]]):>10} {r.flash / KIB:>9.1f} {ins:>14} "
              f"{'equal' if r.ok else 'NOT RUN/DIFFER'}{' (' + r.note + ')' if r.note else ''}")


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
