"""Writing, building, running and measuring an exported program (`tightfit export --check`).

The measured figure is the whole process: its peak resident set (VmHWM, which the program reads
from /proc/self/status as it ends; a child's ru_maxrss would include the Python process it was
forked from) beside weights + arena + code (`size` of the binary)."""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from tightfit import atomic, children
from tightfit.export.codegen import Sources
from tightfit.export.errors import ExportError, ToolchainMissingError

WARNINGS = ["-Wall", "-Wextra", "-Werror", "-pedantic"]
# -O3: the dense kernel's register blocks need its unrolling (-O2: 2.3x slower); ISO C modes turn
# contraction into FMA off unless asked (-ffp-contract=fast: 1.4x).
DEFAULT_CFLAGS = ["-std=c99", "-O3", "-march=native", "-ffp-contract=fast"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g", "-O1"]
LIBS = ["-lm", "-pthread"]  # the kernels' threads (tf_run's `threads`): pthreads


def write_files(sources: Sources, folder: Path) -> None:
    """The exported files into `folder`, a folder being staged (see atomic.output_folder)."""
    for name, data in sources.files.items():
        (Path(folder) / name).write_bytes(data)


def write_dir(sources: Sources, out: Path, force: bool = False) -> Path:
    """The files into `out`, whole or not at all: written in a temporary folder beside it, then
    put in its place in one step. An existing non-empty `out` is replaced only with `force`; a
    file is never replaced (atomic.OutputError, one line)."""
    out = Path(out)
    with atomic.output_folder(out, force) as tmp:
        write_files(sources, tmp)
    return out


def compiler(cc: str | None = None) -> str:
    name = cc or os.environ.get("CC", "cc")
    found = shutil.which(name)
    if found is None:
        raise ToolchainMissingError(f"no C compiler {name!r} on PATH (install gcc, or give --cc)")
    return found


@dataclass(frozen=True)
class Built:
    binary: Path
    text: int      # code (`size`'s text includes the read-only data: the const weights in c mode)
    data: int
    bss: int       # static data of the program and libc (the arena is allocated at start, main.c)
    stack_bound: int  # sum of every function's static frame: no recursion, so no chain is deeper


def build(directory: Path, name: str, cc: str | None = None, cflags: Sequence[str] | None = None,
          sanitize: bool = False, timeout: float = 1800, defines: Sequence[str] = ()) -> Built:
    """Compile the exported program in `directory` (warnings are errors), with `defines` (-D flags:
    codegen.Sources.defines) besides the flags; ExportError on failure."""
    directory = Path(directory)
    flags = (list(cflags if cflags is not None else DEFAULT_CFLAGS) + list(defines) + WARNINGS
             + (SANITIZE if sanitize else []))
    binary = directory / (name + ("-asan" if sanitize else ""))
    sources = ["main.c", f"{name}.c", "tf_kernels.c"]
    with tempfile.TemporaryDirectory(prefix="tightfit-cc-") as tmp:
        objects = []
        # cc's own temporaries (cc1's .s files) in our folder: a cc killed by an interrupt cannot remove them.
        env = dict(os.environ, TMPDIR=tmp)
        for src in sources:
            obj = Path(tmp) / (Path(src).stem + ".o")
            _run_cc([compiler(cc), *flags, "-fstack-usage", "-c", str(directory / src), "-o", str(obj)], timeout, env)
            objects.append(str(obj))
        linked = Path(tmp) / binary.name  # linked aside, renamed in: never a half-written program
        try:  # static: the process then maps only the libc pages it uses (~0.8 MiB against ~1.8)
            _run_cc([compiler(cc), *flags, "-static", "-o", str(linked), *objects, *LIBS], timeout, env)
        except ExportError:
            _run_cc([compiler(cc), *flags, "-o", str(linked), *objects, *LIBS], timeout, env)
        stack = _stack_bound(Path(tmp))
        with atomic.replacing(binary) as aside:
            shutil.copy2(linked, aside)
    text, data, bss = _size(binary)
    return Built(binary, text, data, bss, stack)


def _run_cc(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> None:
    try:
        done = children.run(cmd, timeout=timeout, text=True, env=env)
    except subprocess.TimeoutExpired:
        raise ExportError(f"the C build timed out after {timeout:.0f} s") from None
    except OSError as e:
        raise ExportError(f"cannot run the C compiler: {e}") from None
    if done.returncode != 0:
        first = next((l for l in done.stderr.splitlines() if "error" in l), done.stderr.strip().splitlines()[-1:] or ["?"])
        raise ExportError(f"the C build failed: {first if isinstance(first, str) else first[0]}")


def _stack_bound(folder: Path) -> int:
    """Every function's frame added up (gcc -fstack-usage); a function with a dynamic frame has no bound."""
    total = 0
    for su in folder.glob("*.su"):
        for line in su.read_text().splitlines():
            parts = line.rsplit("\t", 2)
            if len(parts) == 3:
                if "dynamic" in parts[2] and "bounded" not in parts[2]:
                    raise ExportError(f"a function has a frame of unbounded size: {parts[0]}")
                total += int(parts[1])
    return total


def _size(binary: Path) -> tuple[int, int, int]:
    tool = shutil.which("size")
    if tool is None:
        return (0, 0, 0)
    out = children.run([tool, str(binary)], timeout=60, text=True).stdout.splitlines()
    text, data, bss = (int(v) for v in out[1].split()[:3])
    return text, data, bss


@dataclass(frozen=True)
class Ran:
    outputs: list[np.ndarray]  # every output of every CNN, in order, flat
    median_seconds: float
    peak_rss: int  # bytes: the whole process's high-water mark
    simd: int = -1  # the kernels' vector width (tf_simd: 0 for the portable path; -1: not said)
    # the median of the runs after the first, each the shorter of its wall and CPU time (main.c's
    # cpu_seconds: what other processes held of the core left out); NaN where not said
    cpu_seconds: float = math.nan


@dataclass(frozen=True)
class Launch:
    """How the program is started: its environment (None: ours); with `preload` it reads its
    input whole before the timed runs (else by rows, as the steps ask: the input is then never
    whole in memory); `launcher` the command that runs the binary (an emulator: qemu-aarch64 -L
    SYSROOT), none for a host program; `threads` its -t."""

    env: dict | None = None
    preload: bool = False
    launcher: Sequence[str] = ()
    threads: int = 1


def input_bytes(x: np.ndarray) -> bytes:
    """An input as the program reads it: float32 little-endian, or an int8 input's bytes."""
    x = np.asarray(x)
    return np.ascontiguousarray(x, dtype=np.int8 if x.dtype == np.int8 else "<f4").tobytes()


def run(binary: Path, inputs: Sequence[np.ndarray], output_sizes: Sequence[int], runs: int = 1,
        weights: Path | None = None, timeout: float = 600, **launch) -> Ran:
    """Run the program on `inputs` (every CNN's input, in order) and read its outputs; `launch`
    are Launch's fields."""
    how = Launch(**launch)
    env, preload, launcher, threads = how.env, how.preload, how.launcher, how.threads
    with tempfile.TemporaryDirectory(prefix="tightfit-run-") as tmp:
        inp, out = Path(tmp) / "input.bin", Path(tmp) / "output.bin"
        inp.write_bytes(b"".join(input_bytes(x) for x in inputs))
        options = (["-p"] if preload else []) + (["-t", str(threads)] if threads > 1 else [])
        cmd = [*launcher, str(binary), *options, str(inp), str(out), str(runs)] + ([str(weights)] if weights is not None else [])
        killed = threading.Event()
        with open(Path(tmp) / "stdout", "wb") as so, open(Path(tmp) / "stderr", "wb") as se:
            proc = children.popen(cmd, stdout=so, stderr=se, env=env)
            timer = threading.Timer(timeout, lambda: (killed.set(), proc.kill()))
            timer.start()
            try:
                proc.wait()
            except BaseException:  # a signal on its way to the CLI
                children.kill(proc)
                raise
            finally:
                timer.cancel()
            children.LIVE.pop(proc.pid, None)
        stdout, stderr = (Path(tmp) / "stdout").read_bytes(), (Path(tmp) / "stderr").read_bytes()
        if killed.is_set():
            raise ExportError(f"the exported program ran past {timeout:.0f} s")
        if proc.returncode != 0:
            tail = (stderr.decode(errors="replace").strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            raise ExportError(f"the exported program failed (status {proc.returncode}): {tail}")
        data = np.frombuffer(out.read_bytes(), dtype="<f4")
    outputs, at = [], 0
    for size in output_sizes:
        outputs.append(data[at : at + size].copy())
        at += size
    m = re.search(rb"median_seconds ([0-9.eE+-]+)(?: cpu_seconds ([0-9.eE+-]+))? peak_rss_kib (-?[0-9]+)(?: simd ([0-9]+))?",
                  stdout)
    if m is None or int(m.group(3)) < 0:
        raise ExportError("the exported program did not report its peak memory (VmHWM needs Linux /proc)")
    return Ran(outputs, float(m.group(1)), int(m.group(3)) * 1024, int(m.group(4)) if m.group(4) else -1,
               float(m.group(2)) if m.group(2) else math.nan)
