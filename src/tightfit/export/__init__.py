"""C export: a plan as a self-contained C99 library and test program (codegen), built, run,
compared with given reference outputs and measured (build), or linked for a microcontroller (mcu).
It reads the plan format and knows no planner; the face (stages.check_export) supplies the inputs and
the reference executor's outputs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from tightfit.export.build import Built, build, run, write_dir
from tightfit.export.codegen import Sources, c_name, generate
from tightfit.export.errors import ExportError
from tightfit.graph.ir import Graph
from tightfit.plan.schema import Plan
from tightfit.tolerance import compare, worst

# The whole process may hold this much besides weights and arena: libc, the program's code and
# stack, stdio buffers (issue 21's acceptance margin).
PROCESS_SLACK = 2 * 2**20


def export(plan: Plan, graphs: Sequence[Graph], out: str | Path, name: str | None = None,
           weights: str = "auto", force: bool = False) -> Sources:
    """Write the C library and test program of `plan` into folder `out` (whole, or nothing; an
    existing non-empty `out` is replaced only with `force`)."""
    sources = generate(plan, graphs, name or default_name(plan), weights)
    write_dir(sources, Path(out), force)
    return sources


def default_name(plan: Plan) -> str:
    spec = plan.models[0].spec if len(plan.models) == 1 else "app"
    return c_name(Path(spec).stem if spec.endswith(".onnx") else spec.split(":")[-1])


@dataclass(frozen=True)
class Check:
    """An exported program built, run on the seeded inputs, compared and measured."""

    name: str
    ok: bool
    max_abs_diff: float
    tolerance: float
    arena_bytes: int
    weight_bytes: int
    code_bytes: int      # the binary's text and data besides compiled-in weights
    stack_bound: int
    peak_rss: int        # the whole process, measured
    median_seconds: float
    built: Built

    @property
    def budget_bytes(self) -> int:
        """What the process may hold: weights + arena + the slack for libc, code and stack."""
        return self.weight_bytes + self.arena_bytes + PROCESS_SLACK

    def lines(self) -> list[str]:
        from tightfit.units import human

        return [
            f"outputs: {'match' if self.ok else 'DIFFER'} (max abs diff {self.max_abs_diff:.3g}, tolerance {self.tolerance:.3g})",
            f"weights {human(self.weight_bytes)} + arena {human(self.arena_bytes)} + code {human(self.code_bytes)}"
            f" (stack bound {self.stack_bound} B) = {human(self.weight_bytes + self.arena_bytes + self.code_bytes)}",
            f"measured whole-process peak {human(self.peak_rss)} (limit weights + arena + 2 MiB = {human(self.budget_bytes)}:"
            f" {'within' if self.peak_rss <= self.budget_bytes else 'OVER'}); {1 / self.median_seconds:.1f} runs/s",
        ]


@dataclass(frozen=True)
class BuildOptions:
    """How `check` builds and runs an exported program: the compiler (default $CC or cc) and its
    flags (default: build.DEFAULT_CFLAGS), the runs timed (the median is kept), whether with
    -fsanitize=address,undefined, and the seconds a run may take."""

    cc: str | None = None
    cflags: Sequence[str] | None = None
    runs: int = 1
    sanitize: bool = False
    timeout_s: float = 600


def check(sources: Sources, directory: str | Path, inputs: Sequence[np.ndarray], references: Sequence[np.ndarray],
          options: BuildOptions = BuildOptions()) -> Check:
    """Build the exported program, run it on `inputs` (every CNN's input, in order), compare its
    outputs with `references` (every output of every CNN, in order), and measure the whole process;
    a run past `options.timeout_s` is an ExportError."""
    directory = Path(directory)
    built = build(directory, sources.name, options.cc, options.cflags, options.sanitize, defines=sources.defines)
    weights = directory / "weights.bin" if sources.weights_in_file else None
    ran = run(built.binary, inputs, [r.size for r in references], options.runs, weights, options.timeout_s)
    c = worst(compare(got.reshape(ref.shape), ref) for got, ref in zip(ran.outputs, references))
    code = built.text + built.data - (0 if sources.weights_in_file else sources.weight_bytes)
    return Check(sources.name, c.ok, c.max_abs_diff, c.tolerance, sources.arena_bytes, sources.weight_bytes,
                 code, built.stack_bound, ran.peak_rss, ran.median_seconds, built)


@dataclass(frozen=True)
class McuCheck:
    """An exported program linked for a microcontroller, run under qemu, compared."""

    ok: bool
    max_abs_diff: float
    tolerance: float
    stack_used: int
    seconds: float
    instructions: int  # executed by one inference, counted under qemu -icount (the comparable cost)

    def summary(self) -> str:
        return (f"under qemu: outputs {'match' if self.ok else 'DIFFER'} (max abs diff {self.max_abs_diff:.3g}, "
                f"tolerance {self.tolerance:.3g}); stack used {self.stack_used} B; "
                f"{self.instructions:,} instructions per inference; {self.seconds:.2f} s")


def check_mcu(built, input: np.ndarray, reference: np.ndarray, timeout_s: float = 600) -> McuCheck:
    """Run a program built by mcu.build_mcu under qemu on CNN 0's `input`; compare its first
    output with `reference`."""
    from tightfit.export.mcu import run_qemu_measured

    ran = run_qemu_measured(built, input, timeout_s)
    c = compare(ran.output.reshape(reference.shape), reference)
    return McuCheck(c.ok, c.max_abs_diff, c.tolerance, ran.stack_used, ran.seconds, ran.instructions)


__all__ = ["Check", "ExportError", "McuCheck", "Sources", "check", "check_mcu", "export", "generate"]
