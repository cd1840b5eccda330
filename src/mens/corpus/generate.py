"""`mens corpus generate`: synthetic programs with task descriptions, from per-language templates.

Templates (`data/generate/<language>.yaml`) are filled with varied names, fields and numbers drawn from a
seeded RNG; every program is parsed, and one that does not parse is never written (it is counted).
Run: `mens corpus generate --limit 500 --seed 0 -o synthetic.jsonl`.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from string import Template

import yaml

from mens.corpus.frontend import base_kinds, resolve_language
from mens.corpus.jsonl import write_jsonl
from mens.corpus.records import codegen_row
from mens.errors import ConfigError, UsageError

GENERATE_DIR = Path(__file__).parent / "data" / "generate"
MAX_TRIES = 20


@dataclass
class GenerateReport:
    written: int = 0
    rejected_unparsable: int = 0
    duplicates: int = 0
    kinds: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        return (f"wrote {self.written} programs ({len(self.kinds)} construct kinds); never written: "
                f"{self.rejected_unparsable} that did not parse, {self.duplicates} duplicates")


@lru_cache(maxsize=8)
def load_templates(language: str, suffix: str = "") -> dict:
    """`data/generate/<language><suffix>.yaml`: program templates, or task templates with suffix `_tasks`."""
    path = GENERATE_DIR / f"{language}{suffix}.yaml"
    if not path.is_file():
        raise ConfigError(f"no generation templates for language {language!r}: expected {path}")
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _values(data: dict, rng: random.Random) -> dict:
    e_pascal, e = rng.choice(data["entities"])
    nf, nf2 = rng.sample(data["int_fields"], 2)
    return {"E": e_pascal, "e": e, "es": e + "s", "n": str(rng.randint(2, 9)), "s": rng.choice(data["words"]),
            "nf": nf, "nf2": nf2, "sf": rng.choice(data["str_fields"]), "bf": rng.choice(data["bool_fields"]),
            "fn": rng.choice(["bump", "adjust", "next", "scaled"])}


def _lc(text: str) -> str:
    return text[:1].lower() + text[1:]


def generate_programs(limit: int, seed: int = 0, language: str | None = None) -> tuple[list[dict], GenerateReport]:
    """`limit` parse-checked train pairs, cycling through every template; deterministic for a seed."""
    if limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}")
    lang = resolve_language(language)
    data = load_templates(lang.name)
    rng = random.Random(seed)
    report, rows, seen = GenerateReport(), [], set()
    templates = data["templates"]
    for i in range(limit):
        tpl = templates[i % len(templates)]
        for _ in range(MAX_TRIES):
            v = _values(data, rng)
            code = Template(tpl["code"]).substitute(v)
            if code in seen:
                report.duplicates += 1
                continue
            res = lang.parse(code)
            if not res.has_code:
                report.rejected_unparsable += 1
                continue
            seen.add(code)
            desc = Template(tpl["desc"]).substitute(v)
            prompt = Template(rng.choice(data["prompts"])).substitute(desc=desc, desc_lc=_lc(desc))
            kinds = base_kinds(lang, res.decls)
            report.kinds.update(kinds)
            rows.append(codegen_row(lang.name, prompt, code, category=f"{lang.name}_synthetic_{tpl['kind']}",
                                    rating=3, source=f"generate:seed={seed}:{i}", origin="synthetic",
                                    constructs=kinds))
            break
    report.written = len(rows)
    return rows, report


def generate_to_file(out: Path, limit: int, seed: int = 0, language: str | None = None) -> GenerateReport:
    rows, report = generate_programs(limit, seed, language)
    write_jsonl(out, rows)
    return report
