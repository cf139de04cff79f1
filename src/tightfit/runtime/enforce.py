"""--enforce: run under RLIMIT_DATA = what the loaded process already maps + a limit, so a plan
that needs more memory than analysed fails instead of silently using it. It runs in a fresh
process started with the measurement's malloc settings (large blocks are fresh mappings), since
a process that has freed memory before would reuse it unseen by the limit."""
from __future__ import annotations

import resource

from tightfit.errors import TightfitError

# Mappings a run makes besides the arena and kernel temporaries (malloc arenas, OpenMP thread
# state): measured 2.3 MiB on resnet18 (its reuse plan completes at +10 MiB, analysed 7.71 MiB).
MARGIN = 4 * 2**20


class OutOfMemory(TightfitError):
    """The run did not fit under the enforced limit."""


def _vm_data() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmData missing from /proc/self/status")


class Limited:
    """`with Limited(allowed):` the data segment capped at its size on entry + `allowed`, and the
    cap lifted on exit. Everything it needs is made before the cap is set, so that the code run
    inside is the only thing measured against it."""

    def __init__(self, allowed: int):
        self.allowed = allowed
        self.before = resource.getrlimit(resource.RLIMIT_DATA)

    def __enter__(self) -> "Limited":
        cap = (_vm_data() + self.allowed, self.before[1])
        resource.setrlimit(resource.RLIMIT_DATA, cap)
        return self

    def __exit__(self, *exc) -> None:
        resource.setrlimit(resource.RLIMIT_DATA, self.before)


def enforce_limit(analysed_peak: int | None, limit: int | None = None) -> int:
    """Cap this process's data segment at current + (limit or analysed peak + MARGIN). Returns
    the bytes allowed above the current mappings."""
    allowed = limit if limit is not None else (analysed_peak or 0) + MARGIN
    cap = _vm_data() + allowed
    resource.setrlimit(resource.RLIMIT_DATA, (cap, resource.getrlimit(resource.RLIMIT_DATA)[1]))
    return allowed


def available_bytes() -> int:
    """Memory this machine can give a new job now without swapping (MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 2**62  # unknown: nothing is refused


def require_available(need_bytes: int, what: str) -> None:
    """Refuse, in one line, a job this machine cannot hold, before it allocates anything (the
    kernel's OOM killer would end it without a word, or take another process with it)."""
    have = available_bytes()
    if need_bytes > have:
        from tightfit.units import human

        raise OutOfMemory(f"{what} needs about {human(need_bytes)}; this machine has {human(have)} available")
