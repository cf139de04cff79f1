"""Microcontroller target of `tightfit export`: an exported C library as a firmware project for a
Cortex-M with the user's RAM and flash sizes (library, startup code, linker script, test `main`,
semihosting shim, a Makefile for arm-none-eabi-gcc with a `run-qemu` target), built, and run under
qemu's MPS2 board with semihosting where a memory map of that board holds the sizes.

The exported directory holds `tf_kernels.c` and `<name>.c/.h` (the model; the header
defines `<NAME>_ARENA_BYTES`, `<NAME>_INPUT_ELEMS`, `<NAME>_OUTPUT_ELEMS`). To them this
module adds a startup file, a test program (`mcu_main.c`: input.bin -> run -> output.bin
through semihosting) and a linker script for the requested sizes, all from the templates
in `export/mcu/`. Where the header also declares `<name>_run_rows` and `<name>_read`, the
program reads the input from the host file row by row as the plan asks for it, and writes
the output in chunks, so RAM holds the arena and the stack and no tensor besides.
A program larger than the RAM or flash fails at link time, and that failure is turned into
one line that says what took the memory.
Around the inference the program counts SysTick cycles; qemu runs with -icount, so that count
gives the instructions one inference executed (McuRun.instructions), the comparable cost figure.
"""
from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from string import Template

import numpy as np

from tightfit import children
from tightfit.export.build import input_bytes
from tightfit.export.errors import DoesNotFitError, ExportError, ToolchainMissingError
from tightfit.units import human

CC = "arm-none-eabi-gcc"
SIZE = "arm-none-eabi-size"
NM = "arm-none-eabi-nm"
QEMU = "qemu-system-arm"

TEMPLATES = Path(__file__).parent  # the startup, shim, test main and linker script templates

DEFAULT_STACK_BYTES = 8192
DEFAULT_HEAP_BYTES = 0  # the library and the test program never allocate
_KEPT_SOURCES = ("startup_cortex_m.S", "tf_semihost.c", "tf_semihost.h")
_HOST_ONLY = ("main.c", "Makefile", "weights.bin")  # the host test program: not part of a firmware project
_ARENA_SYMBOL = "tf_arena"
_IO_SYMBOL = "tf_io"
_STACK_REPORT = re.compile(r"tightfit-mcu: stack used (\d+) of (\d+) bytes")
_COUNT_REPORT = re.compile(r"tightfit-mcu: inference took (\d+) core clock cycles")
# qemu's -icount: with shift 0 every instruction advances the virtual clock by exactly 1 ns, and
# the board's clocks (SysTick among them) run on that virtual clock, so the test program's
# SysTick count, times the nanoseconds of one core clock cycle, is the instructions executed.
ICOUNT_SHIFT = 0
_OVERFLOW = re.compile(r"region `(RAM|FLASH)' overflowed by (\d+) bytes")


@dataclass(frozen=True)
class McuTarget:
    """A core and the qemu board that emulates it, with the board's memory map."""

    name: str
    cpu_flags: tuple[str, ...]
    qemu_machine: str
    flash_origin: int
    board_flash_bytes: int
    ram_origin: int
    board_ram_bytes: int
    psram_origin: int
    psram_bytes: int
    core_clock_hz: int  # qemu's clock of the board's core, the one SysTick counts

    def instructions(self, cycles: int) -> int:
        """The instructions qemu -icount shift=ICOUNT_SHIFT executed in `cycles` of the core clock."""
        ns_per_instruction = 2**ICOUNT_SHIFT
        return cycles * 10**9 // (self.core_clock_hz * ns_per_instruction)


# Memory maps of qemu's hw/arm/mps2.c, as in Arm's AN386 and AN500 application notes:
# ZBT SSRAM1 (4 MiB at 0x0) is the code memory the core boots from, ZBT SSRAM2&3
# (4 MiB at 0x20000000) the data memory, and 16 MiB of PSRAM (at 0x60000000 on AN500, at
# 0x21000000 on AN386). qemu treats all as RAM; the code memory (or the PSRAM) stands for flash.
# Both boards clock the core at 25 MHz (SYSCLK_FRQ in hw/arm/mps2.c).
_MPS2_CORE_HZ = 25_000_000
_MPS2_CODE = (0x00000000, 4 * 2**20)
_MPS2_SRAM = (0x20000000, 4 * 2**20)
TARGETS: dict[str, McuTarget] = {
    "cortex-m7": McuTarget(
        "cortex-m7", ("-mcpu=cortex-m7", "-mfpu=fpv5-d16", "-mfloat-abi=hard"), "mps2-an500",
        *_MPS2_CODE, *_MPS2_SRAM, 0x60000000, 16 * 2**20, _MPS2_CORE_HZ,
    ),
    "cortex-m4": McuTarget(
        "cortex-m4", ("-mcpu=cortex-m4", "-mfpu=fpv4-sp-d16", "-mfloat-abi=hard"), "mps2-an386",
        *_MPS2_CODE, *_MPS2_SRAM, 0x21000000, 16 * 2**20, _MPS2_CORE_HZ,
    ),
}
# ARMv7-M's default memory map: code 0x00000000-0x1FFFFFFF, SRAM 0x20000000-0x3FFFFFFF.
REGION_LIMIT = 512 * 2**20
BOOT_BYTES = 1024  # the vector table alone at the boot address, when flash lies elsewhere


@dataclass(frozen=True)
class Layout:
    """Where flash and RAM lie: in a memory map of the qemu board when one holds both sizes
    (`why_not` None), else in the architecture's default map (the program builds, qemu cannot
    run it: `why_not` says why)."""

    flash_origin: int
    ram_origin: int
    boot: bool  # the core boots from address 0, flash lies elsewhere: the vectors alone at 0
    why_not: str | None = None

    def where(self, core: McuTarget) -> str:
        if self.why_not:
            return f"ARMv7-M's default map (qemu's {core.qemu_machine} cannot hold these sizes)"
        return f"a memory map of qemu's {core.qemu_machine}" + (" (the vector table at 0x00000000)" if self.boot else "")


def choose_layout(core: McuTarget, ram_bytes: int, flash_bytes: int) -> Layout:
    """A memory map of the board that holds the user's sizes: flash in the code memory, or in the
    PSRAM when larger; RAM in the SRAM, or in the PSRAM when larger and the flash is not there."""
    flash_in_psram = flash_bytes > core.board_flash_bytes
    flash = core.flash_origin if not flash_in_psram else core.psram_origin if flash_bytes <= core.psram_bytes else None
    ram = (core.ram_origin if ram_bytes <= core.board_ram_bytes
           else core.psram_origin if ram_bytes <= core.psram_bytes and not flash_in_psram else None)
    if flash is not None and ram is not None:
        return Layout(flash, ram, flash_in_psram)
    why = (f"qemu's {core.qemu_machine} has {_size_text(core.board_flash_bytes)} of code memory, "
           f"{_size_text(core.board_ram_bytes)} of SRAM and {_size_text(core.psram_bytes)} of PSRAM: "
           f"it cannot hold --flash {_size_text(flash_bytes)} and --ram {_size_text(ram_bytes)} apart; "
           f"run the program on the device")
    return Layout(core.flash_origin, core.ram_origin, False, why)

_COMMON_CFLAGS = (
    "-mthumb", "-std=c99", "-O2", "-Wall", "-Wextra", "-fno-common",
    "-ffunction-sections", "-fdata-sections",
)
# Our own startup and semihosting replace crt0 and rdimon; newlib-nano gives memcpy/memset
# and libm. nosys.specs stubs the system calls nothing here makes.
_LINK_FLAGS = ("-nostartfiles", "--specs=nano.specs", "--specs=nosys.specs", "-Wl,--gc-sections")


@dataclass(frozen=True)
class LibraryInterface:
    """What the test program needs to know of an exported library, read from `<name>.h`."""

    input_elems: int
    output_elems: int
    # `<name>_run_rows` and `<name>_read` are there: the program streams the input from the
    # host file row by row and the output in chunks, so neither needs a buffer in RAM.
    streams: bool


@dataclass(frozen=True)
class McuBuild:
    """A linked program and where its bytes went (section sizes from `arm-none-eabi-size -A`)."""

    elf: Path
    name: str
    target: str
    ram_bytes: int
    flash_bytes: int
    input_elems: int
    output_elems: int
    input_streamed: bool  # read by rows from the host file: no input buffer in RAM
    text: int  # code, vector table and unwind tables
    rodata: int  # constants: the weights
    data: int  # initialised variables: RAM, and their initial values in flash
    bss: int  # zeroed variables: the arena and the I/O buffer
    stack: int  # reserved
    heap: int  # reserved
    arena: int
    io_buffer: int
    ram_used: int  # from RAM's start to the end of its last section, padding included
    flash_used: int
    qemu_problem: str | None = None  # why qemu cannot run it (no memory map of its board holds the sizes)

    def memory_report(self) -> str:
        other_ram = self.ram_used - self.arena - self.io_buffer - self.stack - self.heap
        io = "input streamed by rows, output in chunks" if self.input_streamed else f"I/O buffer {self.io_buffer} B"
        return (
            f"{self.target} ({self.elf.name}): RAM {self.ram_used} B of {self.ram_bytes} B "
            f"(arena {self.arena} B, {io}, stack {self.stack} B reserved, "
            f"heap {self.heap} B, other .data/.bss {other_ram} B); "
            f"FLASH {self.flash_used} B of {self.flash_bytes} B "
            f"(code {self.text} B, constants/weights {self.rodata} B, .data initial values {self.data} B)"
        )


@dataclass(frozen=True)
class McuRun:
    output: np.ndarray
    stack_used: int  # deepest stack of the run, measured by painting the stack
    stack_reserved: int
    seconds: float  # wall time of qemu, start-up included
    instructions: int  # executed by the inference (the run call), counted by qemu -icount through SysTick


def toolchain_available() -> str | None:
    """None when the cross compiler, newlib and qemu are all here; otherwise why not."""
    return _toolchain_problem(with_qemu=True)


@functools.cache
def _toolchain_problem(with_qemu: bool) -> str | None:
    missing = [tool for tool in (CC, SIZE, NM) if shutil.which(tool) is None]
    if with_qemu and shutil.which(QEMU) is None:
        missing.append(QEMU)
    if missing:
        return f"not installed: {', '.join(missing)} (Debian: apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm)"
    specs = children.run([CC, "-print-file-name=nano.specs"], text=True).stdout.strip()
    if not os.path.isabs(specs):
        return f"{CC} has no newlib (nano.specs not found; Debian: apt-get install libnewlib-arm-none-eabi)"
    if with_qemu:
        machines = children.run([QEMU, "-M", "help"], text=True).stdout
        absent = [t.qemu_machine for t in TARGETS.values() if t.qemu_machine not in machines]
        if absent:
            return f"{QEMU} lacks the boards {', '.join(absent)} (qemu 6.0 or later has them)"
    return None


def mcu_target(name: str) -> McuTarget:
    if name not in TARGETS:
        raise ExportError(f"unknown microcontroller target {name!r}; known: {', '.join(TARGETS)}")
    return TARGETS[name]


@dataclass(frozen=True)
class Device:
    """The microcontroller a program is linked for: its core (a TARGETS name), its RAM and flash,
    and the stack and heap the program sets aside in RAM."""

    target: str
    ram_bytes: int
    flash_bytes: int
    stack_bytes: int = DEFAULT_STACK_BYTES
    heap_bytes: int = DEFAULT_HEAP_BYTES


def write_mcu_sources(dest: Path, name: str, device: Device, library_dir: str = ".", makefile: str | None = None) -> Path:
    """Writes mcu_main.c, the startup, the semihosting calls, the linker script and a Makefile
    (`makefile`, default `Makefile.<target>`) into dest; returns the linker script. library_dir:
    the exported library, relative to dest. In dest, `make -f MAKEFILE` builds
    `<name>_<target>.elf`, and `make -f MAKEFILE run-qemu` runs it on qemu (input.bin -> output.bin)."""
    target, ram_bytes, flash_bytes = device.target, device.ram_bytes, device.flash_bytes
    stack_bytes, heap_bytes = device.stack_bytes, device.heap_bytes
    core = mcu_target(target)
    _check_sizes(core, ram_bytes, flash_bytes, stack_bytes, heap_bytes)
    interface = read_interface(dest / library_dir / f"{name}.h", name)
    for file_name in _KEPT_SOURCES:
        (dest / file_name).write_text((TEMPLATES / file_name).read_text())
    main = Template((TEMPLATES / ("mcu_main_rows.c.in" if interface.streams else "mcu_main.c.in")).read_text())
    (dest / "mcu_main.c").write_text(main.substitute(name=name, NAME=name.upper()))
    script = dest / f"{name}_{target}.ld"
    script.write_text(_linker_script(core, ram_bytes, flash_bytes, stack_bytes, heap_bytes))
    makefile = makefile or f"Makefile.{target}"
    layout = choose_layout(core, ram_bytes, flash_bytes)
    (dest / makefile).write_text(_makefile(core, name, Path(library_dir), Path(script.name), makefile, layout.why_not))
    return script


@dataclass(frozen=True)
class Project:
    """A firmware project written into a folder: the library, the support files around it."""

    name: str
    target: str
    ram_bytes: int
    flash_bytes: int
    stack_bytes: int
    heap_bytes: int
    support: tuple[str, ...]  # the files besides the library: startup, shim, test main, linker script, Makefile


def write_project(folder: Path, sources, target: str, ram_bytes: int, flash_bytes: int,
                  stack_bytes: int = DEFAULT_STACK_BYTES, heap_bytes: int = DEFAULT_HEAP_BYTES) -> Project:
    """The exported library (`sources`, from codegen.generate, its host test program left out)
    and everything a firmware build needs around it into `folder` (a folder being staged)."""
    if sources.weights_in_file:
        raise ExportError(f"{target}: the weights were exported to a file; a microcontroller keeps them in flash "
                          "(export with --weights c or auto)")
    if sources.streams_outputs:
        raise ExportError(f"{target}: the plan streams its outputs by rows; the microcontroller program reads them "
                          "from the arena (plan without --stream-outputs)")
    folder = Path(folder)
    for file_name, data in sources.files.items():
        if file_name not in _HOST_ONLY:
            (folder / file_name).write_bytes(data)
    script = write_mcu_sources(folder, sources.name, Device(target, ram_bytes, flash_bytes, stack_bytes, heap_bytes),
                               makefile="Makefile")
    support = (*_KEPT_SOURCES, "mcu_main.c", script.name, "Makefile")
    return Project(sources.name, target, ram_bytes, flash_bytes, stack_bytes, heap_bytes, support)


def build_project(folder: Path, project: Project) -> McuBuild:
    """Build the project in `folder` with the very command its Makefile runs (relative paths, in
    the folder); DoesNotFitError when RAM or flash overflows, saying what took the memory."""
    core = mcu_target(project.target)
    problem = _toolchain_problem(with_qemu=False)
    if problem:
        raise ToolchainMissingError(f"{project.target}: cannot build: {problem}")
    folder, here = Path(folder), Path(".")
    interface = read_interface(folder / f"{project.name}.h", project.name)
    elf = Path(f"{project.name}_{project.target}.elf")
    script = Path(f"{project.name}_{project.target}.ld")
    result = _run(mcu_compile_command(core, _program_sources(here, here, project.name), [here], script, elf), cwd=folder)
    if result.returncode != 0:
        _raise_build_failure(core, result.stderr, _program_sources(folder, folder, project.name), [folder], folder, interface,
                             project.stack_bytes, project.heap_bytes, project.ram_bytes, project.flash_bytes)
    built = folder / elf
    return _build_record(core, built, project.name, project.ram_bytes, project.flash_bytes, interface,
                         _section_sizes(built), _symbol_sizes(built))


def _program_sources(library_dir: Path, build_dir: Path, name: str) -> list[Path]:
    return [
        library_dir / "tf_kernels.c", library_dir / f"{name}.c",
        build_dir / "mcu_main.c", build_dir / "tf_semihost.c", build_dir / "startup_cortex_m.S",
    ]


def _makefile(core: McuTarget, name: str, library_dir: Path, script: Path, makefile: str, qemu_problem: str | None) -> str:
    here = Path(".")
    elf = Path(f"{name}_{core.name}.elf")
    sources = _program_sources(library_dir, here, name)
    headers = [library_dir / f"{name}.h", library_dir / "tf_kernels.h", here / "tf_semihost.h"]
    build = shlex.join(mcu_compile_command(core, sources, [library_dir, here], script, elf))
    run = shlex.join(qemu_command(core, elf)) if not qemu_problem else f"@echo {shlex.quote('cannot run under qemu: ' + qemu_problem)}; exit 1"
    prerequisites = " ".join(str(p) for p in [*sources, *headers, script])
    make = "make" if makefile == "Makefile" else f"make -f {makefile}"
    return (
        f"# tightfit: {name} for {core.name}, a firmware project. Generated.\n"
        f"# {make}            builds {elf} (and its .map) with {CC}\n"
        f"# {make} run-qemu   runs it on qemu's {core.qemu_machine} with semihosting: reads input.bin, writes\n"
        f"#                   output.bin (float32, in the model file's layout){' -- not here: ' + qemu_problem if qemu_problem else ''}\n"
        f"# {make} clean\n"
        f"# The library is {name}.c, {name}.h, tf_kernels.c and tf_kernels.h: what firmware links.\n"
        f"# Around it, the test program: startup_cortex_m.S, {script}, mcu_main.c, tf_semihost.c/.h;\n"
        f"# on a real board, use its own startup code and linker script (or set the ORIGINs in {script}).\n\n"
        f"{elf}: {prerequisites}\n\t{build}\n\n"
        f"run-qemu: {elf}\n\t{run}\n\n"
        f"run: run-qemu\n\n"
        f"clean:\n\trm -f {elf} {elf.with_suffix('.map')} output.bin\n\n"
        f".PHONY: run-qemu run clean\n"
    )


def _linker_script(core: McuTarget, ram_bytes: int, flash_bytes: int, stack_bytes: int, heap_bytes: int,
                   layout: Layout | None = None) -> str:
    layout = layout or choose_layout(core, ram_bytes, flash_bytes)
    template = Template((TEMPLATES / "link.ld.in").read_text())
    boot = layout.boot
    return template.substitute(
        target=core.name, where=layout.where(core),
        flash_origin=f"0x{layout.flash_origin:08X}", flash_bytes=flash_bytes,
        flash_length=flash_bytes - (BOOT_BYTES if boot else 0),
        ram_origin=f"0x{layout.ram_origin:08X}", ram_bytes=ram_bytes,
        boot_memory=f"\n    BOOT (rx)  : ORIGIN = 0x{core.flash_origin:08X}, LENGTH = {BOOT_BYTES}" if boot else "",
        vectors_section="\n    .vectors : { KEEP(*(.vectors)) } > BOOT\n" if boot else "",
        vectors_in_text="" if boot else "\n        KEEP(*(.vectors))",
        stack_bytes=stack_bytes, heap_bytes=heap_bytes,
    )


def _check_sizes(core: McuTarget, ram_bytes: int, flash_bytes: int, stack_bytes: int, heap_bytes: int) -> None:
    for option, size, region in (("--ram", ram_bytes, "SRAM"), ("--flash", flash_bytes, "code")):
        if size <= 0 or size > REGION_LIMIT:
            raise ExportError(f"{core.name}: {option} {_size_text(size)} is not within the {_size_text(REGION_LIMIT)} "
                              f"{region} region of the ARMv7-M memory map")
    if flash_bytes <= BOOT_BYTES:
        raise ExportError(f"{core.name}: --flash {_size_text(flash_bytes)} cannot hold a program")
    if stack_bytes < 256 or stack_bytes % 8:
        raise ExportError(f"{core.name}: the stack must be a multiple of 8 bytes, at least 256; got {stack_bytes}")
    if heap_bytes < 0 or heap_bytes % 8:
        raise ExportError(f"{core.name}: the heap must be a multiple of 8 bytes; got {heap_bytes}")


def mcu_compile_command(core: McuTarget, sources: list[Path], include_dirs: list[Path], script: Path, elf: Path) -> list[str]:
    """The one cross-compile-and-link command (also what a Makefile would run)."""
    includes = [f"-I{d}" for d in dict.fromkeys(include_dirs)]  # once each, in order
    return [
        CC, *core.cpu_flags, *_COMMON_CFLAGS, *includes, *map(str, sources),
        f"-T{script}", *_LINK_FLAGS, f"-Wl,-Map={elf.with_suffix('.map')}", "-lm", "-o", str(elf),
    ]


def build_mcu(
    export_dir: Path, name: str, target: str, ram_bytes: int, flash_bytes: int, out_elf: Path,
    stack_bytes: int = DEFAULT_STACK_BYTES, heap_bytes: int = DEFAULT_HEAP_BYTES,
) -> McuBuild:
    """Cross-compiles the exported library with the test program into out_elf (its linker
    script and map beside it). Raises DoesNotFitError when RAM or flash overflows."""
    core = mcu_target(target)
    _check_sizes(core, ram_bytes, flash_bytes, stack_bytes, heap_bytes)
    export_dir, out_elf = Path(export_dir), Path(out_elf)
    _check_library(export_dir, name)
    interface = read_interface(export_dir / f"{name}.h", name)
    problem = _toolchain_problem(with_qemu=False)
    if problem:
        raise ToolchainMissingError(f"{target}: cannot build: {problem}")
    out_elf.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_elf.parent, prefix=f".{out_elf.name}.") as tmp:
        build_dir = Path(tmp)
        script = write_mcu_sources(build_dir, name, Device(target, ram_bytes, flash_bytes, stack_bytes, heap_bytes),
                                   library_dir=str(export_dir.resolve()))
        program = _program_sources(export_dir, build_dir, name)
        elf = build_dir / out_elf.name
        result = _run([*mcu_compile_command(core, program, [export_dir, build_dir], script, elf)])
        if result.returncode != 0:
            _raise_build_failure(
                core, result.stderr, program, [export_dir, build_dir], build_dir, interface,
                stack_bytes, heap_bytes, ram_bytes, flash_bytes,
            )
        sections = _section_sizes(elf)
        symbols = _symbol_sizes(elf)
        # Written to temporary names in the same folder, then renamed into place.
        for built, final in ((script, out_elf.with_suffix(".ld")), (elf.with_suffix(".map"), out_elf.with_suffix(".map")), (elf, out_elf)):
            os.replace(built, final)
    return _build_record(core, out_elf, name, ram_bytes, flash_bytes, interface, sections, symbols)


def _run(command: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return children.run(command, text=True, cwd=cwd)


def _check_library(export_dir: Path, name: str) -> None:
    wanted = ["tf_kernels.c", f"{name}.c", f"{name}.h"]
    missing = [file_name for file_name in wanted if not (export_dir / file_name).is_file()]
    if missing:
        raise ExportError(f"{export_dir} is not an exported library of {name!r}: missing {', '.join(missing)}")


def read_interface(header: Path, name: str) -> LibraryInterface:
    text = header.read_text()
    upper = name.upper()
    if _defined(text, f"{upper}_WEIGHTS_FILE"):
        raise ExportError(
            f"{header.name}: the weights were exported to a file; a microcontroller needs them in flash "
            f"(export with the weights as C constants)"
        )
    values = {}
    for what in ("ARENA_BYTES", "INPUT_ELEMS", "OUTPUT_ELEMS"):
        found = _defined(text, f"{upper}_{what}")
        if found is None:
            raise ExportError(f"{header.name} does not define {upper}_{what} as an integer constant")
        values[what] = found
    streams = (
        all(_defined(text, f"{upper}_INPUT_{axis}") is not None for axis in "CHW")
        and re.search(rf"\b{name}_run_rows\s*\(", text) is not None
        and re.search(rf"\b{name}_read\s*\(", text) is not None
    )
    return LibraryInterface(values["INPUT_ELEMS"], values["OUTPUT_ELEMS"], streams)


def _defined(header_text: str, macro: str) -> int | None:
    """The integer a `#define` gives macro (a comment may follow), or None."""
    found = re.search(
        rf"^\s*#\s*define\s+{macro}\s+\(?\s*(\d+)\s*[uUlL]*\s*\)?\s*(?:/[*/].*)?$", header_text, re.MULTILINE,
    )
    return int(found.group(1)) if found else None


def _section_sizes(elf: Path) -> dict[str, tuple[int, int]]:
    """section -> (size, address) from `size -A`."""
    result = _run([SIZE, "-A", str(elf)])
    if result.returncode != 0:
        raise ExportError(f"{SIZE} failed on {elf.name}: {result.stderr.strip()}")
    sections = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0].startswith(".") and fields[1].isdigit():
            sections[fields[0]] = (int(fields[1]), int(fields[2]))
    return sections


def _symbol_sizes(elf: Path) -> dict[str, int]:
    result = _run([NM, "-S", str(elf)])
    sizes = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) == 4:
            sizes[fields[3]] = int(fields[1], 16)
    return sizes


def _build_record(
    core: McuTarget, elf: Path, name: str, ram_bytes: int, flash_bytes: int,
    interface: LibraryInterface, sections: dict[str, tuple[int, int]], symbols: dict[str, int],
    layout: Layout | None = None,
) -> McuBuild:
    layout = layout or choose_layout(core, ram_bytes, flash_bytes)

    def size(section: str) -> int:
        return sections.get(section, (0, 0))[0]

    def end(names: tuple[str, ...], origin: int) -> int:
        return max((sum(sections[n]) for n in names if n in sections), default=origin)

    flash_end = end((".text", ".ARM.extab", ".ARM.exidx", ".rodata"), layout.flash_origin)
    ram_end = end((".stack", ".data", ".bss", ".heap"), layout.ram_origin)
    boot = BOOT_BYTES if layout.boot else 0  # the vector table's region at the boot address
    return McuBuild(
        elf=elf, name=name, target=core.name, ram_bytes=ram_bytes, flash_bytes=flash_bytes,
        input_elems=interface.input_elems, output_elems=interface.output_elems, input_streamed=interface.streams,
        text=size(".vectors") + size(".text") + size(".ARM.extab") + size(".ARM.exidx"), rodata=size(".rodata"),
        data=size(".data"), bss=size(".bss"), stack=size(".stack"), heap=size(".heap"),
        arena=symbols.get(_ARENA_SYMBOL, 0), io_buffer=symbols.get(_IO_SYMBOL, 0),
        ram_used=ram_end - layout.ram_origin, flash_used=flash_end - layout.flash_origin + size(".data") + boot,
        qemu_problem=layout.why_not,
    )


def _raise_build_failure(
    core: McuTarget, stderr: str, program: list[Path], include_dirs: list[Path], build_dir: Path,
    interface: LibraryInterface, stack_bytes: int, heap_bytes: int, ram_bytes: int, flash_bytes: int,
) -> None:
    overflows = {region: int(n) for region, n in _OVERFLOW.findall(stderr)}
    if not overflows:
        lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
        first_error = next((ln for ln in lines if "error" in ln), lines[-1] if lines else "no message")
        raise ExportError(f"{core.name}: the cross build failed: {first_error}")
    unbounded = _unbounded_build(core, program, include_dirs, build_dir, interface, stack_bytes, heap_bytes)
    explained = []
    if "RAM" in overflows:
        explained.append(_ram_overflow(unbounded, overflows["RAM"], ram_bytes))
    if "FLASH" in overflows:
        explained.append(_flash_overflow(unbounded, overflows["FLASH"], flash_bytes))
    raise DoesNotFitError(f"{core.name}: " + "; ".join(explained), overflows.get("RAM", 0), overflows.get("FLASH", 0))


def _unbounded_build(
    core: McuTarget, program: list[Path], include_dirs: list[Path], build_dir: Path,
    interface: LibraryInterface, stack: int, heap: int,
) -> McuBuild:
    """The same program linked with memories far larger than any board's, only to measure
    what took the space (the failed link leaves no ELF to measure)."""
    ram, flash = 2**30, 2**28  # flash ends below the SRAM's 0x20000000, so the regions stay apart
    wide = Layout(core.flash_origin, core.ram_origin, False)
    script = build_dir / "measure.ld"
    script.write_text(_linker_script(core, ram, flash, stack, heap, wide))
    elf = build_dir / "measure.elf"
    try:
        result = _run(mcu_compile_command(core, program, include_dirs, script, elf))
        if result.returncode != 0:
            said = [ln.strip() for ln in result.stderr.splitlines() if ln.strip()]
            raise ExportError(f"{core.name}: the program does not fit, and measuring it failed: {said[-1] if said else 'no message'}")
        return _build_record(core, elf, "", ram, flash, interface, _section_sizes(elf), _symbol_sizes(elf), wide)
    finally:  # only a measurement: nothing of it stays in the project
        for f in (script, elf, elf.with_suffix(".map")):
            f.unlink(missing_ok=True)


def _ram_overflow(unbounded: McuBuild, overflow: int, ram_bytes: int) -> str:
    b = unbounded
    other = b.ram_used - b.arena - b.io_buffer - b.stack - b.heap
    return (
        f"RAM overflowed by {overflow} bytes (arena {b.arena} B + I/O buffer {b.io_buffer} B + "
        f"stack {b.stack} B + heap {b.heap} B + other .data/.bss {other} B = {b.ram_used} B "
        f"> --ram {_size_text(ram_bytes)})"
    )


def _flash_overflow(unbounded: McuBuild, overflow: int, flash_bytes: int) -> str:
    b = unbounded
    return (
        f"FLASH overflowed by {overflow} bytes (constants/weights {b.rodata} B + code {b.text} B + "
        f".data initial values {b.data} B = {b.flash_used} B > --flash {_size_text(flash_bytes)})"
    )


def _size_text(n: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n > 0 and n % scale == 0:
            return f"{n // scale} {unit} = {n} B"
    return f"{n} B ({human(n)})"


def run_qemu(build: McuBuild, input: np.ndarray, timeout_s: float = 60.0) -> np.ndarray:
    """The program's first output for this input (NCHW float32), run on the emulated board."""
    return run_qemu_measured(build, input, timeout_s).output


def run_qemu_measured(build: McuBuild, input: np.ndarray, timeout_s: float = 60.0) -> McuRun:
    core = mcu_target(build.target)
    if build.qemu_problem:
        raise ExportError(f"{build.target}: cannot run under qemu: {build.qemu_problem}")
    problem = toolchain_available()
    if problem:
        raise ToolchainMissingError(f"{build.target}: cannot run: {problem}")
    data = np.asarray(input)
    if data.size != build.input_elems:
        raise ExportError(f"{build.name}: the input has {data.size} values, the model takes {build.input_elems}")
    with tempfile.TemporaryDirectory(prefix="tightfit-mcu-") as tmp:
        workdir = Path(tmp)
        (workdir / "input.bin").write_bytes(input_bytes(data))  # float32, or an int8 input's bytes
        started = time.perf_counter()
        completed = _run_board(core, build.elf.resolve(), workdir, timeout_s)
        seconds = time.perf_counter() - started
        console = completed.stdout + completed.stderr
        if completed.returncode != 0:
            said = [ln for ln in console.splitlines()
                    if ln.strip() and not _STACK_REPORT.search(ln) and not _COUNT_REPORT.search(ln)]
            raise ExportError(
                f"{build.target}: the program on qemu {core.qemu_machine} exited with status "
                f"{completed.returncode}: {said[-1] if said else 'no message'}"
            )
        output = _read_output(workdir / "output.bin", build)
    used, reserved = _stack_report(console, build.target)
    return McuRun(output=output, stack_used=used, stack_reserved=reserved, seconds=seconds,
                  instructions=core.instructions(_cycles_report(console, build.target)))


def qemu_command(core: McuTarget, elf: Path) -> list[str]:
    # target=native: the program's files are opened in qemu's working directory.
    return [
        QEMU, "-M", core.qemu_machine, "-nographic", "-monitor", "none", "-serial", "none",
        "-semihosting-config", "enable=on,target=native", "-icount", f"shift={ICOUNT_SHIFT}", "-kernel", str(elf),
    ]


def _run_board(core: McuTarget, elf: Path, workdir: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    command = qemu_command(core, elf)
    try:
        return children.run(command, timeout=timeout_s, text=True, cwd=workdir, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ExportError(
            f"{core.name}: the program on qemu {core.qemu_machine} did not finish within {timeout_s:g} s "
            f"and was killed (a hang, or a run too slow for the emulator)"
        ) from None


def _read_output(path: Path, build: McuBuild) -> np.ndarray:
    if not path.is_file():
        raise ExportError(f"{build.target}: the program exited 0 without writing output.bin")
    output = np.fromfile(path, dtype="<f4")
    if output.size != build.output_elems:
        raise ExportError(f"{build.target}: output.bin has {output.size} values, the model's output {build.output_elems}")
    return output.astype(np.float32)


def _stack_report(console: str, target: str) -> tuple[int, int]:
    found = _STACK_REPORT.search(console)
    if found is None:
        raise ExportError(f"{target}: the program did not report its stack depth: {console.strip()[-200:]!r}")
    return int(found.group(1)), int(found.group(2))


def _cycles_report(console: str, target: str) -> int:
    found = _COUNT_REPORT.search(console)
    if found is None:
        raise ExportError(f"{target}: the program did not report its cycle count: {console.strip()[-200:]!r}")
    return int(found.group(1))
