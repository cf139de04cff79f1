"""The load and write stages' files: plan files read (their models loaded and checked) and
written, a run's inputs read and outputs written, and fit's folder (plan.json, report.json,
report.txt, memory.png). Every file and folder is written whole or not at all (tightfit.atomic):
an error or a signal leaves what was there."""
from __future__ import annotations

import io
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from tightfit import atomic
from tightfit.errors import OptionError
from tightfit.frontend import zoo
from tightfit.frontend.load import load_ref
from tightfit.graph.fingerprint import fingerprint
from tightfit.graph.forms import TO_NCHW, nhwc_shape
from tightfit.graph.ir import Graph
from tightfit.plan import schema
from tightfit.plan.check import check_plan
from tightfit.report import fit_plot, fit_text
from tightfit.stages import FitOutcome


def load_plan(path: str | Path, loaded: Mapping[tuple[str, tuple[int, ...]], Graph] | None = None,
              allow_code: bool = False):
    """Read a plan file, load the models it names (or take them from `loaded`, keyed by spec and
    input shape), check fingerprints and the plan itself. A model named by module:factory is
    loaded only with `allow_code` (a file carries data, not code)."""
    p = Path(path)
    plan_ = schema.read_plan(p)
    graphs = []
    for ref in plan_.models:
        spec = _model_file(ref, p.parent)
        g = (loaded or {}).get((ref.spec, tuple(ref.input_shape))) or load_ref(spec, ref.shapes(), allow_code, f"plan {p}")
        if fingerprint(g) != ref.fingerprint:
            raise schema.PlanError(f"plan {p} was made for another model than {spec} (fingerprint {fingerprint(g)}, "
                                   f"the plan's {ref.fingerprint}): was it changed? plan it again")
        graphs.append(g)
    check_plan(plan_, graphs)
    return plan_, graphs


def _model_file(ref, folder: Path) -> str:
    """Where a plan's model is: a zoo name or module:factory as written; a file relative to the
    plan's folder, else as written (relative to the working folder), else where it was when the
    plan was written. A missing file is one line naming every place looked at."""
    if ref.spec in zoo.names() or not _looks_like_file(ref.spec):
        return ref.spec
    candidates = [folder / ref.spec, Path(ref.spec)] + ([Path(ref.location)] if ref.location else [])
    for c in candidates:
        if c.is_file():
            return str(c)
    raise schema.PlanError(f"model file of the plan not found: looked at {', '.join(dict.fromkeys(map(str, candidates)))}")


def _looks_like_file(spec: str) -> bool:
    return spec.lower().endswith(".onnx") or Path(spec).is_file() or ("/" in spec and ":" not in spec)


def portable(plan_, folder: str | Path):
    """The plan with each model file named relative to `folder` (where the plan file goes) and by
    its absolute path, so the plan folder can be run from anywhere and moved (see load_plan)."""
    folder = Path(folder).resolve()
    models = []
    for ref in plan_.models:
        if ref.spec in zoo.names() or not Path(ref.spec).is_file():
            models.append(ref)
            continue
        target = Path(ref.spec).resolve()
        models.append(replace(ref, spec=Path(os.path.relpath(target, folder)).as_posix(), location=str(target)))
    return replace(plan_, models=tuple(models))


def write_plan(plan_, path: str | Path) -> None:
    """Write a plan file (its model paths made portable), to a temporary name renamed into place
    (OSError: atomic.OutputError, one line)."""
    path = Path(path)
    if path.is_dir():
        raise atomic.OutputError(f"{path} is a folder; a plan is one JSON file: name one, e.g. {path / 'plan.json'}")
    atomic.write_text(path, schema.dumps(portable(plan_, path.parent)))


def read_inputs(path: str | Path, shapes: Sequence, dtypes: "Sequence[np.dtype] | None" = None,
                nhwc: "Sequence[tuple[int, ...] | None] | None" = None) -> list:
    """Every CNN's input from a file: .npy (one CNN of one input; its shape, or the same number of
    values), or raw bytes holding every CNN's inputs one after another (a CNN of several inputs:
    each of them in its input order), each in its model file's layout (NCHW, or NHWC for an input
    the file takes channels-last, as the exported program reads it). `dtypes`: every input's
    element type in that order (default float32). A float32 input's raw bytes are float32 (4 a value) or int8 (1 a value; the
    file's size tells which); an int8 input (a .tflite taking int8) is int8 values, in a .npy of
    integers or 1 raw byte each. `shapes`: per CNN its input shape, or {input name: shape}. `nhwc`:
    every input's shape in its model file where the file takes it channels-last (a .tflite), else
    None: raw bytes are NHWC, and so is a .npy of that shape (a .npy of the NCHW shape is taken as
    NCHW). Answers per CNN an array, or {input name: array}. OptionError: one line saying what was expected."""
    path = Path(path)
    flat_shapes = [s for per in shapes for s in (per.values() if isinstance(per, Mapping) else [per])]
    kinds = [np.dtype(d) for d in dtypes] if dtypes is not None else [np.dtype(np.float32)] * len(flat_shapes)
    if not path.is_file():
        raise OptionError(f"--input {path}: " + ("is a folder, not a file" if path.is_dir() else "no such file"))
    if path.suffix == ".npy":
        if len(flat_shapes) > 1:
            raise OptionError(f"--input {path}: the plan has {len(flat_shapes)} inputs; give them as one raw file")
        arrays = [_npy_input(path, flat_shapes[0], kinds[0], nhwc[0] if nhwc else None)]
    else:
        marks = list(nhwc) if nhwc else [None] * len(flat_shapes)
        file_shapes = [nhwc_shape(s) if m is not None and len(s) == 4 else tuple(s) for s, m in zip(flat_shapes, marks)]
        arrays = [np.ascontiguousarray(a.transpose(TO_NCHW)) if f != tuple(s) else a
                  for a, f, s in zip(_raw_inputs(path, file_shapes, kinds), file_shapes, flat_shapes)]
    out: list = []
    for per in shapes:
        if isinstance(per, Mapping):
            out.append({name: arrays.pop(0) for name in per})
        else:
            out.append(arrays.pop(0))
    return out


def _npy_input(path: Path, shape: Sequence[int], kind: np.dtype, nhwc: "tuple[int, ...] | None") -> np.ndarray:
    """A .npy input: float32 (from any numbers) or int8 (from integers in int8's range); in the
    model file's NHWC layout where its shape is that (`nhwc`), else NCHW."""
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise OptionError(f"--input {path}: not a readable .npy file ({e})") from None
    shown = "x".join(map(str, shape))
    if arr.size != int(np.prod(shape)) or arr.dtype.kind not in "fiu":
        raise OptionError(f"--input {path}: holds {arr.dtype} {'x'.join(map(str, arr.shape))}; the model takes {shown} numbers")
    if kind == np.int8 and (arr.dtype.kind not in "iu" or (arr.size and (arr.min() < -128 or arr.max() > 127))):
        raise OptionError(f"--input {path}: holds {arr.dtype}; the model's input is int8 {shown}: give int8 values "
                          "(quantized with the input's scale and zero point, as `inspect` lists them)")
    if nhwc is not None and len(shape) == 4 and tuple(arr.shape) == nhwc_shape(shape) != tuple(shape):
        arr = arr.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(arr, dtype=kind).reshape(shape)


def _raw_inputs(path: Path, flat_shapes: list, kinds: list[np.dtype]) -> list[np.ndarray]:
    """Raw inputs one after another, each in its element type (float inputs: all float32 or all int8)."""
    sizes = [int(np.prod(s)) for s in flat_shapes]
    data = path.read_bytes()
    as_typed = sum(z * k.itemsize for z, k in zip(sizes, kinds))
    floats_as_int8 = len(data) != as_typed and len(data) == sum(sizes)  # a float model fed int8 bytes
    if len(data) != as_typed and not floats_as_int8:
        shapes = " + ".join("x".join(map(str, s)) for s in flat_shapes)
        if all(k == np.float32 for k in kinds):
            raise OptionError(f"--input {path}: expected {as_typed} bytes (float32, {shapes}) or {sum(sizes)} (int8), "
                              f"got {len(data)}")
        shown = " + ".join(f"{'x'.join(map(str, s))} {'int8' if k == np.int8 else 'float32'}"
                           for s, k in zip(flat_shapes, kinds))
        raise OptionError(f"--input {path}: expected {as_typed} bytes ({shown}), got {len(data)}")
    at, arrays = 0, []
    for shape, size, kind in zip(flat_shapes, sizes, kinds):
        stored = np.dtype(np.int8) if floats_as_int8 or kind == np.int8 else np.dtype("<f4")
        arrays.append(np.frombuffer(data, stored, size, at).astype(kind).reshape(shape))
        at += size * stored.itemsize
    return arrays


def write_outputs(path: str | Path, outputs: "Sequence[tuple[str, np.ndarray]]") -> str:
    """The outputs (name, tensor) into a file, whole or not at all: .npy (one output), .npz (every
    output by name), each in its type (float32, or int8 for an int8 output), else raw float32, every
    output one after another (as the exported program writes them: an int8 output's integers as
    floats). Returns what was written, for the report."""
    path = Path(path)
    if path.is_dir():
        raise OptionError(f"--output {path} is a folder: name a file (.npy, .npz or raw float32)")
    # An int8 output (a .tflite's) stays int8 in .npy and .npz; raw files are float32 throughout.
    arrays = [(name, np.asarray(t) if np.asarray(t).dtype == np.int8 else np.asarray(t, dtype=np.float32))
              for name, t in outputs]
    buf = io.BytesIO()
    if path.suffix == ".npy":
        if len(arrays) != 1:
            raise OptionError(f"--output {path}: the model has {len(arrays)} outputs; write them to .npz or a raw file")
        np.save(buf, arrays[0][1])
    elif path.suffix == ".npz":
        np.savez(buf, **{name: a for name, a in arrays})
    else:
        buf.write(b"".join(np.ascontiguousarray(a, dtype="<f4").tobytes() for _, a in arrays))
    atomic.write_bytes(path, buf.getvalue())
    return ", ".join(f"{name} {'x'.join(map(str, a.shape))}" for name, a in arrays)


def write_fit_folder(o: FitOutcome, out: str | Path, r: dict, force: bool = False) -> None:
    """plan.json, report.json, report.txt and memory.png, written into a staged folder that takes
    `out`'s place when complete (nothing partial on disk; an existing non-empty `out` is replaced,
    whole, only with `force`; a file is never replaced)."""
    out = Path(out)
    with atomic.output_folder(out, force) as tmp:  # OSError: one line (atomic.OutputError), nothing left
        (tmp / "plan.json").write_text(schema.dumps(portable(o.plan, out)))
        (tmp / "report.json").write_text(json.dumps(r, indent=1) + "\n")
        (tmp / "report.txt").write_text(fit_text(r) + "\n")
        (tmp / "memory.png").write_bytes(fit_plot(o))
