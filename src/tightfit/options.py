"""One options object per command: what the user asked for, as values (sizes in bytes, shapes as
tuples, phases as a mapping). The CLI's parser builds them from the command line and the API
from its keyword arguments, and every stage of the pipeline (tightfit.pipeline) is a function of
one of them, so a command means the same thing whichever door it came in by.

Besides the user's choices an options object may carry what a caller supplies to the stages (a
cost model, a progress callback, a timer): fields left out of comparison. Which options go
together is checked by the pipeline's first stage, not here, so that a mistake is one line
naming the command's option (OptionError), the same from the CLI and the API."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:
    from tightfit.runtime.cost import CostModel
    from tightfit.techniques.fit import SearchOptions
    from tightfit.techniques.interface import Technique


def is_plan_file(path: str) -> bool:
    """A plan names a .json file, or a file of JSON by another name (`plan --out p` writes one)."""
    if path.endswith(".json"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(64).lstrip().startswith(b"{")  # ONNX and .tflite files are binary
    except OSError:
        return False


def silent(line: str) -> None:
    """The progress reporter of a command nobody watches."""


# --input-shape: one shape, or each input's by name (a model of several inputs)
InputShape = tuple[int, ...] | dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class InspectOptions:
    """`tightfit inspect`: per-layer memory accounting."""

    model: str
    input_shape: InputShape | None = None
    dtype: str = "fp32"
    workspace: str = "none"
    batch: int = 1


@dataclass(frozen=True)
class PlanOptions:
    """`tightfit plan` and `tightfit.api.plan`: a technique's plan of a model or an application.

    `phases` {layer id or name: phases} or "max" and `rows` (output rows per phase) and `held`
    (layers held whole) go with method "parts"; `tiling` ("0-7:5x5,8-15:2x2:reuse") with
    "tiling"; `unit_bytes` and `latency` with "vbs". `inplace`: the plan then lays layers' outputs
    over their own inputs' bytes where the kernels' walks allow (ops/walks.py) and that shrinks
    the arena (plan/overlay.overlap_in_place). `stream_outputs` (with "parts"): the outputs are
    handed to the caller by rows as they are computed, never whole in the arena. With `budget` (bytes of run memory) the
    technique's search picks the fastest plan that fits, timed by `cost` (default this machine's
    profile, measured again with `reprofile`) within `time_limit` seconds of search. `out`: the
    plan file to write."""

    model: str
    method: str = "reuse"
    planner: str = "improve"
    order: str = "imported"
    layout: str = "nhwc"
    batch: int = 1
    input_shape: InputShape | None = None
    phases: Mapping[int | str, int] | str | None = None
    rows: int | None = None
    budget: int | None = None
    tiling: str | None = None
    unit_bytes: int | None = None
    latency: float | None = None
    held: tuple[int | str, ...] = ()
    time_limit: float | None = None
    allow_code: bool = False
    reprofile: bool = False
    out: str | None = None
    layout_map: bool = False
    inplace: bool = False
    stream_outputs: bool = False
    cost: CostModel | None = field(default=None, compare=False)
    say: Callable[[str], None] = field(default=silent, compare=False)


@dataclass(frozen=True)
class CsdfOptions:
    """`tightfit csdf`: the model as a cyclo-static dataflow graph."""

    model: str
    input_shape: InputShape | None = None
    phases: str = ""
    source_rows: str = ""
    source_phases: int | None = None
    itemsize: int = 1
    format: str = "dot"


@dataclass(frozen=True)
class RunOptions:
    """`tightfit run`: a model on the reference executor, or a plan file on the arena executor."""

    model: str
    input_shape: InputShape | None = None
    verify: bool = False
    measure: bool = False
    enforce: bool = False
    limit: str | None = None
    input: str | None = None
    output: str | None = None
    allow_code: bool = False
    threads: int = 1  # that share each convolution's output rows (the same bits at any count)


@dataclass(frozen=True)
class FitOptions:
    """`tightfit fit` and `tightfit.api.fit`: every technique searched for the plan that fits.

    `budget` in bytes (run memory, or with `with_params` parameters too), `min_fps` "X" or
    "X,Y,..." (one per CNN), `objective` "speed" or "memory". The command's own: `model`,
    `input_shape`, `batch`, `allow_code`, the folders `out` and `export` (replaced whole only with
    `force`), a microcontroller `target` with its `ram` and `flash` as written, and `threads`: the
    threads the chosen plan's candidates are timed with and the chosen plan is verified and measured
    with (tf_run's: a convolution's rows are shared, the outputs the same bits); `stream_outputs`:
    plans by parts may hand the outputs over by rows as they are computed (never whole in the arena). What a caller
    supplies: `cost` (default this machine's profile), `measure` (the peak in a fresh process),
    `timer` (a plan's fps per CNN; default measured), `sources` (the techniques asked for
    candidates), `progress`, `say`, and `search` (techniques.fit.SearchOptions: the genetic
    search's settings). `inplace`: every candidate is placed with layers' outputs over their own
    inputs' bytes where the kernels' walks allow (plan/overlay.overlap_in_place, as `plan
    --inplace`), and fits or not by that placement."""

    model: str = ""
    budget: int | None = None
    with_params: bool = False
    min_fps: str | None = None
    objective: str = "speed"
    seed: int = 0
    best_effort: bool = False
    thorough: bool = False
    time_limit: float | None = None
    input_shape: InputShape | None = None
    batch: int = 1
    allow_code: bool = False
    out: str | None = None
    export: str | None = None
    force: bool = False
    target: str = "host"
    ram: str | None = None
    flash: str | None = None
    threads: int = 1
    stream_outputs: bool = False
    cost: CostModel | None = field(default=None, compare=False)
    measure: bool = True
    timer: Callable[[Any, Sequence], Sequence[float]] | None = field(default=None, compare=False)
    sources: Mapping[str, Technique] | None = field(default=None, compare=False)
    progress: Callable[[int, int], None] | None = field(default=None, compare=False)
    say: Callable[[str], None] = field(default=silent, compare=False)
    search: SearchOptions | None = None
    inplace: bool = False


@dataclass(frozen=True)
class ExportOptions:
    """`tightfit export`: a plan file as a C99 library and test program in folder `out` (or, with a
    microcontroller `target`, a firmware project for its `ram` and `flash`, as written); with
    `check`, built by `cc` with `cflags`, run `runs` times (also under the sanitizers with
    `sanitize`) and compared, the checked input and reference output kept with `keep_io`."""

    plan: str
    out: str
    force: bool = False
    name: str | None = None
    weights: str = "auto"
    check: bool = False
    cc: str | None = None
    cflags: tuple[str, ...] | None = None
    runs: int = 5
    sanitize: bool = False
    keep_io: bool = False
    target: str = "host"
    ram: str | None = None
    flash: str | None = None
    allow_code: bool = False
