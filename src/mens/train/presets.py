"""Training presets (YAML package data `mens/configs/train_presets.yaml`) and their aliases. No torch."""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml

from mens.errors import ConfigError


@cache
def _table() -> dict:
    text = resources.files("mens.configs").joinpath("train_presets.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    aliases = {str(k): v for k, v in (data.get("aliases") or {}).items()}
    return {"presets": data.get("presets") or {}, "aliases": aliases}


def preset_names() -> list[str]:
    """Every preset name and alias."""
    t = _table()
    return sorted([*t["presets"], *t["aliases"]])


def canonical_name(name: str) -> str:
    t = _table()
    key = str(name)
    key = t["aliases"].get(key, key)
    if key not in t["presets"]:
        raise ConfigError(f"--preset {name!r} is unknown; known presets: {', '.join(preset_names())}")
    return key


def load_preset(name: str) -> dict:
    """The preset's settings (a copy), following aliases."""
    return dict(_table()["presets"][canonical_name(name)])


def recommend_preset(device_kind: str, memory_gb: float | None) -> str:
    """The preset for a device: `cpu` without a GPU, else the largest tier that fits its memory."""
    if device_kind != "cuda" or not memory_gb:
        return "cpu" if device_kind == "cpu" else "4080_safe"
    if memory_gb < 12:
        return "4080_safe"
    if memory_gb <= 17:
        return "qwen_4080_16g"
    if memory_gb <= 26:
        return "gpu_24g"
    if memory_gb <= 50:
        return "gpu_48g"
    return "gpu_80g"
