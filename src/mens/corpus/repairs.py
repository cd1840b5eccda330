"""Repair pairs: a checked answer broken by one edit, the parser's complaint, and the answer as the fix.

A small model writing a language it has seen little of reaches for the syntax of the languages it knows (`def`,
a `:` block, `|x|` closures, `elif`) or leaves a block unclosed. A repair pair shows it such code next to the
parser's first error and asks for the fix; the answer is the original, checked answer. The model learns where
the language's syntax differs from what it would otherwise write, and users get an assistant that fixes code
it is shown ("this does not parse: fix it").

The edits and the wordings of the request are data (`data/repairs/<language>.yaml`): each edit is a regular
expression whose one match, drawn at random, is replaced. An edit is kept only when the parser rejects the
result, so no pair ever asks to "fix" code that is valid. Deterministic for a seed. No torch.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from mens.corpus.normalize import code_in_response
from mens.corpus.phrasing import load_phrasing
from mens.corpus.records import BadLine, codegen_row, read_pairs
from mens.errors import ConfigError, DataError
from mens.lang import Language, get_language

REPAIRS_DIR = Path(__file__).parent / "data" / "repairs"


@dataclass(frozen=True)
class Edit:
    name: str
    find: re.Pattern
    replace: str


@dataclass
class RepairReport:
    written: int = 0
    by_edit: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    """Answers no edit could break (every edit missed, or left code the parser accepts)."""
    not_code: int = 0
    """Rows whose answer is no code that parses: nothing to repair towards."""

    def summary(self) -> str:
        """One line for a command's output: how many rows, from which edits, and what was left out."""
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.by_edit.items(), key=lambda kv: (-kv[1], kv[0])))
        return (f"{self.written} repair pairs ({kinds or 'none'}); left out {self.not_code} answers without code "
                f"that parses and {self.skipped} no edit could break")


@lru_cache(maxsize=8)
def load_repairs(language: str) -> tuple[list[Edit], list[str]]:
    """The edits and request wordings of `language`; ConfigError naming the expected file, or the bad entry."""
    path = REPAIRS_DIR / f"{language}.yaml"
    if not path.is_file():
        raise ConfigError(f"no repair edits for language {language!r}: expected {path}; "
                          f"copy {REPAIRS_DIR / 'vox.yaml'} and adapt its edits")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    edits = []
    for i, e in enumerate(data.get("edits") or []):
        try:
            edits.append(Edit(str(e["name"]), re.compile(e["find"], re.MULTILINE), str(e["replace"])))
        except (KeyError, TypeError, re.error) as err:
            raise ConfigError(f"{path}: edits[{i}]: {err}; each edit needs `name`, `find` (a regular expression) "
                              "and `replace`") from None
    prompts = [str(p) for p in data.get("prompts") or []]
    if not edits or not prompts:
        raise ConfigError(f"{path}: needs at least one entry under `edits` and one under `prompts`")
    return edits, prompts


def break_code(code: str, lang: Language, rng: random.Random, edits: list[Edit]) -> tuple[str, str, str] | None:
    """(broken code, edit name, the parser's first error) from the first edit, in a random order, whose random
    match leaves code the parser rejects; None when none does."""
    for edit in rng.sample(edits, len(edits)):
        hits = list(edit.find.finditer(code))
        if not hits:
            continue
        m = rng.choice(hits)
        broken = code[: m.start()] + m.expand(edit.replace) + code[m.end():]
        err = lang.parse(broken).first_error
        if err is not None:
            return broken, edit.name, f"line {err.line}, column {err.col}: {err.message}"
    return None


def repair_pairs(rows: list[dict], n: int, seed: int, lang: Language) -> tuple[list[dict], RepairReport]:
    """Up to `n` repair rows from the code answers of `rows` (training rows with `response`: code, or text with
    the code in a fence), drawn without repeats in a seeded order; an answer whose code does not parse is left
    out. Each row names its source row and edit."""
    edits, prompts = load_repairs(lang.name)
    display_name = load_phrasing(lang.name)["language_name"]
    rng = random.Random(f"repairs:{seed}")
    order = rng.sample(range(len(rows)), len(rows))
    out, report = [], RepairReport()
    for i in order:
        if len(out) >= n:
            break
        row = rows[i]
        code = code_in_response(row.get("response") or "", lang.fence_tags)
        if not lang.parse(code).has_code:
            report.not_code += 1
            continue
        made = break_code(code, lang, rng, edits)
        if made is None:
            report.skipped += 1
            continue
        broken, name, error = made
        prompt = rng.choice(prompts).format(lang=display_name, fence=lang.fence_tags[0], error=error,
                                         code=broken)
        out.append(codegen_row(lang.name, prompt, code, category=f"{lang.name}_repair", rating=5,
                               source=f"repair:{name}:{row.get('source', i)}", origin="repairs"))
        report.by_edit[name] = report.by_edit.get(name, 0) + 1
    report.written = len(out)
    return out, report


def answers_in_file(path: Path) -> list[dict]:
    """The rows of a train pairs file that have a response; a bad line is a DataError naming it."""
    if not path.is_file():
        raise DataError(f"--input {path}: no such file; pass a train pairs JSONL (mens corpus pairs, requests...)")
    rows = []
    for no, row in read_pairs(path):
        if isinstance(row, BadLine):
            raise DataError(f"{path}:{no}: {row.reason}; fix or remove the line")
        if row.response:
            rows.append({"response": row.response, "source": row.source or f"{path.name}:{no}"})
    return rows


def repair_pairs_to_file(out: Path, inp: Path | None, n: int, seed: int, language: str) -> RepairReport:
    """`repair_pairs` from the answers in `inp` (default: the shipped requests of `language`), written to `out`."""
    from mens.corpus.jsonl import write_jsonl
    from mens.corpus.requests import request_pairs

    rows = request_pairs(language) if inp is None else answers_in_file(inp)
    made, report = repair_pairs(rows, n, seed, get_language(language))
    write_jsonl(out, made)
    return report

