"""Peak memory of a real run, measured the one way DEVELOPERS.md prescribes: a fresh process with
MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0 (so freed buffers go back to the OS),
the high-water mark reset (write 5 to /proc/self/clear_refs) after loading and one warm-up run,
then VmHWM read after the measured run. Reported: the peak above the loaded baseline, and how far
the kernel's count may be off (`uncertainty_bytes`, see `counter_uncertainty_bytes`).

For a plan, loading includes building the executor (its compiled steps are Python objects that
a deployed runtime keeps as code, ~100-200 B a step); its arena's pages are then given back
(`release_pages`), so the run counts the arena pages it touches and its kernels' temporaries,
which is what the analyser counts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tightfit import children

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


@dataclass(frozen=True)
class Measured:
    baseline_bytes: int   # resident after loading and warm-up, before the measured run
    peak_bytes: int       # VmHWM during the measured run
    seconds: float        # wall time of the measured run
    uncertainty_bytes: int = 0  # run_bytes may be off by this much either way (the kernel's page counters)

    @property
    def run_bytes(self) -> int:
        """What the run itself added on top of the loaded process."""
        return self.peak_bytes - self.baseline_bytes


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _libc():
    import ctypes
    import ctypes.util

    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _release_free_heap() -> None:
    """Give the pages of free heap chunks back to the OS. glibc serves even a request above the
    mmap threshold from a free chunk when one is big enough, and a chunk freed inside the heap
    (not at its top) stays resident, so without this the run's arena could land on pages that
    were already counted in the baseline and the measured peak would fall below the plan's."""
    _libc().malloc_trim(0)


MADV_DONTNEED = 4
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_FOLDING_PAGES = 128  # above twice the kernel's per-CPU batch (max(32, 2 x CPUs) pages) on up to 64 CPUs


def counter_uncertainty_bytes(cpus: int | None = None) -> int:
    """How far VmHWM may be off either way. The kernel counts a process's pages in per-CPU
    counters that each hold up to a batch minus one page (batch: max(32, 2 x online CPUs)) before
    handing them to the shared count; the high-water mark is taken from the shared count whenever
    memory is unmapped. After `_sync_page_counters` only the anonymous pages a run moves are
    pending, on at most `cpus` CPUs (default: those this process may run on)."""
    batch = max(32, 2 * (os.cpu_count() or 1))
    return (cpus or len(os.sched_getaffinity(0))) * (batch - 1) * PAGE_BYTES


def _a_mapped_file(min_bytes: int) -> str:
    """A file this process already maps (a shared library) of at least `min_bytes`: reading it
    costs no new page cache."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split(maxsplit=5)[-1].strip()
            if path.startswith("/") and os.path.isfile(path) and os.path.getsize(path) >= min_bytes:
                return path
    raise RuntimeError("no mapped file to settle the page counters with")


def _sync_page_counters() -> None:
    """Make the kernel's count of this process's resident pages exact before the high-water mark
    is reset. The count is a per-CPU counter: each CPU keeps up to a batch of pages (32 on a small
    machine) to itself until it passes the batch, and the reset copies the shared part only, so the
    mark could start up to ~250 KB off either way. Unmapping more than twice the batch at once on a
    CPU hands its whole share over, so on every CPU this maps, touches and unmaps one anonymous
    and one file-backed region (the counters a run moves)."""
    import mmap

    cpus = os.sched_getaffinity(0)
    file_fd = os.open(_a_mapped_file(_FOLDING_PAGES * PAGE_BYTES), os.O_RDONLY)
    try:
        for cpu in sorted(cpus):
            os.sched_setaffinity(0, {cpu})
            region = mmap.mmap(-1, _FOLDING_PAGES * PAGE_BYTES)
            for page in range(_FOLDING_PAGES):
                region[page * PAGE_BYTES] = 1
            region.close()
            region = mmap.mmap(file_fd, _FOLDING_PAGES * PAGE_BYTES, prot=mmap.PROT_READ)
            for page in range(_FOLDING_PAGES):
                region[page * PAGE_BYTES]
            region.close()
    finally:
        os.sched_setaffinity(0, cpus)
        os.close(file_fd)


def release_pages(t: "np.ndarray") -> None:
    """Give the whole pages under an array (the arena) back to the OS while keeping its address,
    so every view of it stays valid: they read as zeros and count again once a run touches them.
    (At most two partial pages at its ends stay resident.)"""
    import ctypes

    start = -(-t.ctypes.data // PAGE_BYTES) * PAGE_BYTES
    end = (t.ctypes.data + t.nbytes) // PAGE_BYTES * PAGE_BYTES
    if end > start and _libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_DONTNEED) != 0:
        raise OSError(ctypes.get_errno(), "madvise(MADV_DONTNEED) failed")


def measure_in_this_process(run: Callable[[], Any], warmup: int = 1, settle: Callable[[], None] | None = None,
                            limit_bytes: int | None = None) -> Measured:
    """Only meaningful in a process started with MALLOC_ENV (see measure_subprocess).
    `settle` runs after the warm-up, before the baseline is read (a plan job releases its
    arena's pages there). `limit_bytes`: the measured run alone under RLIMIT_DATA = the data
    segment before it + this (--enforce); the measuring code allocates before and after."""
    import contextlib
    import gc
    import time

    from tightfit.runtime.enforce import Limited

    for _ in range(warmup):
        run()
    gc.collect()
    if settle is not None:
        settle()
    _release_free_heap()
    _sync_page_counters()
    baseline = _status_kib("VmRSS")
    clear_refs = os.open("/proc/self/clear_refs", os.O_WRONLY)
    limit = Limited(limit_bytes) if limit_bytes is not None else contextlib.nullcontext()
    clock = time.perf_counter
    try:
        os.write(clear_refs, b"5")
        with limit:
            t0 = clock()
            run()
            t1 = clock()
    finally:
        os.close(clear_refs)
    return Measured(baseline, _status_kib("VmHWM"), t1 - t0, counter_uncertainty_bytes())


def measure_subprocess(job: dict[str, Any], timeout: float = 900) -> Measured:
    """Run `job` (see tightfit/_child.py) in a fresh interpreter and return its measurement."""
    return Measurement(job).result(timeout)


def _shape_json(shape) -> "list[int] | dict[str, list[int]]":
    """An input shape, or {input name: shape} (a model of several inputs), as JSON."""
    return {k: list(v) for k, v in shape.items()} if isinstance(shape, dict) else list(shape)


class Measurement:
    """`job` (see tightfit/_child.py) started in a fresh interpreter; the caller may work meanwhile
    (the peak is the measuring process's own), then wait for `result()` or `cancel()` it. With `job`
    None the process starts now and loads the `preload` models (zoo spec, input shape) while the
    caller works; `send` gives it the job. `threads`: OMP_NUM_THREADS for the libraries it loads
    (onnxruntime's, a user's torch) unless the environment says (default: one per core)."""

    def __init__(self, job: dict[str, Any] | None, preload: Sequence[tuple[str, Sequence[int]]] = (),
                 threads: int | None = None):
        env = dict(os.environ, **MALLOC_ENV)
        env.setdefault("OMP_NUM_THREADS", str(threads or os.cpu_count() or 1))
        self.job = job
        args = [json.dumps(job)] if job is not None else ["--preload", json.dumps([[s, _shape_json(x)] for s, x in preload])]
        self.proc = children.popen([sys.executable, "-m", "tightfit._child", *args],
                                   stdin=subprocess.PIPE if job is None else None,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def send(self, job: dict[str, Any]) -> None:
        self.job = job
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # the process ended early: result() reports why
            pass

    def result(self, timeout: float = 900) -> Measured:
        try:
            stdout, stderr = self.proc.communicate(timeout=timeout)
        except BaseException:  # a timeout, or a signal on its way to the CLI
            self.cancel()
            raise
        children.LIVE.pop(self.proc.pid, None)
        return _measured(self.job, self.proc.returncode, stdout, stderr)

    def cancel(self) -> None:
        children.kill(self.proc)


def _measured(job: dict[str, Any], returncode: int, stdout: str, stderr: str) -> Measured:
    if returncode == 3:  # _child.OUT_OF_MEMORY
        from tightfit.runtime.enforce import OutOfMemory
        from tightfit.units import human

        raise OutOfMemory(f"out of memory: the run needs more than the enforced limit of "
                          f"{human(job['enforce_bytes'])} above the loaded model")
    if returncode != 0:
        raise RuntimeError(f"measurement process failed ({returncode}): {stderr.strip()[-2000:]}")
    data = json.loads(stdout.strip().splitlines()[-1])
    return Measured(data["baseline_bytes"], data["peak_bytes"], data["seconds"], data["uncertainty_bytes"])
