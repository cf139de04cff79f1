"""In-place and overlapping buffers (issue 40 point 4) on int8 MobileNetV2, beside MCUNetV2.

    python bench/inplace.py [--write-docs] [--skip-mcu] [--folder DIR]

Models: torchvision's mobilenet_v2 (random weights, torch seed 0) at 1.0 x 224 and 0.35 x 144,
exported to ONNX and quantized by onnxruntime's `quantize_static` (its defaults after its advised
`quant_pre_process`; calibrated on CALIBRATION_SAMPLES standard-normal inputs of seeds 0, 1, ...).
The QDQ file's input is float; its first layer quantizes it to the int8 image a microcontroller
would hold.

Part 1, mobilenet_v2 224 int8: peak run memory (arena + the largest step's kernel temporaries;
kB = 1000 B) of layer by layer with reuse, the smallest plan by parts (the parts search's
memory side) and the smallest tiled plan (the tiling search's, parts excluded), each without and
with in-place / overlapping outputs (plan/overlay.overlap_in_place: a layer's output over its own
input's bytes where its kernel's walk allows, ops/walks.py). "with input" is the checked plan's
peak; "without input" (MCUNetV2's accounting) leaves out the buffers of the float input and of
the int8 image quantized from it (their bytes set to 0; the live-bytes lower bound, which reuse's
placement reaches). Every plan passes the checker; the in-place plans' outputs equal the plain
ones' bit for bit. MCUNetV2 (Lin et al. 2021): 1372 kB layer by layer, 172 kB by patches, input
excluded. Goal: below 172 kB.

Part 2, mbv2-w0.35 at 144 int8 on a Cortex-M7 (`tightfit export --target cortex-m7`): the
smallest plan of part 1's kinds exported, linked for 256 KiB of RAM, run under qemu (outputs
compared with the Python executor's); RAM = the link's whole RAM use (arena + I/O buffer + stack
reserved + .data + .bss, from the ELF's sections), flash = code + weights + .data's initial values.
Goal: RAM within 256 KiB (the 295 / 296 kB layer-by-layer records of TinyEngine and X-CUBE-AI).

`int8_rows(path)` gives part 1's figures for any int8 ONNX file (bench/int8.py's rows).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from benchlib import add_write_docs, command_line, docs_section, header, loaded, verdict
from tightfit.frontend.load import load
from tightfit.frontend.onnx_import import load_onnx
from tightfit.graph.ir import Graph
from tightfit.plan.check import check_plan
from tightfit.plan.lifetimes import lifetimes
from tightfit.plan.offsets import lower_bound
from tightfit.plan.overlay import overlap_in_place
from tightfit.plan.place import place
from tightfit.plan.schema import Plan
from tightfit.runtime.executor import ArenaExecutor
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.parts.phase_search import search_parts
from tightfit.techniques.parts.planner import PartsOptions, draft_parts
from tightfit.techniques.reuse.planner import plan_reuse, plan_reuse_overlapping
from tightfit.techniques.tiling import format_tiling, plan_tiling
from tightfit.techniques.tiling.config_search import TilingOptions, search_tiling

CALIBRATION_SAMPLES = 4
MCUNET_LBL_KB, MCUNET_PATCH_KB = 1372, 172
RECORD_LBL_KB = 295  # TinyEngine / X-CUBE-AI 7.3, mbv2-w0.35 at 144, layer by layer (issue 40)
RAM_BYTES = 256 * 1024
FLASH_BYTES = 2 * 2**20


def quantized_mbv2(width: float, size: int, folder: Path) -> Path:
    """torchvision's mobilenet_v2(width_mult=width) at size x size as an int8 QDQ file (made once
    per folder)."""
    path = folder / f"mbv2_{width:g}_{size}_int8.onnx"
    if path.exists():
        return path
    import onnx
    import torch
    import torchvision
    from onnxruntime.quantization import CalibrationDataReader, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from tightfit.frontend.torch_import import export_onnx

    torch.manual_seed(0)
    model = export_onnx(torchvision.models.mobilenet_v2(width_mult=width).eval(), (1, 3, size, size))
    src = folder / f"mbv2_{width:g}_{size}.float.onnx"
    onnx.save(model, src)
    quant_pre_process(str(src), str(src))
    name = model.graph.input[0].name
    samples = iter([{name: np.random.default_rng(i).standard_normal((1, 3, size, size), dtype=np.float32)}
                    for i in range(CALIBRATION_SAMPLES)])
    reader = type("Reader", (CalibrationDataReader,), {"get_next": lambda self: next(samples, None)})()
    quantize_static(str(src), str(path), reader)
    return path


@dataclass(frozen=True)
class Row:
    name: str
    plan: Plan
    with_input: int
    without_input: int


def input_buffers(plan: Plan, g: Graph) -> set[int]:
    """Buffers holding the model input or the int8 image its first quantize layer makes of it."""
    image = {g.inputs[0]} | {l.output for l in g.layers if l.op == "quantize" and l.inputs[0] == g.inputs[0]}
    return {a.buffer for s in plan.steps() for a in (s.out, *s.inputs) if a.tensor in image}


def without_input(plan: Plan, g: Graph) -> int:
    """Run memory with the input's buffers of no size (an overlay block keeps its other members)."""
    gone = input_buffers(plan, g)
    stripped = replace(plan, buffers=tuple(replace(b, shape=(0,) + b.shape[1:]) if b.id in gone else b for b in plan.buffers))
    life = lifetimes(stripped, [g])
    return lower_bound(life.reqs) + max(life.step_scratch, default=0)


def _row(name: str, plan: Plan, g: Graph) -> Row:
    return Row(name, plan, check_plan(plan, [g]).peak_bytes, without_input(plan, g))


def int8_rows(path: Path, tiling: bool = True) -> list[Row]:
    """Reuse, parts (smallest found) and tiling (smallest found) plans of an int8 model file (any
    file `tightfit.frontend.load.load` reads), each without and with in-place / overlapping
    outputs, checked."""
    g = load(str(path))
    model = PlannedModel(g, str(path))
    no_time = lambda *a: 0.0  # noqa: E731  (memory is asked, not time)
    rows = [_row("layer by layer + reuse", plan_reuse(model), g),
            _row("layer by layer + reuse, in-place", plan_reuse_overlapping(model), g)]
    c = search_parts(model, no_time).chosen.config
    label = f"parts ({len(c.phases)} layers split)"
    for inplace in (False, True):
        draft = draft_parts(model, c.phases_dict(), c.source_phases, options=PartsOptions(c.align, c.held, inplace=inplace))
        plan = overlap_in_place(draft, [g], "improve") if inplace else plan_from(draft, g)
        rows.append(_row(label + (", in-place" if inplace else ""), plan, g))
    if tiling:
        groups = search_tiling(model, no_time, 1, options=TilingOptions(front_points=0, parts=False)).chosen.config.groups
        plain = plan_tiling(model, groups)
        rows.append(_row(f"tiled {format_tiling(groups)}", plain, g))
        rows.append(_row(f"tiled {format_tiling(groups)}, in-place", overlap_in_place(plain, [g], "improve"), g))
    return rows


def plan_from(draft: Plan, g: Graph) -> Plan:
    return place(draft, [g], "improve")


def same_outputs(a: Plan, b: Plan, g: Graph) -> bool:
    x = np.random.default_rng(7).standard_normal(g.shape(g.inputs[0]), dtype=np.float32)
    ya = ArenaExecutor(a, [g], fill_nan=True).run(x)[0][g.outputs[0]].copy()
    return bool(np.array_equal(ArenaExecutor(b, [g], fill_nan=True).run(x)[0][g.outputs[0]], ya))


def part1(folder: Path) -> Row:
    path = quantized_mbv2(1.0, 224, folder)
    g = load_onnx(path)
    t0 = time.perf_counter()
    rows = int8_rows(path)
    print(f"1. mobilenet_v2 224 int8 (QDQ, quantize_static), peak run memory in kB = 1000 B; planned and searched in "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"{'plan':<60} {'with input':>10} {'without':>8}  in-place == plain")
    for plain, over in zip(rows[::2], rows[1::2]):
        for r in (plain, over):
            same = "" if r is plain else ("yes" if same_outputs(plain.plan, over.plan, g) else "NO")
            print(f"{r.name[:60]:<60} {r.with_input / 1e3:>10.1f} {r.without_input / 1e3:>8.1f}  {same}{loaded()}")
    print(f"{'MCUNetV2 (paper): layer by layer -> patches':<60} {'':>10} {f'{MCUNET_LBL_KB} -> {MCUNET_PATCH_KB}':>8}")
    best = min(rows, key=lambda r: r.without_input)
    print(f"smallest: {best.name}, {best.without_input / 1e3:.1f} kB without input; below MCUNetV2's {MCUNET_PATCH_KB} kB: "
          + verdict([(best.without_input < MCUNET_PATCH_KB * 1000, f"{best.without_input / 1e3:.1f} kB")]))
    return best


def part2(folder: Path) -> None:
    from tightfit.files import write_plan
    from tightfit.options import ExportOptions
    from tightfit.pipeline import export

    path = quantized_mbv2(0.35, 144, folder)
    rows = int8_rows(path)
    best = min(rows, key=lambda r: r.with_input)
    plan_path = folder / "mbv2_035_144.plan.json"
    write_plan(best.plan, str(plan_path))
    out = folder / "mbv2_035_144_m7"
    result = export(ExportOptions(str(plan_path), str(out), force=True, target="cortex-m7", ram=f"{RAM_BYTES}B",
                                  flash=f"{FLASH_BYTES}B", check=True, runs=1))
    mcu = result.report["mcu"]
    print(f"\n2. mbv2-w0.35 144 int8 on a Cortex-M7 (qemu), the smallest plan: {best.name} "
          f"({best.with_input / 1e3:.1f} kB with input)")
    for r in rows:
        print(f"   {r.name[:60]:<60} {r.with_input / 1e3:>8.1f} kB with input, {r.without_input / 1e3:.1f} kB without")
    ram = mcu["ram_used"]
    print(f"RAM {ram} B = {ram / 1024:.1f} KiB (arena {mcu['arena']} B, I/O buffer {mcu['io_buffer']} B, stack reserved "
          f"{mcu['stack']} B, other .data/.bss {ram - mcu['arena'] - mcu['io_buffer'] - mcu['stack'] - mcu['heap']} B); "
          f"flash {mcu['flash_used']} B (code {mcu['text']} B, weights {mcu['rodata']} B)")
    print("\n".join("   " + line for line in result.text.splitlines()))
    ran = result.report.get("mcu_check", {})
    print("within 256 KiB of RAM, below the 295 kB layer-by-layer records: "
          + verdict([(ram <= RAM_BYTES, f"RAM {ram / 1024:.1f} KiB"), (ram < RECORD_LBL_KB * 1000, f"{ram / 1e3:.1f} kB"),
                     (result.status == 0 and ran.get("ok", False), "not run under qemu, or outputs differ")]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-mcu", action="store_true", help="part 1 only")
    ap.add_argument("--folder", default=None, help="where the int8 files are made (and kept); default a temporary one")
    add_write_docs(ap)
    args = ap.parse_args()
    shown = command_line("inplace.py")
    with tempfile.TemporaryDirectory() as tmp, docs_section("inplace", args.write_docs, shown):
        folder = Path(args.folder or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        header(__doc__.splitlines()[0])
        part1(folder)
        if not args.skip_mcu:
            part2(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
