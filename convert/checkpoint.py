"""A Hugging Face checkpoint directory: config.json and its safetensors files.

Tensor order follows llama.cpp's converter: shard files in sorted order (from
model.safetensors.index.json when present), tensors sorted by name within
each file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConversionError
from .safetensors_reader import TensorRef, read_header

INDEX_NAME = "model.safetensors.index.json"


@dataclass
class Checkpoint:
    src_dir: Path
    config: dict[str, Any]
    files: list[Path]
    tensors: dict[str, TensorRef] = field(default_factory=dict)


def _read_json(path: Path, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConversionError(f"{path}: invalid JSON in {what}: {e}") from None
    except OSError as e:
        raise ConversionError(f"cannot read {path}: {e.strerror or e}") from None


def load_config(src_dir: Path) -> dict[str, Any]:
    if not src_dir.exists():
        raise ConversionError(f"model directory not found: {src_dir}")
    if not src_dir.is_dir():
        raise ConversionError(f"not a directory: {src_dir}")
    path = src_dir / "config.json"
    if not path.is_file():
        raise ConversionError(f"no config.json in {src_dir}")
    cfg = _read_json(path, "config.json")
    if not isinstance(cfg, dict):
        raise ConversionError(f"{path}: expected a JSON object")
    return cfg


def _part_names(src_dir: Path) -> tuple[list[str], dict[str, str]]:
    index_path = src_dir / INDEX_NAME
    if index_path.is_file():
        index = _read_json(index_path, INDEX_NAME)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ConversionError(f"{index_path}: no valid 'weight_map'")
        parts = sorted(set(weight_map.values()))
        for p in parts:
            if not (src_dir / p).is_file():
                raise ConversionError(f"missing shard {p} (listed in {INDEX_NAME}) in {src_dir}")
        return parts, weight_map
    parts = sorted(p.name for p in src_dir.iterdir()
                   if p.name.startswith("model") and p.name.endswith(".safetensors") and p.is_file())
    if not parts:
        if any(src_dir.glob("*.bin")) or any(src_dir.glob("*.pt")):
            raise ConversionError(f"no model*.safetensors in {src_dir} (PyTorch .bin checkpoints are not supported)")
        raise ConversionError(f"no model*.safetensors in {src_dir}")
    return parts, {}


def open_checkpoint(src_dir: str | Path) -> Checkpoint:
    """Read config.json and every shard header; validates the shard set."""
    src = Path(src_dir)
    config = load_config(src)
    parts, weight_map = _part_names(src)
    tensors: dict[str, TensorRef] = {}
    for p in parts:
        for name, ref in read_header(src / p).items():
            if name in tensors:
                raise ConversionError(f"tensor {name!r} is stored twice: in {tensors[name].file.name} and {p}")
            if weight_map and weight_map.get(name, p) != p:
                raise ConversionError(f"tensor {name!r} is in {p} but {INDEX_NAME} says {weight_map[name]}")
            tensors[name] = ref
    if weight_map:
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            files = sorted({weight_map[n] for n in missing})
            raise ConversionError(f"{len(missing)} tensor(s) listed in {INDEX_NAME} are missing from "
                                  f"{', '.join(files)}: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    return Checkpoint(src, config, [src / p for p in parts], tensors)
