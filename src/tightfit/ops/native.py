"""Convolution kernels of our own in C (`_conv.c`), built with the system's C compiler on first
use and kept in the cache directory; where no compiler works, `conv_call` gives None and
convolutions run on oneDNN alone. TIGHTFIT_NATIVE=0 turns them off."""
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
from typing import Callable

import torch

SOURCE = Path(__file__).with_name("_conv.c")
KINDS = ("depthwise", "dense")
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC"]


class ConvArgs(ctypes.Structure):
    _fields_ = ([(n, ctypes.c_void_p) for n in ("x", "y", "w", "b")]
                + [(n, ctypes.c_long) for n in ("n c ih iw oh ow cin xs_n xs_h xs_w ys_n ys_h ys_w kh kw sh sw pt pl").split()]
                + [("lo", ctypes.c_float), ("hi", ctypes.c_float)])


def enabled() -> bool:
    return os.environ.get("TIGHTFIT_NATIVE", "1").strip().lower() not in ("0", "off", "no", "false")


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        return None
    from tightfit.graph.zoo import cache_dir

    source = SOURCE.read_bytes()
    digest = hashlib.sha1(source + " ".join(FLAGS).encode() + platform.machine().encode() + _cpu().encode()).hexdigest()[:12]
    base = cache_dir()
    try:
        if base is None:  # no disk cache: built for this process (a loaded library outlives its file)
            with tempfile.TemporaryDirectory() as tmp:
                lib = ctypes.CDLL(str(_build(compiler, Path(tmp) / "conv.so")))
        else:
            path = base / "native" / f"conv-{digest}.so"
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # built aside, renamed in: builds race safely
                    os.replace(_build(compiler, Path(tmp) / path.name), path)
            lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError):
        return None
    for kind in KINDS:
        getattr(lib, kind).argtypes = [ctypes.POINTER(ConvArgs)]
        getattr(lib, kind).restype = None
    return lib


def _build(compiler: str, path: Path) -> Path:
    subprocess.run([compiler, *FLAGS, "-o", str(path), str(SOURCE)], check=True, capture_output=True, timeout=120)
    return path


def _cpu() -> str:
    try:
        return next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def available() -> bool:
    return enabled() and _library() is not None


def conv_call(kind: str, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor, kernel, stride,
              pad: tuple[int, int], clamp: tuple[float, float]) -> Callable[[], None] | None:
    """A call writing the convolution of view `x` into view `y` (NCHW-shaped fp32 views with unit
    channel stride, e.g. channels-last; `pad` rows and columns of zeros above and left, as many
    below and right as `y`'s size asks), plus bias `b`, clamped to `clamp`. `kind` 'depthwise':
    one filter per channel, `w` (kh*kw) x C; 'dense': groups 1, `w` (kh*kw*C_in) x C_out. None
    where the kernels are not available. The views' memory must outlive the call (the arena's does)."""
    lib = _library() if enabled() else None
    if lib is None:
        return None
    n, cin, ih, iw = x.shape
    w, b = w.contiguous(), b.contiguous()
    args = ConvArgs(x.data_ptr(), y.data_ptr(), w.data_ptr(), b.data_ptr(), n, y.shape[1], ih, iw, y.shape[2], y.shape[3],
                    cin, x.stride(0), x.stride(2), x.stride(3), y.stride(0), y.stride(2), y.stride(3),
                    kernel[0], kernel[1], stride[0], stride[1], pad[0], pad[1], clamp[0], clamp[1])
    args.keep = (x, y, w, b)  # the pointers' owners live as long as the call
    return functools.partial(getattr(lib, kind), ctypes.pointer(args))
