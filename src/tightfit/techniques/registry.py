"""The techniques by name, in the order fit asks them for candidates. Adding a technique: its
folder (draft, search, TECHNIQUE) and one line here."""
from __future__ import annotations

from tightfit.errors import OptionError
from tightfit.techniques import parts, reuse, tiling, vbs
from tightfit.techniques.interface import Technique

TECHNIQUES: dict[str, Technique] = {t.name: t for t in (
    reuse.TECHNIQUE,
    parts.TECHNIQUE,
    tiling.TECHNIQUE,
    vbs.TECHNIQUE,
)}


def technique(name: str) -> Technique:
    """The technique of that name; OptionError naming those there are."""
    if name not in TECHNIQUES:
        raise OptionError(f"unknown technique {name!r}; available: {', '.join(TECHNIQUES)}")
    return TECHNIQUES[name]


def fit_sources() -> dict[str, Technique]:
    """The techniques fit asks for candidate plans of every CNN."""
    return {name: t for name, t in TECHNIQUES.items() if t.fit_source}
