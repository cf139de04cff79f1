"""The kernel library (kernels/tf_kernels.c) as the Python process runs it: built with the system's
C compiler on first use into the cache directory (private folders only), loaded with ctypes, and
steps bound to its argument structs once. The ctypes structures are made from ops/abi.py's table,
as the C header's declarations are, and filled from kernels/step_args.py's values, as the exported
program's tables are: the same kernels on the same views."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from tightfit.errors import TightfitError
from tightfit.kernels.step_args import Acts, Args, Array, Code, Struct, View
from tightfit.ops import abi

KERNELS = Path(__file__).parents[1] / "kernels"
SOURCES = (KERNELS / "tf_kernels.c", KERNELS / "tf_kernels.h")
# As the exported program's default build (export/build.py), plus a shared object's.
FLAGS = ["-std=c99", "-O3", "-march=native", "-ffp-contract=fast", "-pthread", "-shared", "-fPIC"]


class KernelLibraryError(TightfitError):
    """The kernel library cannot be built (no C compiler, or it failed)."""


class KernelBuildMissing(KernelLibraryError):
    """No C compiler to build the kernel library with."""


class UnsafeLibraryError(TightfitError):
    """The kernel library's folder or file could be replaced by another user."""


_CTYPES = {"tf_int": ctypes.c_int32, "int": ctypes.c_int, "float": ctypes.c_float}


def _field_ctype(t: object, structs: dict) -> object:
    if isinstance(t, tuple):
        return _CTYPES[t[0]] * t[1]  # type: ignore[index, operator]
    if str(t).endswith("*"):
        return ctypes.c_void_p
    return _CTYPES.get(str(t)) or structs[t]


def _make_structs() -> dict[str, type]:
    """One ctypes.Structure per struct of abi.STRUCTS, in the same order and layout."""
    out: dict[str, type] = {}
    for name, (fields, _) in abi.STRUCTS.items():
        out[name] = type(name, (ctypes.Structure,), {"_fields_": [(f, _field_ctype(t, out)) for f, t in fields]})
    return out


STRUCTS = _make_structs()
INPUT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_long] * 6), ctypes.c_void_p,
                            *([ctypes.c_long] * 4))


class Source(ctypes.Structure):
    """tf_source: where one model input comes from (its tf_input_fn and that function's ctx)."""

    _fields_ = [("fill", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class Tensor(ctypes.Structure):
    """tf_tensor: a whole contiguous (N, C, H, W) input of `item` bytes per element ((N, H, W, C)
    where `nhwc` is 1: the C program's channels-last input; the executor's arrays are NCHW)."""

    _fields_ = [("x", ctypes.c_void_p), ("c", ctypes.c_long), ("h", ctypes.c_long), ("w", ctypes.c_long),
                ("item", ctypes.c_int), ("nhwc", ctypes.c_int)]


class Sink(ctypes.Structure):
    """tf_sink: where one streamed model output goes (its tf_output_fn and that function's ctx)."""

    _fields_ = [("emit", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class Store(ctypes.Structure):
    """tf_store: a whole contiguous (N, C, H, W) output of `item` bytes per element, filled by rows."""

    _fields_ = [("y", ctypes.c_void_p), ("c", ctypes.c_long), ("h", ctypes.c_long), ("w", ctypes.c_long),
                ("item", ctypes.c_int)]


DTYPES = {name: np.dtype(cls) for name, cls in STRUCTS.items()}  # the same layouts as numpy records


def _pointee(t: object) -> str | None:
    """The struct a pointer field points to ("const tf_view *" -> "tf_view"); None if not a pointer."""
    if not (isinstance(t, str) and t.endswith("*")):
        return None
    name = t[:-1].replace("const", "").strip()
    return name if name in STRUCTS else "void"


class StepTable:
    """Steps bound to their argument structs: a tf_step array that tf_run walks. Binding builds one
    numpy record array per struct type (not one ctypes object per step: a finely split plan has
    thousands of steps); pointers are first stored as 1-based row numbers into their pointee's
    array (0: NULL) and then relocated to addresses once every array exists."""

    def __init__(self, steps: Sequence[Args]):
        self._rows: dict[str, list] = {}
        self._acts: dict[tuple, int] = {}
        refs = [(abi.STEP[a.kind], a.ctype, self._add(a.ctype, a.fields)) for a in steps]
        self._rows.setdefault("tf_step", [])
        self._rows["tf_step"] = [(kind, 0) for kind, _, _ in refs]
        self.arrays = {name: np.array(rows, DTYPES[name]) if rows else np.zeros(1, DTYPES[name])
                       for name, rows in self._rows.items()}
        for name, arr in self.arrays.items():
            self._relocate(name, arr)
        if refs:
            table = self.arrays["tf_step"]
            bases = {name: arr.ctypes.data for name, arr in self.arrays.items()}
            table["args"] = [bases[ctype] + row * DTYPES[ctype].itemsize for _, ctype, row in refs]
        self.count = len(steps)
        self.address = self.arrays["tf_step"].ctypes.data

    def _add(self, ctype: str, value: object) -> int:
        """Append `value` as a row of `ctype`'s array; its row number."""
        rows = self._rows.setdefault(ctype, [])
        rows.append(self._record(ctype, value))
        return len(rows) - 1

    def _record(self, ctype: str, value: object) -> tuple:
        fields = abi.STRUCTS[ctype][0]
        values = value.values() if isinstance(value, View) else value.fields if isinstance(value, Struct) else value
        if len(values) != len(fields):  # type: ignore[arg-type]
            raise ValueError(f"{ctype}: {len(values)} values for {len(fields)} fields")  # type: ignore[arg-type]
        return tuple(self._field(t, v) for (_, t), v in zip(fields, values))  # type: ignore[union-attr]

    def _field(self, t: object, v: object) -> object:
        kind = type(v)
        if kind is int or kind is float:  # most fields: checked first, binding is per field
            return v
        if kind is View:
            return (v.off, *v.dims, *v.strides)  # type: ignore[attr-defined]
        if isinstance(v, Code):
            return v.value
        if isinstance(v, Acts):  # chains are few: one row per distinct chain
            if not v.chain:
                return 0
            if v.chain not in self._acts:
                self._acts[v.chain] = self._add("tf_acts", v.fields()) + 1
            return self._acts[v.chain]
        if isinstance(v, Array):
            rows = [self._add(v.ctype, item) for item in v.items]
            return rows[0] + 1 if rows else 0
        if isinstance(t, str) and t in STRUCTS:
            return self._record(t, v)
        return v

    def _relocate(self, name: str, arr: np.ndarray) -> None:
        """Row numbers in `name`'s pointer fields to addresses (nested structs hold no pointers)."""
        for field, t in abi.STRUCTS[name][0]:
            target = _pointee(t)
            if target is None or target == "void":
                continue
            rows = arr[field].astype(np.int64)
            base = self.arrays[target].ctypes.data if target in self.arrays else 0
            arr[field] = np.where(rows == 0, 0, base + (rows - 1) * DTYPES[target].itemsize).astype(np.uint64)


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The library, built once per source, compiler, flags and machine, kept in the cache directory."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise KernelBuildMissing("no C compiler found (set CC): tightfit runs plans on its C kernel library")
    from tightfit.cache import cache_dir

    source = b"".join(p.read_bytes() for p in SOURCES)
    # CC names the build too: a compiler (or a wrapper adding -mno-avx512f) makes another library
    key = source + " ".join([compiler, *FLAGS]).encode() + platform.machine().encode() + _cpu().encode()
    digest = hashlib.sha1(key).hexdigest()[:12]
    base = cache_dir()
    try:
        if base is None:  # no disk cache: built for this process (a loaded library outlives its file)
            with tempfile.TemporaryDirectory() as tmp:
                lib = ctypes.CDLL(str(_build(compiler, Path(tmp) / "tf_kernels.so")))
        else:
            path = base / "kernels" / f"tf_kernels-{digest}.so"
            if not path.exists():
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                _check_private(path.parent)
                with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # built aside, renamed in: builds race safely
                    os.replace(_build(compiler, Path(tmp) / path.name), path)
            for part in (base, path.parent, path):  # a writable folder above could swap the one below
                _check_private(part)
            lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelLibraryError(f"the C kernel library did not build or load: {str(e).splitlines()[0] if str(e) else e}") from e
    return _declare(lib)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.tf_run.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.tf_run.restype = ctypes.c_int
    lib.tf_simd.argtypes, lib.tf_simd.restype = [], ctypes.c_int
    lib.tf_threads.argtypes, lib.tf_threads.restype = [], ctypes.c_int
    return lib


def _check_private(path: Path) -> None:
    """Code is loaded only from a file and folder that this user owns and nobody else may write:
    anyone who can write there could make every run execute their code."""
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise UnsafeLibraryError(
            f"refusing to load the kernel library from {path}: it must be owned by you and not writable by group or "
            f"others (owner uid {info.st_uid}, mode {oct(info.st_mode & 0o777)}); chmod go-w it or set TIGHTFIT_CACHE")


def _build(compiler: str, path: Path) -> Path:
    from tightfit import children

    done = children.run([compiler, *FLAGS, "-o", str(path), str(SOURCES[0]), "-lm"], timeout=120)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return path


def _cpu() -> str:
    try:
        return next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def code_digest() -> str:
    """A digest of the kernels' source and flags (a profile's id names it)."""
    return hashlib.sha1(b"".join(p.read_bytes() for p in SOURCES) + " ".join(FLAGS).encode()).hexdigest()[:12]


def tensor_input() -> int:
    """The address of tf_tensor_rows (a tf_input_fn reading a tf_tensor)."""
    return ctypes.cast(library().tf_tensor_rows, ctypes.c_void_p).value  # type: ignore[return-value]


def tensor_store() -> int:
    """The address of tf_tensor_store (a tf_output_fn writing into a tf_store)."""
    return ctypes.cast(library().tf_tensor_store, ctypes.c_void_p).value  # type: ignore[return-value]
