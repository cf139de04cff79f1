"""Child processes that never outlive tightfit. Every child (a measuring interpreter, a timing
worker, a forked search, the C compiler, an exported program) runs in a process group of its own,
so that one kill ends it and whatever it started (cc's cc1, as, ld), and asks the kernel for
SIGKILL when its parent dies (PR_SET_PDEATHSIG), so that not even a killed tightfit leaves one
behind. LIVE holds their groups; the CLI's signal handler ends them all (`kill_all`).

PR_SET_PDEATHSIG fires when the *thread* that started the child ends: children are started from
the main thread (or one that outlives them)."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import signal
import subprocess
from typing import Any, Sequence

PR_SET_PDEATHSIG = 1
LIVE: dict[int, Any] = {}  # process group id -> its Popen or multiprocessing.Process
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@functools.lru_cache(maxsize=1)
def _prctl():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return libc.prctl


def die_with_parent(parent: int) -> None:
    """In a child: be killed when `parent` (this process's parent) dies; exit now if it died
    before the request took."""
    _prctl()(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _prune() -> None:
    for pgid, proc in list(LIVE.items()):
        if getattr(proc, "returncode", None) is not None or getattr(proc, "exitcode", None) is not None:
            del LIVE[pgid]


def popen(args: Sequence[str], **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen in a process group of its own that dies with this process."""
    _prune()
    _prctl()  # resolved here: the child between fork and exec only calls it
    proc = subprocess.Popen(args, process_group=0, preexec_fn=functools.partial(die_with_parent, os.getpid()), **kwargs)
    LIVE[proc.pid] = proc
    return proc


def run(args: Sequence[str], timeout: float | None = None, **kwargs: Any) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output=True) through `popen`; on a timeout the whole group is
    killed before subprocess.TimeoutExpired is raised."""
    proc = popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        kill(proc)
        raise
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def kill(proc: subprocess.Popen) -> None:
    """End a child started by `popen` and everything in its group, and reap it."""
    _killpg(proc.pid)
    proc.communicate()
    LIVE.pop(proc.pid, None)


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_all() -> None:
    """SIGKILL every live child's group (a signal handler's first act: nothing must outlive us)."""
    for pgid in list(LIVE):
        _killpg(pgid)
    LIVE.clear()
