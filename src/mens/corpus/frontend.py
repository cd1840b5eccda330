"""How the corpus tools talk to a language frontend: resolve it by name, parse text for a path, comments.

Everything language-specific the pipeline needs goes through here, so a second language plugs in by
registering a `Language` (see `mens.lang`). Run: used by every `mens corpus` command.
"""

from __future__ import annotations

from mens.lang import Language, ParseResult, get_language

DEFAULT_LANGUAGE = "vox"


def resolve_language(name: str | None) -> Language:
    """The frontend called `name` (default "vox"); UsageError listing known names otherwise."""
    return get_language(name or DEFAULT_LANGUAGE)


def parse_for_path(lang: Language, text: str, path: str = "") -> ParseResult:
    """Parse `text` as the file `path` would be parsed (e.g. `.vox.ui` is a reactive module), module mode."""
    per_path = getattr(lang, "parse_file_text", None)
    if per_path is not None and path:
        return per_path(text, path)
    return lang.parse(text)


def line_comment(lang: Language) -> str:
    """The language's line-comment marker (`//` unless the frontend says otherwise)."""
    return getattr(lang, "line_comment", "//")


def base_kinds(lang: Language, decls: list[tuple[str, str]] | list[list[str]]) -> list[str]:
    """Sorted unique base construct kinds of parsed declarations (`fn[pub]` -> `fn`)."""
    return sorted({lang.base_kind(kind) for kind, _ in decls})
