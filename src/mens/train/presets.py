"""Training presets: YAML files of the training config's shape, shipped (package data `mens/configs/train/`) or
a user's path, with the original's names as aliases. Which preset a run uses: `choose_preset`. No torch."""

from __future__ import annotations

import os
from functools import cache
from importlib import resources
from pathlib import Path

import yaml

from mens.errors import ConfigError

ENV_PROFILE = "VOX_TRAIN_PROFILE"
"""The original's fallback preset name, read when no preset is named (mens reads it before the device's
recommendation; the original skipped it when it could size a CUDA card)."""
AUTO = "auto"


@cache
def _table() -> dict:
    root = resources.files("mens.configs")
    index = yaml.safe_load(root.joinpath("train_presets.yaml").read_text(encoding="utf-8"))
    shipped = sorted(p.name.removesuffix(".yaml") for p in root.joinpath("train").iterdir()
                     if p.name.endswith(".yaml"))
    aliases = {str(k): str(v) for k, v in (index.get("aliases") or {}).items()}
    cards = {float(k): str(v) for k, v in (index.get("cards") or {}).items()}
    return {"presets": shipped, "aliases": aliases, "cards": dict(sorted(cards.items()))}


def preset_names() -> list[str]:
    """Every shipped preset name and alias (and `auto`, the device's recommendation, is accepted too)."""
    t = _table()
    return sorted([*t["presets"], *t["aliases"]])


def is_path(name: str) -> bool:
    """A preset given as a file: it ends in .yaml/.yml or names an existing file."""
    return str(name).endswith((".yaml", ".yml")) or Path(name).is_file()


def canonical_name(name: str) -> str:
    """The shipped preset a name or alias stands for, or the path of a user's preset file."""
    key = str(name)
    if is_path(key):  # absolute, so a run's saved config.yaml names it from any directory
        return str(Path(key).expanduser().resolve())
    t = _table()
    key = t["aliases"].get(key, key)
    if key not in t["presets"]:
        raise ConfigError(f"--preset {name!r} is unknown; known presets: {', '.join(preset_names())}, auto, "
                          "or a path to a YAML file of the training config's shape")
    return key


def preset_config(name: str) -> dict:
    """The preset's settings in the config's nested shape (a fresh copy), following aliases; a path is read."""
    key = canonical_name(name)
    if is_path(key):
        path = Path(key)
        if not path.is_file():
            raise ConfigError(f"--preset {key}: no such file; pass a shipped preset name or a YAML file's path")
        return read_yaml_mapping(path, f"preset {key}")
    text = resources.files("mens.configs").joinpath("train", f"{key}.yaml").read_text(encoding="utf-8")
    return read_yaml_mapping(None, f"preset {key}", text)


def load_preset(name: str) -> dict:
    """The preset's settings as flat {key: value} (the manifest's names: `seq_len`, `r`, `backend`...)."""
    from mens.train.config import SPECS, get_path

    nested = preset_config(name)
    out = {}
    for spec in SPECS.values():
        try:
            out[spec.flat] = get_path(nested, spec.path)
        except (KeyError, TypeError):
            continue
    return out


def read_yaml_mapping(path: Path | None, where: str, text: str | None = None) -> dict:
    """A YAML file that must hold a mapping (an empty file is an empty one); ConfigError names the file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8") if text is None else text)
    except OSError as e:
        raise ConfigError(f"{where}: cannot read ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{where}{line}: not valid YAML ({getattr(e, 'problem', None) or e}); fix the file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of settings (model:, schedule:, ...), got a "
                          f"{type(data).__name__}")
    return data


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


def choose_preset(requested: str | None, device: str = "auto") -> str:
    """The preset a run uses: the one named (flag, override or file), else $VOX_TRAIN_PROFILE, else the device's
    recommendation (`auto` names that too). Returns a canonical name or a path."""
    name = requested
    if name is None and os.environ.get(ENV_PROFILE):
        name = os.environ[ENV_PROFILE]
        try:
            return canonical_name(name) if name != AUTO else _recommended(device)
        except ConfigError:
            raise ConfigError(f"{ENV_PROFILE}={name!r} is not a preset; known presets: {', '.join(preset_names())}"
                              ", auto; unset it or name one") from None
    if name is None or name == AUTO:
        return _recommended(device)
    return canonical_name(name)


def _recommended(device: str) -> str:
    from mens.train.probe import probe_device

    dev = probe_device(device)
    return recommend_preset(dev["kind"], dev.get("memory_gb"))
