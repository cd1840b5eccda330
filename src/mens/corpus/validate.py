"""`mens corpus validate`: schema check, parse recheck, exact and normalized dedup; nothing is dropped silently.

Every input line ends in OUT or in the rejects file with a reason, and the report reconciles the counts
(in = kept + rejected, by reason). Units and train pairs are both accepted.
Run: `mens corpus validate units.jsonl -o validated.jsonl --rejects rejects.jsonl`.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from mens.corpus.frontend import base_kinds, line_comment, parse_for_path, resolve_language
from mens.corpus.jsonl import read_objects, reject_row, require_input, write_jsonl
from mens.corpus.normalize import code_in_response, normalize_code
from mens.corpus.progress import track
from mens.corpus.records import BadLine, TrainPair
from mens.corpus.units import CorpusUnit, sha256_text
from mens.lang import Language

CODE_LANES = ("vox_codegen", None)
"""Pair lanes whose response is code and must parse (rows without a lane count as code)."""


@dataclass
class ValidateReport:
    """Counts that reconcile: `n_in == n_kept + sum(rejected.values())`."""

    input: str
    output: str
    rejects: str
    recheck: bool
    n_in: int = 0
    n_kept: int = 0
    rejected: Counter = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)

    @property
    def reconciled(self) -> bool:
        return self.n_in == self.n_kept + sum(self.rejected.values())

    def to_json(self) -> dict:
        return {"input": self.input, "output": self.output, "rejects": self.rejects, "recheck": self.recheck,
                "total_input_records": self.n_in, "kept": self.n_kept, "rejected_total": sum(self.rejected.values()),
                "rejected_by_reason": dict(sorted(self.rejected.items())), "reconciled": self.reconciled,
                "failure_samples": self.samples[:32]}

    def summary(self) -> str:
        by = ", ".join(f"{k} {v}" for k, v in sorted(self.rejected.items())) or "none"
        return (f"in {self.n_in} = kept {self.n_kept} + rejected {sum(self.rejected.values())} ({by})"
                f"{'' if self.reconciled else '  [COUNTS DO NOT RECONCILE]'}\nkept -> {self.output}\n"
                f"rejected -> {self.rejects}")


def _schema_error(where: str, e: ValidationError) -> str:
    first = e.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "record"
    return f"schema: field {loc!r}: {first['msg']} (at {where}); see src/mens/corpus/schemas/ for the contract"


def _parse_reason(lang: Language, code: str, path: str, first_line: int, recheck: bool, recorded: bool | None):
    """(reason or None, decls) for a code text; reasons: parse_error (with the source line), no_code."""
    if not recheck and recorded is not None:
        return (None if recorded else "parse_error: recorded parse_ok=false (run without --no-recheck)"), []
    res = parse_for_path(lang, code, path)
    if not res.ok:
        d = res.first_error
        return f"parse_error: {path}:{first_line + d.line - 1}:{d.col}: {d.message} [{d.cls}]", []
    if not res.decls:
        return "no_code: parses but declares nothing (empty or comment-only)", []
    return None, list(res.decls)


def check_record(obj: dict, where: str, lang: Language, recheck: bool) -> tuple[str | None, str, dict]:
    """(reject reason or None, dedup text, record to keep) for one JSON object."""
    if "code" in obj and "kind" in obj:
        try:
            unit = CorpusUnit.model_validate(obj)
        except ValidationError as e:
            return _schema_error(where, e), "", obj
        if sha256_text(unit.code) != unit.sha256:
            return f"sha256_mismatch: code hash differs from recorded sha256 {unit.sha256[:12]}… (at {where}); " \
                   "the unit was edited after extract: extract again", "", obj
        if not unit.training_eligible:
            return f"not_training_eligible: {unit.ineligible_reason or 'opted out'} ({unit.where})", "", obj
        if unit.skip_markers:
            return f"skip_marker: block holds {', '.join(unit.skip_markers)} ({unit.where})", "", obj
        reason, decls = _parse_reason(lang, unit.code, unit.source, unit.line_start, recheck, unit.parse_ok)
        if reason:
            return reason, "", obj
        if decls:
            obj = {**obj, "decls": [list(d) for d in decls]}
        obj = {**obj, "constructs": base_kinds(lang, obj.get("decls", [])), "construct_count": len(decls)}
        return None, unit.code, obj
    try:
        pair = TrainPair.model_validate(obj)
    except ValidationError as e:
        return _schema_error(where, e), "", obj
    text = pair.response if pair.response is not None else pair.chat()[-1]["content"]
    if pair.lane in CODE_LANES and pair.category != "tool_trace" and recheck:
        reason, _ = _parse_reason(lang, code_in_response(text, lang.fence_tags), where, 1, True, None)
        if reason:
            return reason, "", obj
    return None, json.dumps([pair.prompt, text, pair.messages and len(pair.messages)]), obj


def validate_file(inp: Path, out: Path, rejects: Path | None = None, recheck: bool = True,
                  language: str | None = None) -> ValidateReport:
    """Validate `inp` into `out` (+ rejects); returns the reconciled report."""
    inp = require_input(inp, "validate")
    lang = resolve_language(language)
    comment = line_comment(lang)
    rejects = rejects or out.with_name(out.stem + ".rejects.jsonl")
    report = ValidateReport(str(inp), str(out), str(rejects), recheck)
    kept, bad = [], []
    exact: dict[str, str] = {}
    normal: dict[str, str] = {}
    with track("validate") as advance:
        for no, obj in read_objects(inp):
            advance(1)
            report.n_in += 1
            where = f"{inp}:{no}"
            if isinstance(obj, BadLine):
                bad.append(reject_row(obj.reason, where, raw=obj.raw))
                continue
            reason, text, obj = check_record(obj, where, lang, recheck)
            if reason is None:
                key_exact, key_norm = sha256_text(text), sha256_text(normalize_code(text, comment))
                if key_exact in exact:
                    reason = f"duplicate_exact: same text as {exact[key_exact]}"
                elif key_norm in normal:
                    reason = f"duplicate_normalized: same code modulo whitespace/comments as {normal[key_norm]}"
                else:
                    exact[key_exact] = normal[key_norm] = where
            if reason:
                bad.append(reject_row(reason, where, record=obj))
            else:
                kept.append(obj)
    for row in bad:
        report.rejected[row["reason"]] += 1
        report.samples.append(f"{row['where']}: {row['detail']}")
    report.n_kept = write_jsonl(out, kept)
    write_jsonl(rejects, bad)
    assert report.reconciled, report.summary()  # internal invariant: every record is counted once
    return report
