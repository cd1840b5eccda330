"""Natural-language prompts for units, several phrasings each, chosen deterministically by seed.

Phrasings are data (`data/phrasing/<language>.yaml`); this module fills them in. Run: used by `pairs`.
"""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path

import yaml

from mens.errors import ConfigError

PHRASING_DIR = Path(__file__).parent / "data" / "phrasing"


@lru_cache(maxsize=8)
def load_phrasing(language: str) -> dict:
    """The phrasing table for `language`; ConfigError naming the expected file when there is none."""
    path = PHRASING_DIR / f"{language}.yaml"
    if not path.is_file():
        raise ConfigError(f"no prompt phrasings for language {language!r}: expected {path}; "
                          f"copy {PHRASING_DIR / 'vox.yaml'} and adapt its nouns and templates")
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def noun_for(table: dict, kind: str, base: str) -> str:
    nouns = table["kind_nouns"]
    return nouns.get(kind) or nouns.get(base) or base.replace("_", " ")


def article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def decl_list(table: dict, decls: list, base_kind, limit: int = 5) -> str:
    """`a function `f`, a table `T` and 3 more declarations` for a prompt."""
    parts = []
    for kind, name in decls[:limit]:
        noun = noun_for(table, kind, base_kind(kind))
        parts.append(f"{article(noun)} {noun} `{name}`" if name else f"{article(noun)} {noun}")
    if len(decls) > limit:
        parts.append(f"{len(decls) - limit} more declarations")
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def choose(templates: list[str], n: int, key: str, seed: int) -> list[str]:
    """`n` distinct templates (fewer if there are fewer), the same for the same key and seed."""
    rng = random.Random(f"{seed}:{key}")
    return rng.sample(templates, min(n, len(templates)))


def render(template: str, **values: str) -> str:
    """Fill a template and tidy spacing/punctuation left by empty values."""
    text = " ".join(template.format(**values).split())
    while text.endswith((". .", "..")) and not text.endswith("..."):
        text = text[:-2].rstrip() + "."
    return text


def sentence(text: str) -> str:
    text = " ".join(text.split())
    return text if text.endswith((".", "?", "!", ":")) else text + "."
