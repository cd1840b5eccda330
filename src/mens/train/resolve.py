"""One resolved `TrainConfig` from its layers: defaults < preset < config file < key=value overrides < flags.

The CLI (`mens train [CONFIG.yaml] [key.sub=value ...] [--flags]`) and dogfood (its `train:` block) both call
`resolve_config`; every layer is checked on its own first, so an error names the file, override or flag it came
from. Imports no torch (the device's recommended preset probes the device lazily).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import TypeAdapter, ValidationError

from mens.errors import ConfigError, UsageError
from mens.train.config import FLAT, SECTIONS, SPECS, TrainConfig, normalize, set_path, unknown_key
from mens.train.presets import choose_preset, preset_config, read_yaml_mapping

PATH_KEYS = ("output_dir", "data.path", "adapter.init_adapter", "model.name")
"""Keys holding local paths (model.name when it names an existing directory): made absolute when resolved, so a
saved config.yaml works from any directory."""


def split_args(args: Iterable[str]) -> tuple[Path | None, list[str]]:
    """`[CONFIG.yaml] [key=value ...]` -> (the config file or None, the overrides)."""
    args = list(args or [])
    file = None
    if args and "=" not in args[0]:
        file = Path(args.pop(0))
    if stray := [a for a in args if "=" not in a]:
        raise UsageError(f"{stray[0]!r}: expected key.sub=value after the config file (e.g. schedule.max_steps=100);"
                         " only one config file is read, first")
    return file, args


def parse_overrides(items: Iterable[str], where: str = "override") -> dict:
    """`key.sub=value` strings -> a nested dict; values are read as YAML scalars (`1e-4`, `true`, `null`;
    an empty value is the empty string). Unknown keys and bad values are ConfigErrors naming the override."""
    out: dict = {}
    for item in items:
        key, _, raw = item.partition("=")
        key = key.strip()
        value = _yaml_scalar(raw, f"{where} {item!r}")
        check_value(key, value, f"{where} {item!r}")
        set_path(out, key, value)
    return out


def _yaml_scalar(raw: str, where: str) -> Any:
    if raw.strip() == "":
        return ""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if isinstance(value, str) and _is_float(value):  # YAML 1.1 reads `1e-4` (no dot) as text
        return float(value)
    return value


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_value(path: str, value: Any, where: str) -> None:
    """ConfigError unless `path` is a setting (a dotted path or a run-level key) and `value` fits its type."""
    spec = SPECS.get(path)
    if spec is None:
        raise ConfigError(f"{where}: {unknown_key(path)}")
    value = normalize(path, value)
    try:
        _adapter(path).validate_python(value)
    except ValidationError as e:
        errors = e.errors()
        first = errors[0]
        expected = first["msg"].removeprefix("Input should be ")
        if first["type"] == "literal_error":
            expected = "one of " + ", ".join(str(a) for a in spec.field.annotation.__args__)
        if len(errors) > 1:  # a union (a number or a word): every alternative
            expected = " or ".join(err["msg"].removeprefix("Input should be ").split(",")[0] for err in errors)
        raise ConfigError(f"{where}: {path} = {value!r} (expected {expected}; flag {spec.flags[0]})") from None


@cache
def _adapter(path: str) -> TypeAdapter:
    """The type of one setting with its constraints (ge, gt, lt), for checking a value on its own."""
    field = SPECS[path].field
    kind = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    return TypeAdapter(kind, config={"coerce_numbers_to_str": True})


def check_layer(layer: dict, where: str) -> dict:
    """Check every key and value of a nested (or dotted-key) layer; returns it nested."""
    out: dict = {}
    for key, value in layer.items():
        key = str(key)
        if key in SECTIONS and isinstance(value, dict):
            for leaf, v in value.items():
                check_value(f"{key}.{leaf}", v, where)
                set_path(out, f"{key}.{leaf}", v)
        elif key in SECTIONS:
            raise ConfigError(f"{where}: {key} must be a mapping of {key} settings (e.g. {key}:\\n  "
                              f"{next(iter(SECTIONS[key].model_fields))}: ...), got {value!r}")
        else:
            if key == "extra" and not isinstance(value, dict):
                raise ConfigError(f"{where}: extra must be a mapping, got {value!r}")
            check_value(key, value, where)
            set_path(out, key, value)
    return out


def load_config_file(path: Path) -> dict:
    """A user's config file (the shape of RUN/config.yaml; any subset of keys), checked, nested."""
    if not path.is_file():
        raise UsageError(f"{path}: no such config file; pass a YAML file of the training config's shape "
                         "(a run's config.yaml is one), or key.sub=value overrides")
    return check_layer(read_yaml_mapping(path, str(path)), str(path))


def flags_layer(flags: dict) -> dict:
    """Flat {name: value} from command-line flags (None = not given) -> nested, checked."""
    out: dict = {}
    for name, value in flags.items():
        if value is None:
            continue
        path = FLAT.get(name)
        if path is None:
            raise ConfigError(f"unknown setting {name!r}; valid names: {', '.join(FLAT)}")
        check_value(path, value, SPECS[path].flags[0])
        set_path(out, path, value)
    return out


def merge(base: dict, top: dict) -> dict:
    """`top` over `base`, section by section (dicts merge, anything else replaces)."""
    out = dict(base)
    for key, value in top.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def resolve_config(*, file: Path | None = None, overrides: Iterable[str] | dict = (),
                   flags: dict | None = None) -> TrainConfig:
    """defaults < preset < file < overrides < flags. The preset is the one named by the highest layer that names
    one, else $VOX_TRAIN_PROFILE, else the device's recommendation. Local paths are made absolute.

    `overrides` are `key.sub=value` strings or a mapping (nested or dotted keys, e.g. dogfood's `train:` block).
    """
    upper: dict = {}
    if file is not None:
        upper = merge(upper, load_config_file(file))
    if isinstance(overrides, dict):
        upper = merge(upper, check_layer(overrides, "train overrides"))
    else:
        upper = merge(upper, parse_overrides(overrides))
    upper = merge(upper, flags_layer(flags or {}))
    name = choose_preset(upper.get("preset"), normalize("device", upper.get("device", "auto")))
    preset = check_layer(preset_config(name), f"preset {name}")
    values = merge(merge(preset, upper), {"preset": name})
    for path in PATH_KEYS:
        section, _, leaf = path.rpartition(".")
        holder = values.get(section, {}) if section else values
        local = holder.get(leaf) and (path != "model.name" or Path(holder[leaf]).expanduser().exists())
        if local:  # a model that is not a local directory is a hub id or an embedded name: kept as given
            holder[leaf] = str(Path(holder[leaf]).expanduser().resolve())
    return TrainConfig(**values)


def require_paths(cfg: TrainConfig) -> None:
    """UsageError unless the config names its data and its run directory (a file or the flags may give them)."""
    missing = [f"{flag} (or {key}=...)" for flag, key, value in (("--data-dir", "data.path", cfg.data.path),
                                                                 ("--output-dir", "output_dir", cfg.output_dir))
               if not value]
    if missing:
        raise UsageError(f"missing {' and '.join(missing)}: say where the training data is and where the run goes")

