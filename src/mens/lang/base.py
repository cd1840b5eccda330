"""What every language frontend gives the rest of mens: parse verdicts, diagnostics, declarations.

The rest of mens talks to a `Language` only, so a second language plugs in without touching corpus,
eval or serve code. Run: `mens vox check PATH` (the Vox implementation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

Severity = Literal["error", "warning"]
Mode = Literal["module", "script"]


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One message from a frontend. `line` and `col` are 1-based; `cls` is the error class (e.g. ExpectToken)."""

    severity: Severity
    line: int
    col: int
    message: str
    cls: str

    def to_json(self) -> dict:
        return {"severity": self.severity, "line": self.line, "col": self.col, "message": self.message,
                "class": self.cls}


@dataclass(frozen=True, slots=True)
class ParseResult:
    """The verdict on one source text: `ok` iff no error diagnostic; `decls` as `(kind, name)` in source order."""

    ok: bool
    decls: list[tuple[str, str]] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def first_error(self) -> Diagnostic | None:
        errs = self.errors
        return errs[0] if errs else None

    @property
    def has_code(self) -> bool:
        """True when the text parses *and* declares something: empty or comment-only text is not code."""
        return self.ok and bool(self.decls)


@runtime_checkable
class Language(Protocol):
    """A language frontend. Implementations must never raise on any input text: problems are diagnostics."""

    name: str
    file_extensions: tuple[str, ...]
    """File suffixes of source files, e.g. (".vox", ".vox.ui")."""
    fence_tags: tuple[str, ...]
    """Markdown fence info strings whose blocks hold this language, e.g. ("vox",)."""
    construct_kinds: tuple[str, ...]
    """Every base declaration kind the parser can report (flags like `fn[pub]` reduce to `fn`)."""
    feature_kinds: tuple[str, ...]
    """The language's fixed lexical vocabulary that feature coverage counts (Vox: its keywords and decorators)."""

    def features(self, text: str) -> set[str]:
        """The members of `feature_kinds` that occur as tokens in `text` (not inside strings or comments); never
        raises."""
        ...

    def parse(self, text: str, mode: Mode = "module") -> ParseResult:
        """Lex and parse `text`; never raises."""
        ...

    def base_kind(self, kind: str) -> str:
        """The construct a reported kind belongs to: `fn[pub+async]` -> `fn`, `endpoint[query]` -> `endpoint`."""
        ...

    def viable_prefix(self, text: str) -> bool:
        """True when `text` can still be completed into code that parses (used by constrained decoding)."""
        ...

    def completion_suffix(self, text: str) -> str | None:
        """A short suffix that makes an unfinished `text` parse, or None (closes a budget-truncated answer)."""
        ...
