"""The techniques by name, in the order fit asks them for candidates. Adding a technique: its
folder (draft, search, TECHNIQUE) and one line here."""
from __future__ import annotations

from tightfit.techniques import parts, reuse, tiling, vbs
from tightfit.techniques.interface import Technique, register, technique  # noqa: F401 (technique: by name)

TECHNIQUES: dict[str, Technique] = register(
    reuse.TECHNIQUE,
    parts.TECHNIQUE,
    tiling.TECHNIQUE,
    vbs.TECHNIQUE,
)


def fit_sources() -> dict[str, Technique]:
    """The techniques fit asks for candidate plans of every CNN."""
    return {name: t for name, t in TECHNIQUES.items() if t.fit_source}
