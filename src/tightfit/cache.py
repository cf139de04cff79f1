"""Where tightfit keeps what it derives once per machine: exported zoo models, the native
kernels' library, the cost profile. A module of its own below every package that caches."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path | None:
    """$TIGHTFIT_CACHE if set (0/off/no: no disk cache), else $XDG_CACHE_HOME/tightfit or
    ~/.cache/tightfit."""
    setting = os.environ.get("TIGHTFIT_CACHE", "").strip()
    if setting.lower() in ("0", "off", "no", "false", "none"):
        return None
    if setting and setting.lower() not in ("1", "on", "yes", "true"):
        return Path(setting).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tightfit"
