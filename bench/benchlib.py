"""What every benchmark prints first, and how it words timings and verdicts.

- `header()`: the machine (CPU model, cores, torch threads used), the cost profile id, and the
  load average at the start; the load average at the end is printed when the benchmark exits.
- `loaded()`: " [loaded]" after a timing taken while the 1-minute load average exceeds the core
  count (other work shared the cores: such a time is slower, and noisier, than the machine's);
  `load_mark(load)` the same for a load sampled earlier (timings taken over several rounds).
- `verdict()`: "yes" only when every condition of a target holds, else "NO (" the failed ones ")".
"""
from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Sequence


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cores() -> int:
    return os.cpu_count() or 1


def load_average() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def is_loaded() -> bool:
    return load_average() > cores()


def loaded() -> str:
    """' [loaded]' when timings taken now share the cores with other work, else ''."""
    return load_mark(load_average())


def load_mark(load: float) -> str:
    """' [loaded: ...]' for timings taken at this 1-minute load average (e.g. the highest sampled
    while they were taken) if it exceeds the core count, else ''."""
    return f" [loaded: load {load:.1f} > {cores()} cores]" if load > cores() else ""


def header(title: str, profile_id: str | None = None) -> None:
    """Print the machine, the torch threads in use, the cost profile and the load; the load at the
    end follows when the process exits."""
    if profile_id is None:
        from tightfit.runtime.cost import profile_id as current

        profile_id = current()
    print(f"{title}")
    print(f"machine: {cpu_model()}, {cores()} cores; torch threads {_torch_threads()}; "
          f"cost profile {profile_id}")
    print(f"load average at start: {_loads()}{'  (loaded: timings below are marked)' if is_loaded() else ''}")
    print("(a timing taken while the 1-minute load average exceeds the core count is marked [loaded])", flush=True)
    atexit.register(lambda: print(f"\nload average at end: {_loads()}", flush=True))


def _torch_threads() -> str:
    """torch's intra-op threads, where torch (an optional extra) is installed."""
    try:
        import torch
    except ImportError:
        return "- (not installed)"
    return str(torch.get_num_threads())


def _loads() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min) on {cores()} cores"


def verdict(checks: Sequence[tuple[bool, str]]) -> str:
    """'yes' if every (holds, what failed) check holds, else 'NO (' + what failed + ')'."""
    failed = [why for ok, why in checks if not ok]
    return "yes" if not failed else f"NO ({'; '.join(failed)})"


def verified(plan, g) -> tuple[bool, str]:
    """(outputs equal the reference executor's, why not): a verdict's condition."""
    from tightfit.fit import VerificationFailed, verify

    try:
        verify(plan, [g])
        return True, ""
    except VerificationFailed as e:
        return False, f"outputs not verified: {e}"
