"""`mens corpus pairs`: validated units -> instruction pairs (`train.jsonl`, schema vox_dogfood_v1).

Responses are clean code: golden header comments, `@training_prompt` and ANCHOR lines are stripped, and the
stripped code is parsed again; a response that does not parse is never written. Prompts are natural task
descriptions in several phrasings per unit, chosen by seed. Run: `mens corpus pairs validated.jsonl -o train.jsonl`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from mens.corpus.atomic import write_text_atomic
from mens.corpus.decl_split import split_decls
from mens.corpus.extract import ExtractReport, collect_files, units_from_markdown
from mens.corpus.frontend import base_kinds, line_comment, resolve_language
from mens.corpus.golden_header import strip_marker_lines
from mens.corpus.jsonl import read_objects, reject_row, require_input, write_jsonl
from mens.corpus.phrasing import article, choose, decl_list, load_phrasing, noun_for, render, sentence
from mens.corpus.records import SCHEMA_VERSION, BadLine, TrainPair
from mens.corpus.source_files import read_source
from mens.corpus.tool_trace import ToolTraceRecord, is_tool_trace, tool_trace_to_pair
from mens.corpus.units import CorpusUnit
from mens.lang import Language

RATING = {"file": 5, "decl": 5, "anchor": 4, "doc_block": 4}


@dataclass
class PairsReport:
    """Every input record produced pairs or is listed with a reason: `n_in == n_used + sum(skipped)`."""

    n_in: int = 0
    n_used: int = 0
    n_pairs: int = 0
    n_doc_units: int = 0
    n_duplicate_pairs: int = 0
    """Pairs built but not written because an earlier record gave the same prompt and response (in rejects)."""
    skipped: Counter = field(default_factory=Counter)
    by_category: Counter = field(default_factory=Counter)
    docs_refused: list[str] = field(default_factory=list)

    @property
    def reconciled(self) -> bool:
        return self.n_in == self.n_used + sum(self.skipped.values())

    def summary(self) -> str:
        by = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items())) or "none"
        cats = ", ".join(f"{k} {v}" for k, v in self.by_category.most_common())
        refused = "".join(f"\n--docs file refused: {r}" for r in self.docs_refused)
        return (f"records in {self.n_in} = used {self.n_used} + skipped {sum(self.skipped.values())} ({by}); "
                f"--docs units {self.n_doc_units}\npairs {self.n_pairs} ({cats}); duplicate pairs not written "
                f"{self.n_duplicate_pairs} (in rejects){refused}")


@dataclass
class PairBuilder:
    """Turns units into pair rows for one language, phrasing count and seed."""

    lang: Language
    seed: int = 0
    n_phrasings: int = 3
    multi_turn: bool = False

    def __post_init__(self) -> None:
        self.table = load_phrasing(self.lang.name)
        self.display = self.table.get("language_name", self.lang.name)
        self.comment = line_comment(self.lang)

    def _values(self, unit: CorpusUnit, decls: list) -> dict:
        kind, name = decls[0] if decls else ("code", "")
        noun = noun_for(self.table, kind, self.lang.base_kind(kind))
        stem = Path(unit.source).name.split(".")[0]
        sig = unit.signature or kind
        for prefix in self.table.get("sig_strip_prefixes", []):
            if sig.startswith(prefix) and len(sig) > len(prefix):
                sig = sig[len(prefix):]
                break
        return {"lang": self.display, "noun": noun, "a": article(noun), "name": name or stem,
                "sig": sig, "desc": sentence(unit.description or ""), "stem": stem,
                "decl_list": decl_list(self.table, decls, self.lang.base_kind),
                "heading": unit.heading or unit.title or stem, "context": unit.context or ""}

    def prompts(self, unit: CorpusUnit, decls: list) -> list[str]:
        """`n_phrasings` distinct prompts for the unit (the @training_prompt itself comes first)."""
        t = self.table
        if unit.kind == "decl":
            pool = t["decl_desc_templates"] if unit.description else t["decl_templates"]
        elif unit.kind == "doc_block":
            pool = t["doc_templates"] if unit.context else t["doc_templates_no_context"]
        else:
            pool = t["file_desc_templates"] if unit.description else t["file_templates"]
        chosen = choose(pool, self.n_phrasings, unit.sha256, self.seed)
        if unit.kind in ("file", "anchor") and unit.description and pool[0] in pool and pool[0] not in chosen:
            chosen = [pool[0], *chosen[:-1]]  # the author's own task description is always one of them
        values = self._values(unit, decls)
        return list(dict.fromkeys(render(tpl, **values) for tpl in chosen))

    def clean_response(self, unit: CorpusUnit) -> tuple[str | None, list, str]:
        """(clean code or None, decls, reason) — None when the stripped code no longer parses."""
        code = strip_marker_lines(unit.code) if unit.kind != "doc_block" else unit.code.strip("\n") + "\n"
        res = self.lang.parse(code)
        if not res.ok:
            d = res.first_error
            return None, [], f"stripped_code_unparsable: {unit.where}: line {d.line}: {d.message}"
        if not res.decls:
            return None, [], f"no_code: {unit.where}: nothing declared after stripping header comments"
        return code, list(res.decls), ""

    def pairs_for_unit(self, unit: CorpusUnit) -> tuple[list[dict], str]:
        code, decls, reason = self.clean_response(unit)
        if code is None:
            return [], reason
        lane = f"{self.lang.name}_codegen"
        name = self.lang.name
        category = {"file": f"{name}_program", "anchor": f"{name}_snippet", "doc_block": "documentation"}.get(
            unit.kind) or f"{name}_{self.lang.base_kind(decls[0][0])}"
        base = {"response": code, "category": category, "rating": RATING[unit.kind],
                "schema_version": SCHEMA_VERSION, "source": f"{unit.source}:{unit.line_start}-{unit.line_end}",
                "constructs": base_kinds(self.lang, decls), "lane": lane, "response_mode": "code_only",
                "task_family": "docs_code" if unit.kind == "doc_block" else lane}
        rows = [{"prompt": p, **base} for p in self.prompts(unit, decls)]
        if self.multi_turn and unit.kind == "file":
            chat = self.chat_for(unit, code)
            if chat:
                rows.append({**base, "prompt": None, "response": None, "messages": chat,
                             "category": f"{self.lang.name}_multi_turn"})
                rows[-1] = {k: v for k, v in rows[-1].items() if v is not None}
        return rows, ""

    def chat_for(self, unit: CorpusUnit, code: str) -> list[dict] | None:
        """user asks for decl 1 / assistant answers / user asks to add decl 2 / … (each answer parses)."""
        slices = split_decls(self.lang, code, self.comment)
        if not slices or len(slices) < 2:
            return None
        msgs, so_far = [], ""
        for i, s in enumerate(slices[:3]):
            fake = unit.model_copy(update={"signature": s.signature, "kind": "decl", "description": None})
            values = self._values(fake, s.decls)
            pool = self.table["followup_templates"] if i else self.table["decl_templates"]
            msgs.append({"role": "user", "content": render(choose(pool, 1, unit.sha256 + str(i), self.seed)[0],
                                                           **values)})
            so_far = (so_far + "\n" + s.code) if so_far else s.code
            if not self.lang.parse(so_far).ok:
                return None
            msgs.append({"role": "assistant", "content": so_far})
        return msgs


def _doc_units(lang: Language, dirs: list[Path], refused: list[str]) -> Iterator[CorpusUnit]:
    """Doc-block units of the markdown pages under `dirs`; pages that cannot be read safely go to `refused`."""
    report, skipped = ExtractReport(), []
    files = collect_files(dirs, lang, skipped)
    refused += [f"{s.source}: {s.reason}" for s in skipped if s.source.endswith(".md")]
    for path, source in files:
        if path.name.endswith(".md"):
            text, reason = read_source(path)
            if text is None:
                refused.append(f"{source}: {reason}")
                continue
            yield from units_from_markdown(lang, text, source, report)


def build_pairs(inp: Path, out: Path, docs: list[Path] | None = None, seed: int = 0, n_phrasings: int = 3,
                multi_turn: bool = False, rejects: Path | None = None, language: str | None = None) -> PairsReport:
    """Write pairs for every usable record of `inp` (and doc blocks under `docs`); returns the report."""
    inp = require_input(inp, "pairs")
    builder = PairBuilder(resolve_language(language), seed, n_phrasings, multi_turn)
    report, rows, bad, seen_units, seen_rows = PairsReport(), [], [], set(), {}

    def add(new: list[dict], where: str) -> int:
        """Append the rows not seen before; each duplicate gets a rejects row. Returns how many were new."""
        n_new = 0
        for row in new:
            key = _key(row)
            if key in seen_rows:
                report.n_duplicate_pairs += 1
                bad.append(reject_row(f"duplicate_pair: same prompt and response as the pair from "
                                      f"{seen_rows[key]}", where, record=row, level="pair"))
                continue
            seen_rows[key] = where
            rows.append(row)
            n_new += 1
        return n_new

    def use(new: list[dict], where: str, record: dict, reason: str = "") -> None:
        """Count an input record as used, or skipped with a reason (also when all its pairs are duplicates)."""
        if new and not add(new, where):
            reason = f"duplicate: every pair of this record was already built from {seen_rows[_key(new[0])]}"
        if reason:
            report.skipped[reason.split(":", 1)[0]] += 1
            bad.append(reject_row(reason, where, record=record))
        else:
            report.n_used += 1

    for no, obj in read_objects(inp):
        report.n_in += 1
        where = f"{inp}:{no}"
        try:
            if isinstance(obj, BadLine):
                raise ValueError(obj.reason)
            if "code" in obj and "kind" in obj:
                unit = CorpusUnit.model_validate(obj)
                seen_units.add(unit.sha256)
                new, reason = builder.pairs_for_unit(unit)
                use(new, where, obj, reason)
            elif is_tool_trace(obj):
                use([tool_trace_to_pair(ToolTraceRecord.model_validate(obj))], where, obj)
            else:  # an existing train pair passes through unchanged (it is re-validated by the contract)
                use([TrainPair.model_validate(obj).model_dump(mode="json", exclude_none=True)], where, obj)
        except (ValueError, ValidationError) as e:
            reason = obj.reason if isinstance(obj, BadLine) else f"schema: {str(e).splitlines()[0]} at {where}"
            report.skipped[reason.split(":", 1)[0]] += 1
            bad.append(reject_row(reason, where, record=None if isinstance(obj, BadLine) else obj,
                                  raw=obj.raw if isinstance(obj, BadLine) else None))
    for unit in _doc_units(builder.lang, docs or [], report.docs_refused):
        if unit.sha256 in seen_units or not unit.training_eligible or unit.skip_markers or not unit.parse_ok:
            continue
        seen_units.add(unit.sha256)
        report.n_doc_units += 1
        new, _ = builder.pairs_for_unit(unit)
        add(new, f"--docs {unit.where}")
    for row in rows:
        report.by_category[row["category"]] += 1
    report.n_pairs = write_jsonl(out, rows)
    if rejects or bad:
        write_jsonl(rejects or out.with_name(out.stem + ".rejects.jsonl"), bad)
    meta = {"schema_version": SCHEMA_VERSION, "total_pairs": report.n_pairs, "seed": seed,
            "phrasings_per_unit": n_phrasings, "generated_by": "mens corpus pairs", "input": str(inp),
            "by_category": dict(report.by_category), "skipped": dict(report.skipped),
            "duplicate_pairs": report.n_duplicate_pairs}
    write_text_atomic(out.with_name(out.stem + ".metadata.json"), json.dumps(meta, indent=2) + "\n")
    assert report.reconciled, report.summary()  # internal invariant: every record is counted once
    return report


def _key(row: dict) -> str:
    return json.dumps([row.get("prompt"), row.get("response"), row.get("messages")])
