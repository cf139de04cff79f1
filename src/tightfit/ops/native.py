"""Kernels of our own in C (`_conv.c`), built with the system's C compiler on first use and kept in
the cache directory; where no compiler works, the `*_call` functions give None and steps run on
torch alone. TIGHTFIT_NATIVE=0 turns them off.

A call is a `NativeCalls`: (kernel, argument struct) pairs made once at bind time. The executor
merges a plan's consecutive native steps into one, so they run with no Python between them."""
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
import torch

from tightfit.errors import TightfitError

SOURCE = Path(__file__).with_name("_conv.c")
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC"]


class ConvArgs(ctypes.Structure):
    _fields_ = ([(n, ctypes.c_void_p) for n in ("x", "y", "w", "b")]
                + [(n, ctypes.c_long) for n in ("n c ih iw oh ow cin xs_n xs_h xs_w ys_n ys_h ys_w kh kw sh sw pt pl").split()]
                + [("lo", ctypes.c_float), ("hi", ctypes.c_float)]
                + [(n, ctypes.c_long) for n in ("xs_c ws_n ws_h ws_w groups").split()])


def enabled() -> bool:
    return os.environ.get("TIGHTFIT_NATIVE", "1").strip().lower() not in ("0", "off", "no", "false")


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        return None
    from tightfit.cache import cache_dir

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
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                _check_private(path.parent)
                with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # built aside, renamed in: builds race safely
                    os.replace(_build(compiler, Path(tmp) / path.name), path)
            for part in (base, path.parent, path):  # a writable folder above could swap the one below
                _check_private(part)
            lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError):
        return None
    lib.run_calls.argtypes = [ctypes.c_void_p, ctypes.c_long]
    lib.run_calls.restype = None
    return lib


class UnsafeLibraryError(TightfitError):
    """The native library's folder or file could be replaced by another user."""


def _check_private(path: Path) -> None:
    """Code is loaded only from a file and folder that this user owns and nobody else may write:
    anyone who can write there could make every run execute their code."""
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise UnsafeLibraryError(
            f"refusing to load native kernels from {path}: it must be owned by you and not writable by group or others "
            f"(owner uid {info.st_uid}, mode {oct(info.st_mode & 0o777)}); chmod go-w it, set TIGHTFIT_CACHE, or TIGHTFIT_NATIVE=0")


def _build(compiler: str, path: Path) -> Path:
    from tightfit import children

    done = children.run([compiler, *FLAGS, "-o", str(path), str(SOURCE)], timeout=120)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return path


def _cpu() -> str:
    try:
        return next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def available() -> bool:
    return enabled() and _library() is not None


class _Call(ctypes.Structure):
    _fields_ = [("kernel", ctypes.c_void_p), ("args", ctypes.c_void_p)]


class NativeCalls:
    """Calls of our kernels, run in order by one call from Python."""

    def __init__(self, calls: list[tuple[str, ConvArgs]]):
        self.calls = calls
        lib = _library()
        self._table = (_Call * len(calls))(*[(ctypes.cast(getattr(lib, k), ctypes.c_void_p), ctypes.addressof(a)) for k, a in calls])
        self._run = functools.partial(lib.run_calls, ctypes.addressof(self._table), len(calls))

    def __call__(self) -> None:
        self._run()

    @staticmethod
    def merged(runs: "list[NativeCalls]") -> "NativeCalls":
        return NativeCalls([c for r in runs for c in r.calls])


def _args(x: torch.Tensor, y: torch.Tensor, keep: tuple, **fields) -> ConvArgs:
    """The argument struct over NCHW-shaped views `x` (input) and `y` (output); `keep`: the
    tensors its pointers point into, kept alive with it."""
    args = ConvArgs(x=x.data_ptr(), y=y.data_ptr(), n=y.shape[0], c=y.shape[1], ih=x.shape[2], iw=x.shape[3],
                    oh=y.shape[2], ow=y.shape[3], cin=x.shape[1], xs_n=x.stride(0), xs_h=x.stride(2), xs_w=x.stride(3),
                    ys_n=y.stride(0), ys_h=y.stride(2), ys_w=y.stride(3), xs_c=x.stride(1), **fields)
    args.keep = (x, y) + keep
    return args


def conv_call(kind: str, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor, kernel, stride,
              pad: tuple[int, int], clamp: tuple[float, float]) -> NativeCalls | None:
    """A call writing the convolution of view `x` into view `y` (NCHW-shaped fp32 views with unit
    channel stride, e.g. channels-last; `pad` rows and columns of zeros above and left, as many
    below and right as `y`'s size asks), plus bias `b`, clamped to `clamp`. `kind` 'depthwise':
    one filter per channel, `w` (kh*kw) x C; 'dense': groups 1, `w` and `b` as `dense_panels`
    makes them. None where the kernels are not available. The views' memory must outlive the
    call (the arena's does)."""
    if not available():
        return None
    w, b = w.contiguous(), b.contiguous()
    _check_conv(kind, x, y, w, b, kernel, stride, pad)
    args = _args(x, y, (w, b), w=w.data_ptr(), b=b.data_ptr(), kh=kernel[0], kw=kernel[1], sh=stride[0], sw=stride[1],
                 pt=pad[0], pl=pad[1], lo=clamp[0], hi=clamp[1])
    return NativeCalls([(kind, args)])


def _require(condition: bool, message: str) -> None:
    """A kernel's precondition: what it reads and writes lies inside the views it is given. A
    failure is a bug of ours (the importer's checks keep every model within them), never run."""
    if not condition:
        raise ValueError(f"native kernel: {message}")


def _check_conv(kind: str, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor, kernel, stride,
                pad: tuple[int, int]) -> None:
    """The shapes `depthwise` and `dense` (_conv.c) read: the weight and bias for the views'
    channels and the kernel, one sample of input per sample of output. Input taps are clipped
    to the input view, so the rest of the window needs no check."""
    _require(x.dim() == 4 and y.dim() == 4 and x.dtype == y.dtype == w.dtype == b.dtype == torch.float32,
             "fp32 NCHW-shaped views")
    _require(x.stride(1) == 1 and y.stride(1) == 1 and min(x.stride() + y.stride()) >= 0, "unit-stride channels")
    _require(x.shape[0] == y.shape[0], f"{y.shape[0]} output samples from {x.shape[0]} input samples")
    _require(min(kernel) >= 1 and min(stride) >= 1 and min(pad) >= 0, f"kernel {kernel}, strides {stride}, padding {pad}")
    taps, c = kernel[0] * kernel[1], y.shape[1]
    if kind == "depthwise":
        _require(x.shape[1] == c and tuple(w.shape) == (taps, c) and b.numel() >= c,
                 f"depthwise weight {tuple(w.shape)} and bias {b.numel()} for {x.shape[1]} -> {c} channels, {taps} taps")
    else:
        panels = -(-c // 16)
        _require(kind == "dense" and tuple(w.shape) == (panels, taps * x.shape[1], 16) and b.numel() >= panels * 16,
                 f"dense weight {tuple(w.shape)} and bias {b.numel()} for {x.shape[1]} -> {c} channels, {taps} taps")


def dense_panels(taps: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A (rows x C_out) weight matrix as panels of 16 output channels, (ceil(C_out/16), rows, 16),
    and the bias, both zero-padded to the panels (the dense kernel's layout)."""
    rows, c = taps.shape
    panels = -(-c // 16)
    w = torch.zeros(rows, panels * 16)
    w[:, :c] = taps
    padded = torch.zeros(panels * 16)
    padded[:c] = b
    return w.view(rows, panels, 16).permute(1, 0, 2).contiguous(), padded


def _pixels_unit_channels(*views: torch.Tensor) -> bool:
    return all(v.dim() == 4 and v.dtype == torch.float32 and (v.stride(1) == 1 or v.shape[1] == 1) for v in views)


def copy_call(y: torch.Tensor, x: torch.Tensor, clamp: tuple[float, float] | None = None) -> NativeCalls | None:
    """y.copy_(x) for same-shaped fp32 views that do not overlap, y's channels unit-stride; then
    clamped to `clamp` if given."""
    if not available() or x.shape != y.shape or not (_pixels_unit_channels(y) and x.dim() == 4 and x.dtype == y.dtype):
        return None
    if clamp is None:
        return NativeCalls([("copy", _args(x, y, ()))])
    return NativeCalls([("copy_clamp", _args(x, y, (), lo=clamp[0], hi=clamp[1]))])


def pool_call(y: torch.Tensor, x: torch.Tensor, kernel, stride, pad: tuple[int, int], clamp: tuple[float, float],
              inverse_divisors: torch.Tensor | None) -> NativeCalls | None:
    """Max pooling (`inverse_divisors` None) or average pooling (per output pixel of `y`, the
    inverse of its divisor) of view `x` into view `y`, windows as `conv_call` takes them, then
    clamped; fp32 views with unit channel stride."""
    if not available() or not _pixels_unit_channels(x, y) or x.shape[:2] != y.shape[:2]:
        return None
    _require(min(kernel) >= 1 and min(stride) >= 1 and min(pad) >= 0, f"kernel {kernel}, strides {stride}, padding {pad}")
    keep, w = (), None
    if inverse_divisors is not None:
        keep = (inverse_divisors.to(torch.float32).contiguous(),)
        _require(tuple(keep[0].shape) == tuple(y.shape[2:]), f"divisors {tuple(keep[0].shape)} for outputs {tuple(y.shape[2:])}")
        w = keep[0].data_ptr()
    args = _args(x, y, keep, w=w, kh=kernel[0], kw=kernel[1], sh=stride[0], sw=stride[1], pt=pad[0], pl=pad[1],
                 lo=clamp[0], hi=clamp[1])
    return NativeCalls([("pool", args)])


def move_call(y: torch.Tensor, x: torch.Tensor) -> NativeCalls | None:
    """y.copy_(x) for same-shaped fp32 views of one buffer with the same strides (y is x moved)
    that may overlap, channels unit-stride."""
    if (not available() or x.shape != y.shape or x.stride() != y.stride() or not _pixels_unit_channels(x, y)
            or x.dtype != y.dtype):
        return None
    return NativeCalls([("move", _args(x, y, ()))])


def input_call(y: torch.Tensor, at: tuple[int, int, int], shape: tuple[int, ...]) -> tuple[NativeCalls, ConvArgs, int] | None:
    """A copy into view `y` of the same-sized region at (sample, row, column) `at` of a
    contiguous (N, C, H, W) fp32 input of `shape` that is not known yet: (the call, its arguments,
    the region's byte offset); the caller sets `args.x` to the input's address plus the offset
    before each run."""
    if not available() or len(shape) != 4 or not _pixels_unit_channels(y):
        return None
    _, c, h, w = shape
    _require(y.shape[1] == c and min(at) >= 0 and at[0] + y.shape[0] <= shape[0] and at[1] + y.shape[2] <= h
             and at[2] + y.shape[3] <= w, f"a {tuple(y.shape)} region at {at} of an input of shape {tuple(shape)}")
    args = ConvArgs(x=None, y=y.data_ptr(), n=y.shape[0], c=c, oh=y.shape[2], ow=y.shape[3], xs_n=c * h * w, xs_h=w, xs_w=1,
                    xs_c=h * w, ys_n=y.stride(0), ys_h=y.stride(2), ys_w=y.stride(3))
    args.keep = (y,)
    offset = (at[0] * c * h * w + at[1] * w + at[2]) * y.element_size()
    return NativeCalls([("copy", args)]), args, offset


def shuffle_call(y: torch.Tensor, x: torch.Tensor, groups: int) -> NativeCalls | None:
    """y = x with its channels shuffled in `groups` (ops/shape.ChannelShuffle), for same-shaped fp32
    views that do not overlap, channels unit-stride."""
    if not available() or x.shape != y.shape or not _pixels_unit_channels(x, y) or x.shape[1] % groups:
        return None
    return NativeCalls([("shuffle", _args(x, y, (), groups=groups))])


def scale_shift_call(y: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                     clamp: tuple[float, float]) -> NativeCalls | None:
    """y = clamp(x * scale + shift), `scale` and `shift` one value per channel, for same-shaped fp32
    views with unit channel stride; y may be x."""
    if not available() or x.shape != y.shape or not _pixels_unit_channels(x, y):
        return None
    scale, shift = scale.reshape(-1).contiguous(), shift.reshape(-1).contiguous()
    _require(scale.numel() == shift.numel() == y.shape[1] and scale.dtype == shift.dtype == torch.float32,
             f"scale {scale.numel()} and shift {shift.numel()} for {y.shape[1]} channels")
    args = _args(x, y, (scale, shift), w=scale.data_ptr(), b=shift.data_ptr(), lo=clamp[0], hi=clamp[1])
    return NativeCalls([("scale_shift", args)])


def add_call(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, clamp: tuple[float, float]) -> NativeCalls | None:
    """y = clamp(x + w) for same-shaped fp32 views with unit channel stride; y may be x or w."""
    if not available() or not (x.shape == w.shape == y.shape) or not _pixels_unit_channels(x, w, y):
        return None
    args = _args(x, y, (w,), w=w.data_ptr(), ws_n=w.stride(0), ws_h=w.stride(2), ws_w=w.stride(3), lo=clamp[0], hi=clamp[1])
    return NativeCalls([("add", args)])
