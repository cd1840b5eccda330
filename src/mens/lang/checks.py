"""Does an answer do what was asked? Parse its code, then check the task's expectations one by one.

A sample passes only when its code is non-empty, parses, declares something, and meets every
expectation (declared kinds and names, parameters, return type, required contents). Each failure
carries a reason and a category (`empty`, `parse`, `kind`, `name`, `params`, `returns`, `contents`).
Language-generic (through the `Language` protocol): the bench (mens.evaluate) and the task-pair generator
(mens.corpus.taskgen) judge answers with the same code. No torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from mens.lang.base import Language
from mens.lang.extract import extract_code

# Declaration headers whose parameter list we read: `fn name<T>(…)`, `component Name(…)`, …
_HEADER = r"\b(?:fn|component|workflow|activity|fragment)\s+{name}\s*(?:<[^>(]*>)?\s*\("
# Stub markers count only inside comments, as whole words: `input(placeholder="…")` or a `Todo` table are fine.
_STUB_MARKER = re.compile(r"\b(todo|tbd|fixme|placeholder|not implemented|unimplemented)\b", re.I)
_COMMENT = re.compile(r"(?://|#)(.*)$", re.M)


class Expect(BaseModel):
    """What the answer's code must show; every listed item is required."""

    model_config = ConfigDict(extra="forbid")
    decls: list[tuple[str, str]] = Field(default_factory=list, description="(kind, name) pairs that must be declared.")
    kinds: list[str] = Field(default_factory=list, description="Kinds, exact (endpoint[query]) or base.")
    names: list[str] = Field(default_factory=list, description="Names that must be declared (any kind).")
    params: dict[str, list[str]] = Field(
        default_factory=dict, description="decl name -> parameters, as 'name' or 'name: type', in order."
    )
    returns: dict[str, str] = Field(default_factory=dict, description="decl name -> return type after `to`.")
    contains: list[str] = Field(default_factory=list, description="Substrings the code must contain.")
    not_contains: list[str] = Field(default_factory=list, description="Substrings the code must not contain.")

    def declared_names(self) -> set[str]:
        """Every name the answer must declare or give a signature to."""
        return {n for _, n in self.decls} | set(self.names) | set(self.params) | set(self.returns)


@dataclass
class SampleCheck:
    """The verdict on one generated answer."""

    code: str
    non_empty: bool
    parse_ok: bool
    has_code: bool
    passed: bool
    failures: list[tuple[str, str]] = field(default_factory=list)
    """(category, reason) for every unmet requirement, in check order."""
    first_diagnostic: str | None = None
    decls: list[tuple[str, str]] = field(default_factory=list)

    @property
    def failure_category(self) -> str | None:
        return self.failures[0][0] if self.failures else None

    def to_json(self) -> dict:
        return {"non_empty": self.non_empty, "parse_ok": self.parse_ok, "has_code": self.has_code,
                "pass": self.passed, "failures": [{"category": c, "reason": r} for c, r in self.failures],
                "first_diagnostic": self.first_diagnostic, "decls": [list(d) for d in self.decls]}


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


def header_signature(code: str, name: str) -> tuple[list[str], str | None] | None:
    """Parameters (as written, defaults dropped) and return type of declaration `name`, or None if absent."""
    m = re.search(_HEADER.format(name=re.escape(name)), code)
    if not m:
        return None
    i, depth = m.end(), 1
    start = i
    while i < len(code) and depth:
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        i += 1
    params = [p.split("=", 1)[0].strip() for p in _split_top_level(code[start : i - 1])]
    # `fn f(x: int) uses net to bool {`: the effect clause comes before the return type;
    # `extern fn f() to int = "./mod"`: the module path comes after it.
    ret = re.match(r"\s*(?:uses\b[^{\n]*?)?(?:\bto\b|->)\s*([^{=\n]+?)\s*(?:\{|=|$)", code[i:], re.M)
    return params, (ret.group(1).strip() if ret else None)


def _norm(s: str) -> str:
    return re.sub(r"\s+", "", s)


def _param_matches(want: str, got: str) -> bool:
    if ":" in want:
        return _norm(want) == _norm(got)
    return got.split(":", 1)[0].strip() == want.strip()


def _kind_present(kind: str, decls: list[tuple[str, str]], lang: Language) -> bool:
    return any(k == kind or lang.base_kind(k) == kind for k, _ in decls)


def check_expectations(
    code: str, decls: list[tuple[str, str]], expect: Expect, lang: Language
) -> list[tuple[str, str]]:
    """Every unmet expectation as (category, reason)."""
    fails: list[tuple[str, str]] = []
    kinds_seen = ", ".join(k for k, _ in decls) or "none"
    for kind in expect.kinds:
        if not _kind_present(kind, decls, lang):
            fails.append(("kind", f"expected a {kind} declaration; got {kinds_seen}"))
    names = {n for _, n in decls}
    for kind, name in expect.decls:
        if not any((k == kind or lang.base_kind(k) == kind) and n == name for k, n in decls):
            seen = [f"{k} {n}" for k, n in decls if n == name]
            got = ", ".join(seen) if seen else f"{kinds_seen} {sorted(names)}"
            fails.append(("kind" if seen else "name", f"expected {kind} {name!r}; got {got}"))
    for name in expect.names:
        if name not in names:
            fails.append(("name", f"expected a declaration named {name!r}; declared {sorted(names) or 'nothing'}"))
    for name, want in expect.params.items():
        sig = header_signature(code, name)
        got = sig[0] if sig else None
        if got is None:
            fails.append(("params", f"no parameter list found for {name!r}"))
        elif len(got) != len(want) or not all(_param_matches(w, g) for w, g in zip(want, got, strict=False)):
            fails.append(("params", f"{name} params: expected ({', '.join(want)}), got ({', '.join(got)})"))
    for name, want in expect.returns.items():
        sig = header_signature(code, name)
        got = sig[1] if sig else None
        if got is None or _norm(got) != _norm(want):
            fails.append(("returns", f"{name} should return {want}; got {got or 'no return type'}"))
    for s in expect.contains:
        if s not in code:
            fails.append(("contents", f"missing required text {s!r}"))
    for s in expect.not_contains:
        if s in code:
            fails.append(("contents", f"contains forbidden text {s!r}"))
    return fails


def check_output(output: str, expect: Expect, lang: Language) -> SampleCheck:
    """Extract the code of `output`, parse it with `lang`, and check it against `expect`."""
    code = extract_code(output, lang.fence_tags)
    non_empty = bool(code.strip())
    result = lang.parse(code)
    first = result.first_error
    diag = f"{first.line}:{first.col}: {first.message}" if first else None
    fails: list[tuple[str, str]] = []
    if not non_empty:
        fails.append(("empty", "the answer has no code"))
    elif not result.ok:
        fails.append(("parse", f"does not parse: {diag}"))
    elif not result.decls:
        fails.append(("empty", "parses but declares nothing (comments or bare statements only)"))
    else:
        fails.extend(check_expectations(code, result.decls, expect, lang))
        hits = sorted({m.group(1).lower() for c in _COMMENT.finditer(code) for m in _STUB_MARKER.finditer(c.group(1))})
        if hits:
            fails.append(("placeholder", f"placeholder text in the answer: {', '.join(hits)}"))
    return SampleCheck(code=code, non_empty=non_empty, parse_ok=result.ok, has_code=result.has_code,
                       passed=not fails, failures=fails, first_diagnostic=diag, decls=list(result.decls))
