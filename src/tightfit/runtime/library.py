"""The kernel library (kernels/tf_kernels.c) as the Python process runs it: built with the system's
C compiler on first use into the cache directory (private folders only), loaded with ctypes, and
steps bound to its argument structs once. The ctypes structures are made from ops/abi.py's table,
as the C header's declarations are, and filled from export/step_args.py's values, as the exported
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

from tightfit.errors import TightfitError
from tightfit.export.step_args import Acts, Args, Array, Code, Struct, View
from tightfit.ops import abi

KERNELS = Path(__file__).parents[1] / "kernels"
SOURCES = (KERNELS / "tf_kernels.c", KERNELS / "tf_kernels.h")
# As the exported program's default build (export/build.py), plus a shared object's.
FLAGS = ["-std=c99", "-O3", "-march=native", "-ffp-contract=fast", "-shared", "-fPIC"]


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


class Tensor(ctypes.Structure):
    """tf_tensor: a whole contiguous (N, C, H, W) input."""

    _fields_ = [("x", ctypes.c_void_p), ("c", ctypes.c_long), ("h", ctypes.c_long), ("w", ctypes.c_long)]


def _pack(ctype: str, value: object, keep: list) -> object:
    """`value` (a step_args value) as an instance of the ctypes type of `ctype`; arrays it points
    to are appended to `keep` (they must live as long as the struct)."""
    cls = STRUCTS[ctype]
    fields = abi.STRUCTS[ctype][0]
    values = value.values() if isinstance(value, View) else value.fields if isinstance(value, Struct) else value
    if len(values) != len(fields):  # type: ignore[arg-type]
        raise ValueError(f"{ctype}: {len(values)} values for {len(fields)} fields")  # type: ignore[arg-type]
    return cls(*(_field(t, v, keep) for (_, t), v in zip(fields, values)))  # type: ignore[union-attr]


def _field(t: object, v: object, keep: list) -> object:
    if isinstance(v, Code):
        return v.value
    if isinstance(v, Acts):
        if not v.chain:
            return None
        acts = STRUCTS["tf_acts"](*[(ctypes.c_int * abi.MAX_ACTS)(*f) if i == 0 else (ctypes.c_float * abi.MAX_ACTS)(*f)
                                    for i, f in enumerate(v.fields())])
        keep.append(acts)
        return ctypes.addressof(acts)
    if isinstance(v, Array):
        items = (STRUCTS[v.ctype] * max(len(v.items), 1))(*[_pack(v.ctype, i, keep) for i in v.items])
        keep.append(items)
        return ctypes.addressof(items)
    if isinstance(t, str) and t in STRUCTS:
        return _pack(t, v, keep)
    return float(v) if t == "float" else int(v)  # type: ignore[call-overload]


class StepTable:
    """Steps bound to their argument structs: a tf_step array that tf_run walks."""

    def __init__(self, steps: Sequence[Args]):
        self.keep: list = []
        args = [_pack(a.ctype, a.fields, self.keep) for a in steps]
        self.keep += args
        table = STRUCTS["tf_step"] * max(len(steps), 1)
        self.table = table(*[(abi.STEP[a.kind], ctypes.addressof(s)) for a, s in zip(steps, args)])
        self.count = len(steps)
        self.address = ctypes.addressof(self.table)


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The library, built once per source, flags and machine, kept in the cache directory."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise KernelBuildMissing("no C compiler found (set CC): tightfit runs plans on its C kernel library")
    from tightfit.cache import cache_dir

    source = b"".join(p.read_bytes() for p in SOURCES)
    digest = hashlib.sha1(source + " ".join(FLAGS).encode() + platform.machine().encode() + _cpu().encode()).hexdigest()[:12]
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
    lib.tf_run.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    lib.tf_run.restype = ctypes.c_int
    lib.tf_simd.argtypes, lib.tf_simd.restype = [], ctypes.c_int
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
