"""Applications (Minakova thesis Sec. 6.4): several CNNs, their partitions (ranges of layer ids),
which partitions run in parallel (pipeline sets J), and per-partition schedules.

File format (YAML or JSON):

    cnns:
      - {name: big, model: resnet18}              # zoo name or .onnx path (relative to the file); module:factory with --allow-code
      - {name: small, model: mobilenet_v1_025, input_shape: 1x3x224x224}
    partitions:
      - {cnn: big, layers: 0-14}
      - {cnn: big, layers: 15-30}
      - {cnn: small, layers: all}
    pipelines: [[0, 1]]                           # partition indices that run at the same time
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tightfit.errors import TightfitError
from tightfit.frontend.load import load, named_in_file


class AppError(TightfitError):
    """An application file that cannot be used."""


@dataclass(frozen=True)
class CNNSpec:
    name: str
    model: str
    input_shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class PartitionSpec:
    cnn: int
    layers: tuple[int, ...]


@dataclass(frozen=True)
class App:
    cnns: tuple[CNNSpec, ...]
    partitions: tuple[PartitionSpec, ...]
    pipelines: tuple[tuple[int, ...], ...]


def is_app_file(spec: str) -> bool:
    return Path(spec).suffix.lower() in (".yaml", ".yml", ".json") and Path(spec).is_file()


# Parse limits for application files: a few CNNs and partitions in a few KB, nested a few levels.
MAX_APP_BYTES = 2**20
MAX_APP_DEPTH = 16
MAX_APP_INT = 2**31


def read_app(path: str) -> dict[str, Any]:
    """The file's data, every field of the expected type; within size, depth and number limits,
    YAML without aliases (an alias bomb expands exponentially)."""
    import json

    import yaml

    p = Path(path)
    try:
        if p.stat().st_size > MAX_APP_BYTES:
            raise AppError(f"application file {path} is larger than {MAX_APP_BYTES // 1024} KiB")
        text = p.read_bytes().decode("utf-8")
        if p.suffix.lower() == ".json":
            data = json.loads(text, parse_int=_small_int, parse_constant=_no_constant)
        else:
            _check_yaml_events(text, path)
            data = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise AppError(f"cannot read application file {path}: {e}".splitlines()[0]) from None
    except RecursionError:
        raise AppError(f"application file {path} is nested deeper than {MAX_APP_DEPTH} levels") from None
    if not isinstance(data, dict) or not isinstance(data.get("cnns"), list) or not data["cnns"]:
        raise AppError(f"application file {path} needs a non-empty 'cnns' list")
    _check_fields(data)
    base = p.parent
    for c in data["cnns"]:
        if c["model"].endswith(".onnx") and not Path(c["model"]).is_absolute():
            c["model"] = str(base / c["model"])
    return data


def _small_int(text: str) -> int:
    if len(text) > 12 or abs(int(text)) > MAX_APP_INT:
        raise AppError(f"the integer {text[:16]}{'...' if len(text) > 16 else ''} is beyond any layer or partition index")
    return int(text)


def _no_constant(text: str) -> Any:
    raise AppError(f"{text} is not a JSON number")


def _check_yaml_events(text: str, path: str) -> None:
    """No aliases, nesting within MAX_APP_DEPTH (checked on the event stream, before any object is built)."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise AppError(f"application file {path} uses a YAML alias (*{event.anchor}); write the value out")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_APP_DEPTH:
                raise AppError(f"application file {path} is nested deeper than {MAX_APP_DEPTH} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_fields(data: dict[str, Any]) -> None:
    """Types of every field the application reads, and CNN names unique."""
    names: list[str] = []
    for i, c in enumerate(data["cnns"]):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"] or not isinstance(c.get("model"), str) or not c["model"]:
            raise AppError(f"CNN {i}: each CNN needs a name and a model, both non-empty text")
        if c["name"] in names:
            raise AppError(f"CNNs {names.index(c['name'])} and {i} have the same name {c['name']!r}; each CNN needs its own")
        names.append(c["name"])
        shape = c.get("input_shape")
        if shape is not None and not (isinstance(shape, str) or (isinstance(shape, list) and all(_is_int(d) for d in shape))):
            raise AppError(f"CNN {c['name']!r}: input_shape {shape!r} must be written like 1x3x224x224")
    parts = data.get("partitions")
    if parts is not None and not (isinstance(parts, list) and all(isinstance(q, dict) for q in parts)):
        raise AppError("'partitions' must be a list of {cnn: NAME, layers: RANGE}")
    pipes = data.get("pipelines")
    if pipes is not None and not (isinstance(pipes, list) and all(isinstance(q, list) and all(_is_int(i) for i in q) for q in pipes)):
        raise AppError("'pipelines' must be a list of lists of partition indices, e.g. [[0, 1]]")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) <= MAX_APP_INT


def _input_shape(c: dict[str, Any]) -> tuple[int, ...] | None:
    shape = c.get("input_shape")
    if isinstance(shape, str):
        try:
            shape = tuple(int(d) for d in shape.lower().split("x") if len(d.strip()) <= 12)
        except ValueError:
            shape = ()
        if len(shape) != len(c["input_shape"].split("x")):
            raise AppError(f"CNN {c['name']!r}: cannot read input_shape {c['input_shape']!r}: write e.g. 1x3x224x224")
    if shape is not None and (len(shape) != 4 or any(d < 1 for d in shape)):
        raise AppError(f"CNN {c['name']!r}: input_shape {c['input_shape']!r} must be four positive dims, e.g. 1x3x224x224")
    return None if shape is None else tuple(shape)


def _range(text: Any, n_layers: int, where: str) -> tuple[int, ...]:
    """Layer ids of a range text ("all", "3", "0-14", "0-3,8-9"), each within the CNN, ascending."""
    if text == "all":
        return tuple(range(n_layers))
    if _is_int(text):
        spans = [(text, text)]
    elif isinstance(text, str):
        spans = []
        for part in text.split(","):
            a, _, b = part.strip().partition("-")
            if not (a.isdigit() and (b.isdigit() or not b) and len(a) <= 12 and len(b) <= 12):
                raise AppError(f"{where}: cannot read layer range {text!r} (write e.g. 0-14 or all)")
            spans.append((int(a), int(b or a)))
    else:
        raise AppError(f"{where}: cannot read layer range {text!r} (write e.g. 0-14 or all)")
    ids: list[int] = []
    for lo, hi in spans:
        bad = next((i for i in (lo, hi) if not 0 <= i < n_layers), None)
        if bad is not None:
            raise AppError(f"{where}: layer {bad} does not exist (0-{n_layers - 1})")
        if hi < lo or (ids and lo <= ids[-1]):
            raise AppError(f"{where}: layer range {text!r} must list layers in ascending order")
        ids.extend(range(lo, hi + 1))
    return tuple(ids)


def parse_app(data: dict[str, Any], layer_counts: Sequence[int]) -> App:
    """Validate partitions against the loaded CNNs: ranges exist, no layer in two partitions,
    every layer in one, a CNN's partitions in its layer order, pipeline sets name existing
    partitions, each once."""
    cnns = tuple(CNNSpec(c["name"], c["model"], None) for c in data["cnns"])
    names = [c.name for c in cnns]
    parts_data = data.get("partitions") or [{"cnn": n, "layers": "all"} for n in names]
    partitions = []
    for i, p in enumerate(parts_data):
        if not isinstance(p, dict) or not isinstance(p.get("cnn"), str) or p["cnn"] not in names:
            raise AppError(f"partition {i}: names CNN {p.get('cnn') if isinstance(p, dict) else p!r}, not one of {names}")
        m = names.index(p["cnn"])
        partitions.append(PartitionSpec(m, _range(p.get("layers", "all"), layer_counts[m], f"partition {i}")))
    for m, name in enumerate(names):
        seen: dict[int, int] = {}
        last: tuple[int, int] | None = None  # (partition, its highest layer)
        for i, p in enumerate(partitions):
            if p.cnn != m:
                continue
            for l in p.layers:
                if l in seen:
                    raise AppError(f"partitions {seen[l]} and {i} overlap: both hold layer {l} of {name}")
                seen[l] = i
            if last is not None and p.layers and min(p.layers) < last[1]:
                raise AppError(f"partitions {last[0]} and {i} of {name} are out of order: partition {i} holds layer "
                               f"{min(p.layers)}, before partition {last[0]}'s layer {last[1]}; list a CNN's partitions in layer order")
            last = (i, max(p.layers)) if p.layers else last
        missing = sorted(set(range(layer_counts[m])) - set(seen))
        if missing:
            raise AppError(f"layer {missing[0]} of {name} is in no partition")
    pipelines = []
    named: set[int] = set()
    for s in data.get("pipelines") or []:
        if not isinstance(s, list) or not all(_is_int(i) and 0 <= i < len(partitions) for i in s):
            raise AppError(f"pipeline set {s!r} must list partition indices 0-{len(partitions) - 1}")
        if named & set(s) or len(set(s)) != len(s):
            raise AppError(f"pipeline set {s!r} names a partition that another set (or itself) names already")
        named.update(s)
        pipelines.append(tuple(s))
    return App(cnns, tuple(partitions), tuple(pipelines))


def load_app(path: str, allow_code: bool = False):
    """(App, graphs) with every CNN loaded; unknown models give one clear error. A CNN named by
    module:factory is refused unless `allow_code` (files carry data, not code)."""
    data = read_app(path)
    graphs = []
    for c in data["cnns"]:
        shape = _input_shape(c)
        try:
            named_in_file(c["model"], f"application file {path}", allow_code)
            graphs.append(load(c["model"], shape))
        except TightfitError as e:
            raise AppError(f"CNN {c['name']!r}: {e}") from None
    return parse_app(data, [len(g.layers) for g in graphs]), graphs
