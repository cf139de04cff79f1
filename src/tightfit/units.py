"""Byte sizes as users write them ('16MB', '16MiB', '512KiB', '1.5GB') and as we print them.
MB/GB/kB are powers of 10 (Minakova's MB), MiB/GiB/KiB powers of 2 (MAFAT's 'MB')."""
from __future__ import annotations

import re

from tightfit.errors import OptionError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15, "eb": 10**18,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50, "eib": 2**60,
}
MAX_SIZE = 2**60
_PATTERN = re.compile(r"^\s*(-?[0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    m = _PATTERN.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise OptionError(f"cannot read size {text!r}: write e.g. 16MB, 16MiB, 512KiB, 1.5GB or a byte count "
                          f"(units B, kB, MB, GB, TB, PB, EB: powers of 10; KiB, MiB, GiB, TiB, PiB, EiB: powers of 2)")
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise OptionError(f"size {text!r} must be positive")
    if not value <= MAX_SIZE:  # also a number of 400 digits, which float makes infinite
        raise OptionError(f"size {text[:24]!r}{'...' if len(text) > 24 else ''} is larger than any memory (at most 1 EiB)")
    return int(round(value))


def mib(n: int) -> float:
    return n / 2**20


def mb(n: int) -> float:
    return n / 10**6


def round_half_up(x: float, digits: int) -> float:
    from decimal import ROUND_HALF_UP, Decimal

    return float(Decimal(repr(x)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def human(n: int) -> str:
    """Binary units, stated explicitly."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"
