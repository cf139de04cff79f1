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


def read_app(path: str) -> dict[str, Any]:
    import json

    import yaml

    p = Path(path)
    try:
        text = p.read_text()
        data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise AppError(f"cannot read application file {path}: {e}".splitlines()[0]) from None
    if not isinstance(data, dict) or not isinstance(data.get("cnns"), list) or not data["cnns"]:
        raise AppError(f"application file {path} needs a non-empty 'cnns' list")
    base = p.parent
    for c in data["cnns"]:
        if isinstance(c, dict) and isinstance(c.get("model"), str) and c["model"].endswith(".onnx") and not Path(c["model"]).is_absolute():
            c["model"] = str(base / c["model"])
    return data


def _range(text: Any, n_layers: int, where: str) -> tuple[int, ...]:
    if text == "all":
        return tuple(range(n_layers))
    if isinstance(text, int):
        ids = [text]
    else:
        ids = []
        for part in str(text).split(","):
            a, _, b = part.strip().partition("-")
            try:
                lo, hi = int(a), int(b or a)
            except ValueError:
                raise AppError(f"{where}: cannot read layer range {text!r} (write e.g. 0-14 or all)") from None
            ids.extend(range(lo, hi + 1))
    bad = [i for i in ids if not 0 <= i < n_layers]
    if bad:
        raise AppError(f"{where}: layer {bad[0]} does not exist (0-{n_layers - 1})")
    return tuple(ids)


def parse_app(data: dict[str, Any], layer_counts: Sequence[int]) -> App:
    """Validate partitions against the loaded CNNs: ranges exist, no layer in two partitions,
    every layer in one, pipeline sets name existing partitions."""
    cnns = tuple(CNNSpec(c["name"], c["model"], None) for c in data["cnns"])
    names = [c.name for c in cnns]
    parts_data = data.get("partitions") or [{"cnn": n, "layers": "all"} for n in names]
    partitions = []
    for i, p in enumerate(parts_data):
        if not isinstance(p, dict) or p.get("cnn") not in names:
            raise AppError(f"partition {i}: names CNN {p.get('cnn') if isinstance(p, dict) else p!r}, not one of {names}")
        m = names.index(p["cnn"])
        partitions.append(PartitionSpec(m, _range(p.get("layers", "all"), layer_counts[m], f"partition {i}")))
    for m, name in enumerate(names):
        seen: dict[int, int] = {}
        for i, p in enumerate(partitions):
            if p.cnn != m:
                continue
            for l in p.layers:
                if l in seen:
                    raise AppError(f"partitions {seen[l]} and {i} overlap: both hold layer {l} of {name}")
                seen[l] = i
        missing = sorted(set(range(layer_counts[m])) - set(seen))
        if missing:
            raise AppError(f"layer {missing[0]} of {name} is in no partition")
    pipelines = []
    for s in data.get("pipelines") or []:
        if not isinstance(s, list) or not all(isinstance(i, int) and 0 <= i < len(partitions) for i in s):
            raise AppError(f"pipeline set {s!r} must list partition indices 0-{len(partitions) - 1}")
        pipelines.append(tuple(s))
    return App(cnns, tuple(partitions), tuple(pipelines))


def load_app(path: str, allow_code: bool = False):
    """(App, graphs) with every CNN loaded; unknown models give one clear error. A CNN named by
    module:factory is refused unless `allow_code` (files carry data, not code)."""
    data = read_app(path)
    graphs = []
    for c in data["cnns"]:
        if not isinstance(c, dict) or "name" not in c or "model" not in c:
            raise AppError("each CNN needs a name and a model")
        shape = c.get("input_shape")
        if isinstance(shape, str):
            shape = tuple(int(d) for d in shape.split("x"))
        try:
            named_in_file(c["model"], f"application file {path}", allow_code)
            graphs.append(load(c["model"], shape))
        except TightfitError as e:
            raise AppError(f"CNN {c['name']!r}: {e}") from None
    return parse_app(data, [len(g.layers) for g in graphs]), graphs
