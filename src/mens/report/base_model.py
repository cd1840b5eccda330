"""The base model of a run as the Hugging Face Hub knows it: its Hub id and its licence, never a local path.

The id: the embedded default's upstream id; a Hub id the run was started with; for a local directory, the id in the
Hub cache layout (`models--org--name/snapshots/...`) or in its config.json (`_name_or_path`), else none (the card
then omits `base_model` and says why). The licence comes from the base itself: its model card's metadata (a local
README.md, the Hub cache, or the Hub when the caller allows the network) or the embedded GGUF's `general.license`;
unknown is `other` with a note, never a guess.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from mens.report.runfiles import as_manifest
from mens.run_records import TrainingManifest

_CACHE_DIR = re.compile(r"^models--([A-Za-z0-9][\w.-]*)--([\w.-]+)$")


@dataclass
class BaseModelInfo:
    hub_id: str | None
    license: str
    license_name: str | None = None
    license_link: str | None = None
    license_source: str = ""
    notes: list[str] = field(default_factory=list)


def is_hub_id(value: str | None) -> bool:
    """`org/name` as the Hub validates repo ids, and not a path that exists here."""
    if not value or value.count("/") != 1 or value.startswith((".", "/", "~")) or Path(value).exists():
        return False
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def _local_dir_id(path: Path) -> str | None:
    for part in reversed(path.parts):
        m = _CACHE_DIR.match(part)
        if m:
            return f"{m.group(1)}/{m.group(2)}"
    cfg = path / "config.json"
    if cfg.is_file():
        try:
            name = json.loads(cfg.read_text(encoding="utf-8")).get("_name_or_path")
        except (json.JSONDecodeError, OSError):
            name = None
        if isinstance(name, str) and is_hub_id(name):
            return name
    return None


def _card_license(readme: Path) -> tuple[str, str | None, str | None] | None:
    """(license, license_name, license_link) from a model card's YAML metadata, or None."""
    from huggingface_hub import metadata_load

    try:
        meta = metadata_load(readme) or {}
    except (ValueError, OSError, UnicodeDecodeError):
        return None
    lic = meta.get("license")
    if isinstance(lic, list):
        lic = lic[0] if lic else None
    if not isinstance(lic, str) or not lic:
        return None
    return lic, meta.get("license_name"), meta.get("license_link")


def _hub_card(hub_id: str, allow_network: bool) -> Path | None:
    """The base's README.md from the local Hub cache, or downloaded when the network is allowed."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(hub_id, "README.md")
    if isinstance(cached, str):
        return Path(cached)
    if not allow_network:
        return None
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(hub_id, "README.md"))
    except Exception:  # offline, gated, no card: the licence stays unknown and the card says so
        return None


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
"""GGUF value type -> byte size (8 is a string, 9 an array)."""


def gguf_string_field(path: Path, wanted: str) -> str | None:
    """A string field of a GGUF file's metadata, reading only up to it.

    Written by hand because gguf's GGUFReader parses every field first, the tokenizer's ~100k strings included
    (6 s for the embedded model), while `general.*` fields come first in the file (a few milliseconds here).
    """
    import struct

    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            return None
        version, _n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
        if version < 2:
            return None

        def string() -> str:
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", errors="replace")

        def skip(kind: int) -> None:
            if kind == 8:
                (n,) = struct.unpack("<Q", f.read(8))
                f.seek(n, 1)
            elif kind == 9:
                item, count = struct.unpack("<IQ", f.read(12))
                if item in _SCALAR_SIZES:
                    f.seek(_SCALAR_SIZES[item] * count, 1)
                else:
                    for _ in range(count):
                        skip(item)
            else:
                f.seek(_SCALAR_SIZES[kind], 1)

        for _ in range(n_kv):
            key = string()
            (kind,) = struct.unpack("<I", f.read(4))
            if key == wanted:
                return string() if kind == 8 else None
            skip(kind)
    return None


def _embedded_license(name: str) -> str | None:
    """`general.license` of the embedded model's GGUF (its upstream licence, recorded by the converter)."""
    from mens.errors import ModelError
    from mens.model.embedded import gguf_path

    try:
        value = gguf_string_field(gguf_path(name), "general.license")
    except (ModelError, OSError, KeyError, ValueError):  # the package is missing or the file is not GGUF
        return None
    return value or None


def base_model_info(manifest: TrainingManifest | dict, *, allow_network: bool = False) -> BaseModelInfo:
    """Hub id and licence of the run's base model (see the module docstring for where each comes from).
    `manifest`: the run's TrainingManifest, or a dict with its fields."""
    from mens.model.embedded import EMBEDDED

    manifest = as_manifest(manifest)
    cfg = manifest.config
    named = str(manifest.base_model_id or manifest.base_model or cfg.get("model") or "")
    local = manifest.base_model_path
    embedded = next((k for k in (cfg.get("model"), named) if k in EMBEDDED), None) or next(
        (k for k, v in EMBEDDED.items() if v[2] == named), None)
    notes: list[str] = []
    if embedded:
        hub_id = EMBEDDED[embedded][2]
    elif is_hub_id(named):
        hub_id = named
    else:
        hub_id = _local_dir_id(Path(local or named)) if (local or named) else None
        if hub_id is None:
            notes.append("The base model was a local directory with no Hub id in its config or path, so "
                         "`base_model` is left out of the metadata; add it by hand if the base is on the Hub.")
    found = None
    dirs = [Path(d) for d in dict.fromkeys((local, named)) if d and Path(d).is_dir()]
    for readme in (d / "README.md" for d in dirs):
        lic = _card_license(readme) if readme.is_file() else None
        if lic:
            found = (*lic, "the base model's README.md")
            break
    if found is None and hub_id:
        card = _hub_card(hub_id, allow_network)
        lic = _card_license(card) if card is not None else None
        found = (*lic, f"the model card of {hub_id}") if lic else None
    if found is None and embedded:
        lic = _embedded_license(embedded)
        found = (lic, None, None, f"the GGUF metadata of the embedded {hub_id}") if lic else None
    if found is None:
        notes.append("The base model's licence could not be read (no model card metadata found), so `license` is "
                      "`other`: check the base model's terms and set it before sharing.")
        return BaseModelInfo(hub_id, "other", notes=notes)
    lic, name, link, source = found
    return BaseModelInfo(hub_id, lic, name, link, source, notes)
