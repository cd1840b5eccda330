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
    cards = {float(k): str(v) for k, v in (data.get("cards") or {}).items()}
    return {"presets": data.get("presets") or {}, "aliases": aliases, "cards": dict(sorted(cards.items()))}


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


def card_presets() -> dict[float, str]:
    """GPU memory tier (nominal GB: 8, 12, 16, ...) -> the preset for a card of that size, smallest first."""
    return dict(_table()["cards"])


def recommend_preset(device_kind: str, memory_gb: float | None) -> str:
    """The preset for a device: `cpu` without a GPU, else the largest card tier its memory reaches.

    A card reports a little less than its nominal size (a 16 GB card: ~15.6 GiB; an 80 GB one: ~79.2), so a tier
    counts as reached within 1 GB. Smaller than the smallest tier: the smallest tier's preset.
    """
    if device_kind != "cuda" or not memory_gb:
        return "cpu" if device_kind == "cpu" else card_presets()[min(card_presets())]
    tiers = card_presets()
    reached = [gb for gb in tiers if gb <= memory_gb + 1.0]
    return tiers[max(reached)] if reached else tiers[min(tiers)]
