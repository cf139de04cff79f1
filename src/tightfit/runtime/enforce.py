"""--enforce: run under RLIMIT_DATA = what the loaded process already maps + a limit, so a plan
that needs more memory than analysed fails instead of silently using it."""
from __future__ import annotations

import resource

from tightfit.errors import TightfitError

# Allocator and thread bookkeeping that a run maps besides the arena and kernel temporaries
# (malloc arena headers, OpenMP thread stacks touched lazily): measured on resnet18 and stated.
MARGIN = 16 * 2**20


class OutOfMemory(TightfitError):
    """The run did not fit under the enforced limit."""


def _vm_data() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmData missing from /proc/self/status")


def enforce_limit(analysed_peak: int | None, limit: int | None = None) -> int:
    """Cap this process's data segment at current + (limit or analysed peak + MARGIN). Returns
    the bytes allowed above the current mappings."""
    allowed = limit if limit is not None else (analysed_peak or 0) + MARGIN
    cap = _vm_data() + allowed
    resource.setrlimit(resource.RLIMIT_DATA, (cap, resource.getrlimit(resource.RLIMIT_DATA)[1]))
    return allowed
