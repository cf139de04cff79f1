"""Whether outputs are the same: DESIGN.md invariant 1, one definition for every check (the
arena executor, onnxruntime, the exported C program)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

RTOL = 1e-4  # max abs diff <= 1e-4 x max abs value


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs_diff: float
    max_abs_ref: float
    tolerance: float
    against: str = ""  # the reference, where not the check's usual one

    def as_dict(self) -> dict:
        return asdict(self)


def compare(got, ref, rtol: float = RTOL) -> Comparison:
    got_a = np.asarray(got, dtype=np.float64)
    ref_a = np.asarray(ref, dtype=np.float64)
    if got_a.shape != ref_a.shape and _squeezed(got_a.shape) == _squeezed(ref_a.shape):
        # The same elements in the same order, size-1 dims aside: ONNX's Squeeze without axes
        # drops the batch dim of a batch-1 output, which tightfit's graphs always keep.
        got_a = got_a.reshape(ref_a.shape)
    if got_a.shape != ref_a.shape:
        return Comparison(False, float("inf"), float(np.abs(ref_a).max(initial=0)), 0.0)
    # Non-finite reference values (a model whose weights overflow or hold NaN) must be matched
    # exactly, NaN by NaN and infinity by the same infinity; the rest within the tolerance.
    finite = np.isfinite(ref_a)
    same_special = bool(np.array_equal(got_a[~finite], ref_a[~finite], equal_nan=True))
    scale = float(np.abs(ref_a[finite]).max(initial=0.0))
    diff = float(np.abs(got_a[finite] - ref_a[finite]).max(initial=0.0))
    tol = rtol * scale
    return Comparison(bool(diff <= tol and np.isfinite(got_a[finite]).all() and same_special), diff, scale, tol)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def worst(comparisons) -> Comparison:
    """The comparison that decides: the first failing one, else the largest difference."""
    out = None
    for c in comparisons:
        if out is None or (out.ok and (not c.ok or c.max_abs_diff > out.max_abs_diff)):
            out = c
    assert out is not None, "nothing compared"
    return out
