"""Processes of a test's command tree, found by an environment mark every child inherits (a
process group or a parent link does not survive a child that moved group or was orphaned)."""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path


def new_mark() -> tuple[str, str]:
    return "TIGHTFIT_TEST_TREE", uuid.uuid4().hex


def _environ(proc: Path) -> bytes:
    """A process's environment; read again when it comes back empty, as it now and then does
    while the process's memory map is busy (a fork, an exec)."""
    for _ in range(5):
        data = (proc / "environ").read_bytes()
        if data:
            return data
        time.sleep(0.02)
    return data


def marked(mark: tuple[str, str]) -> list[int]:
    """Live (not zombie) processes whose environment holds `mark`."""
    needle = f"{mark[0]}={mark[1]}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in _environ(d).split(b"\0"):
                state = next(l for l in (d / "status").read_text().splitlines() if l.startswith("State:"))
                if "Z" not in state.split()[1]:
                    found.append(int(d.name))
        except (OSError, StopIteration):
            continue
    return found
