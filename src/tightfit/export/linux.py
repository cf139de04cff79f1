"""Linux targets besides the host (`tightfit export --target aarch64-linux`): the host test
program (export/c/main.c, the model's files and kernels/tf_kernels.c as they are) cross-compiled
for a 64-bit Arm board and, with --check, run under qemu's user-mode emulator on this machine.

The exported folder is the host one with a Makefile for the cross compiler (`make` builds the
NEON kernels, `make portable` the portable C99 ones, `make run-qemu` runs the program under
qemu). The program is linked statically, so qemu runs it without the target's C library (and with
`-L SYSROOT` where a static link is not possible). Timings and memory under an emulator say
nothing of the board: a check compares outputs and says which kernel path ran (the program
prints tf_simd()), nothing else."""
from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from tightfit import children
from tightfit.export.build import Built, build, run
from tightfit.export.codegen import Sources
from tightfit.export.errors import ExportError, ToolchainMissingError


@dataclass(frozen=True)
class LinuxTarget:
    """A Linux target reached with a cross compiler and qemu's user-mode emulator."""

    name: str
    cc: str
    qemu: str
    sysroot: str          # the target's C library, for a program not linked statically
    cflags: tuple[str, ...]
    simd_width: int       # what tf_simd() says for the vector kernels (the portable path says 0)
    packages: str         # Debian's packages of the compiler, the target's C library and qemu


# aarch64 always has NEON (Advanced SIMD is part of ARMv8-A): no -mfpu flag, and the kernels'
# guard (__ARM_NEON) holds with the default flags. -march=native means nothing to a cross compiler.
TARGETS: dict[str, LinuxTarget] = {
    "aarch64-linux": LinuxTarget(
        "aarch64-linux", "aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu",
        ("-std=c99", "-O3", "-ffp-contract=fast"), 4, "gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user",
    ),
}
PORTABLE = "-DTF_SIMD=0"  # the kernels' portable C99 path (tf_kernels.c's guard)


def linux_target(name: str) -> LinuxTarget:
    if name not in TARGETS:
        raise ExportError(f"unknown Linux target {name!r}; known: {', '.join(TARGETS)}")
    return TARGETS[name]


def cflags(target: LinuxTarget, simd: bool = True) -> list[str]:
    """The target's default flags: its vector kernels, or with `simd` False the portable ones."""
    return list(target.cflags) + ([] if simd else [PORTABLE])


@functools.cache
def toolchain_problem(name: str, with_qemu: bool = True) -> str | None:
    """None when the cross compiler (with the target's C library) and qemu are here; else why not."""
    target = linux_target(name)
    missing = [tool for tool in (target.cc, *([target.qemu] if with_qemu else [])) if shutil.which(tool) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (Debian: apt-get install {target.packages})"
    libc = children.run([target.cc, "-print-file-name=libc.a"], text=True).stdout.strip()
    if not Path(libc).is_absolute():
        return f"{target.cc} has no C library for {name} (Debian: apt-get install {target.packages})"
    return None


def makefile(target: LinuxTarget, name: str) -> str:
    """The exported folder's Makefile for `target` (replaces the host one)."""
    flags = " ".join(target.cflags)
    return f"""# Builds {name}, the exported model's test program, for {target.name} with {target.cc}, as
# `tightfit export --target {target.name} --check` builds it:
#   make            the vector kernels (NEON: aarch64 always has it), linked statically
#   make portable   {name}-portable, the portable C99 kernels ({PORTABLE})
#   make run-qemu   runs {name} under {target.qemu} on this machine: input.bin -> output.bin
#                   (float32, in the model file's layout; timings under an emulator say nothing of the board)
#   make clean
# On the board: copy {name} (and weights.bin, if the export wrote one) and run
#   ./{name} INPUT.bin OUTPUT.bin [RUNS]
# For a given core, name its flags: make CFLAGS='{flags} -mcpu=cortex-a72'
ifeq ($(origin CC),default)
CC = {target.cc}
endif
CFLAGS ?= {flags}
WARNINGS = -Wall -Wextra -pedantic
LDFLAGS ?= -static
QEMU ?= {target.qemu} -L {target.sysroot}
SOURCES = main.c {name}.c tf_kernels.c
HEADERS = {name}.h tf_kernels.h

{name}: $(SOURCES) $(HEADERS)
\t$(CC) $(CFLAGS) $(WARNINGS) $(LDFLAGS) -o $@ $(SOURCES) -lm -pthread

portable: {name}-portable

{name}-portable: $(SOURCES) $(HEADERS)
\t$(CC) $(CFLAGS) {PORTABLE} $(WARNINGS) $(LDFLAGS) -o $@ $(SOURCES) -lm -pthread

run-qemu: {name}
\t$(QEMU) ./{name} input.bin output.bin

clean:
\trm -f {name} {name}-portable

.PHONY: portable run-qemu clean
"""


def write_files(sources: Sources, folder: Path, target: str) -> None:
    """The exported files into `folder`, with the target's Makefile in place of the host one."""
    t = linux_target(target)
    for file_name, data in sources.files.items():
        (Path(folder) / file_name).write_bytes(data)
    (Path(folder) / "Makefile").write_text(makefile(t, sources.name))


def build_for(target: str, directory: Path, name: str, flags: Sequence[str] | None = None, cc: str | None = None) -> Built:
    """Cross-compile the exported program in `directory` (warnings are errors), statically."""
    problem = toolchain_problem(target, with_qemu=False)
    if problem and cc is None:
        raise ToolchainMissingError(f"{target}: cannot build: {problem}")
    t = linux_target(target)
    return build(Path(directory), name, cc or t.cc, list(flags) if flags is not None else cflags(t))


def launcher(target: str) -> list[str]:
    t = linux_target(target)
    return [t.qemu, "-L", t.sysroot]


@dataclass(frozen=True)
class CrossCheck:
    """An exported program cross-compiled, run under qemu on the seeded inputs and compared."""

    name: str
    target: str
    ok: bool
    max_abs_diff: float
    tolerance: float
    simd: int            # the vector width the program's kernels were built with (0: portable)
    code_bytes: int      # the binary's text and data besides compiled-in weights (libc included)
    seconds: float       # the emulator's median run: not the board's speed
    built: Built

    def lines(self) -> list[str]:
        from tightfit.units import human

        path = f"vector kernels ({self.simd} floats)" if self.simd > 0 else "portable C99 kernels"
        return [f"under {linux_target(self.target).qemu}: outputs {'match' if self.ok else 'DIFFER'} "
                f"(max abs diff {self.max_abs_diff:.3g}, tolerance {self.tolerance:.3g}); {path}",
                f"{self.built.binary.name} for {self.target}: code {human(self.code_bytes)} (static, libc included); "
                f"{self.seconds:.3g} s a run emulated (not the board's speed)"]


def check_for(target: str, sources: Sources, directory: Path, inputs: Sequence[np.ndarray], references: Sequence[np.ndarray],
              flags: Sequence[str] | None = None, cc: str | None = None, timeout_s: float = 600) -> CrossCheck:
    """Cross-build the exported program, run it under qemu on `inputs` (every CNN's, in order) and
    compare its outputs with `references` (every output of every CNN, in order)."""
    from tightfit.tolerance import compare, worst

    problem = toolchain_problem(target)
    if problem:
        raise ToolchainMissingError(f"{target}: cannot check: {problem}")
    directory = Path(directory)
    built = build_for(target, directory, sources.name, flags, cc)
    weights = directory / "weights.bin" if sources.weights_in_file else None
    ran = run(built.binary, inputs, [r.size for r in references], 1, weights, timeout_s, launcher=launcher(target))
    c = worst(compare(got.reshape(ref.shape), ref) for got, ref in zip(ran.outputs, references))
    code = built.text + built.data - (0 if sources.weights_in_file else sources.weight_bytes)
    return CrossCheck(sources.name, target, c.ok, c.max_abs_diff, c.tolerance, ran.simd, code, ran.median_seconds, built)
