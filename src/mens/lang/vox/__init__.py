"""The Vox language frontend: `VOX` (the `Language` object), `parse(text, mode)`, `lex(text)`.

Ports the upstream recursive-descent parser (vox-foundation/vox @ 3456cc9) so verdicts match the compiler.
"""

from __future__ import annotations

from mens.lang.base import Diagnostic, Mode, ParseResult
from mens.lang.vox.ast import base_kind
from mens.lang.vox.complete import closing_suffix, completion_suffix, finish_text, stream_closing_suffix
from mens.lang.vox.lexer import Tokens, lex
from mens.lang.vox.parser import Parser
from mens.lang.vox.prefix import PrefixChecker, clean_viable_prefix, viable_prefix
from mens.lang.vox.tokens import DECORATORS, KEYWORDS

CONSTRUCT_KINDS = (
    "fn", "type_struct", "type_adt", "table", "index", "endpoint", "test", "forall", "scheduled", "loading",
    "mcp_tool", "mcp_resource", "component", "reactive_module", "fragment", "routes", "url", "state_machine",
    "workflow", "activity", "actor", "form", "v0_component", "import", "let_const", "back_button", "deep_link",
    "push", "tokens",
)

__all__ = ["VOX", "VoxLanguage", "lex", "parse", "parse_file_text", "viable_prefix", "Tokens"]


def parse(text: str, mode: Mode = "module", kind: str = "source") -> ParseResult:
    """Lex and parse; `kind="reactive_module"` is the `.vox.ui` grammar. Never raises."""
    try:
        parser = Parser(lex(text), reactive_module=(kind == "reactive_module"))
        decls = parser.parse_script() if mode == "script" else parser.parse_module()
        ok = not parser.has_error
        return ParseResult(ok, [d.as_pair() for d in decls] if ok else [], parser.diags)
    except (RecursionError, MemoryError, Exception) as exc:  # noqa: BLE001 - the protocol forbids raising
        diag = Diagnostic("error", 1, 1, f"internal parser error: {type(exc).__name__}: {exc}", "Internal")
        return ParseResult(False, [], [diag])


def parse_file_text(text: str, path: str, mode: Mode = "module") -> ParseResult:
    """Parse a file's text the way upstream does for its path: `.vox.ui` files are reactive modules."""
    kind = "reactive_module" if str(path).endswith(".vox.ui") else "source"
    return parse(text, mode, kind=kind)


class VoxLanguage:
    """The Vox `Language` implementation."""

    name = "vox"
    file_extensions = (".vox", ".vox.ui")
    fence_tags = ("vox",)
    construct_kinds = CONSTRUCT_KINDS
    feature_kinds = tuple(sorted(KEYWORDS)) + DECORATORS

    def parse(self, text: str, mode: Mode = "module", kind: str = "source") -> ParseResult:
        return parse(text, mode, kind=kind)

    def features(self, text: str) -> set[str]:
        """Keywords and decorators among `text`'s tokens (the lexer drops comments; strings are their own tokens).
        A keyword right after a `.` is a path or member name (`import std.http`, `req.http`), not its feature."""
        try:
            kinds = lex(text).kinds
            after_dot = zip(("", *kinds[:-1]), kinds, strict=True)
            return {k for prev, k in after_dot if prev != "."}.intersection(self.feature_kinds)
        except Exception:  # noqa: BLE001 - the protocol forbids raising (RecursionError and MemoryError included)
            return set()

    def parse_file_text(self, text: str, path: str, mode: Mode = "module") -> ParseResult:
        return parse_file_text(text, path, mode)

    def base_kind(self, kind: str) -> str:
        return base_kind(kind)

    def viable_prefix(self, text: str) -> bool:
        """True when `text` parses or fails only because it ended early (see `prefix.py`)."""
        return viable_prefix(text)

    def clean_viable_prefix(self, text: str) -> bool:
        """`viable_prefix`, and free of characters the lexer drops: what constrained decoding allows."""
        return clean_viable_prefix(text)

    def prefix_checker(self) -> PrefixChecker:
        """A fresh `clean_viable_prefix` for the successive prefixes of one answer, judged incrementally."""
        return PrefixChecker()

    def completion_suffix(self, text: str) -> str | None:
        """A short suffix that turns an unfinished prefix into code that parses (see `complete.py`)."""
        return completion_suffix(text, lambda t: parse(t).has_code, viable_prefix)

    def closing_suffix(self, text: str) -> str | None:
        """A suffix that closes `text` so that it parses, found in a parse or two, or None (see `complete.py`)."""
        return closing_suffix(text, lambda t: parse(t).has_code)

    def stream_closing_suffix(self, text: str) -> str | None:
        """A suffix that closes `text`, with placeholders where needed, or None: how far a constrained answer may
        be streamed (see `complete.py`)."""
        return stream_closing_suffix(text, lambda t: parse(t).has_code)

    def finish_text(self, text: str) -> str:
        """An unfinished answer closed (or cut back to a line that can be closed) so that it parses."""
        return finish_text(text, lambda t: parse(t).has_code, viable_prefix)


VOX = VoxLanguage()
