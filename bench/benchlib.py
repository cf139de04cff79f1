"""What every benchmark prints first, and how it words timings and verdicts.

- `header()`: the machine (CPU model, cores, torch threads used), the cost profile id, and the
  load average at the start; the load average at the end is printed when the benchmark exits.
- `loaded()`: " [loaded]" after a timing taken while the 1-minute load average exceeds the core
  count (other work shared the cores: such a time is slower, and noisier, than the machine's);
  `load_mark(load)` the same for a load sampled earlier (timings taken over several rounds).
- `verdict()`: "yes" only when every condition of a target holds, else "NO (" the failed ones ")".
- `docs_section()`: with `--write-docs` (`add_write_docs`), what the bench printed replaces its
  generated section of docs/benchmarks.md.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence


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


def set_torch_threads(n: int) -> None:
    """Give torch (an optional extra) n intra-op threads where it is installed; without it the
    kernels run single-threaded and there is nothing to set."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(n)


def _loads() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min) on {cores()} cores"


def verdict(checks: Sequence[tuple[bool, str]]) -> str:
    """'yes' if every (holds, what failed) check holds, else 'NO (' + what failed + ')'."""
    failed = [why for ok, why in checks if not ok]
    return "yes" if not failed else f"NO ({'; '.join(failed)})"


def verified(plan, g) -> tuple[bool, str]:
    """(outputs equal the reference executor's, why not): a verdict's condition."""
    from tightfit.stages import VerificationFailed, verify

    try:
        verify(plan, [g])
        return True, ""
    except VerificationFailed as e:
        return False, f"outputs not verified: {e}"


# --- figures written into docs/benchmarks.md ------------------------------------------------------
# A bench run with --write-docs replaces its own generated section of docs/benchmarks.md with what
# it printed, so a figure there changes with a rerun, never with prose.

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def emx_program() -> Path:
    """emx-onnx-cgen (the bench extra): beside this Python, else on the PATH; a path that does not
    exist when it is in neither."""
    beside = Path(sys.executable).with_name("emx-onnx-cgen")
    found = shutil.which("emx-onnx-cgen")
    return beside if beside.exists() or not found else Path(found)


def add_write_docs(ap) -> None:
    """The --write-docs flag, the same on every bench that records its figures."""
    ap.add_argument("--write-docs", action="store_true",
                    help=f"also write what this run prints into its section of {DOCS.relative_to(DOCS.parents[1])}")


def command_line(script: str) -> str:
    """How this run was started, as a docs section names it (--write-docs left out)."""
    return " ".join([f"python bench/{script}", *(a for a in sys.argv[1:] if a != "--write-docs")])


def replace_section(text: str, name: str, body: str) -> str:
    """`text` with the section `<!-- bench:NAME -->...<!-- /bench:NAME -->` replaced by `body`
    (appended at the end if the section is not there yet). A section marked twice, or whose end
    comes before its start, is a ValueError: which one to replace is not clear."""
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    i, j = text.find(begin), text.find(end)
    if text.count(begin) > 1 or text.count(end) > 1 or (i < 0) != (j < 0) or j < i:
        raise ValueError(f"docs section bench:{name} is not marked exactly once, start before end")
    if i < 0:
        return text.rstrip("\n") + "\n\n" + block + "\n"
    return text[:i] + block + text[j + len(end):]


def write_docs(name: str, body: str, path: Path | None = None) -> None:
    """Replace the section `name` of `path` (docs/benchmarks.md) with `body`, the file written
    whole or not at all."""
    from tightfit.atomic import write_text

    path = DOCS if path is None else path
    write_text(path, replace_section(path.read_text(), name, body))


class _Tee:
    def __init__(self, stream) -> None:
        self.stream, self.parts = stream, []

    def write(self, s: str) -> int:
        self.parts.append(s)
        return self.stream.write(s)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, attr):
        return getattr(self.stream, attr)


@contextmanager
def docs_section(name: str, enabled: bool, command: str) -> Iterator[None]:
    """Print as usual; if `enabled` and the block ends without an error, what it printed becomes
    the section `name` of docs/benchmarks.md, headed by the command, the date and the commit."""
    if not enabled:
        yield
        return
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    try:
        yield
    finally:
        sys.stdout = tee.stream
    head = f"Written by `{command}` on {time.strftime('%Y-%m-%d', time.gmtime())} at commit {commit()}:"
    write_docs(name, head + "\n\n```text\n" + "".join(tee.parts).strip("\n") + "\n```")
    print(f"(written into {DOCS}, section bench:{name})")


def commit() -> str:
    """The short id of this checkout's HEAD (\"unknown\" outside git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=DOCS.parents[1], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
