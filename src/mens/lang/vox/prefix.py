"""Viable-prefix check for constrained decoding: can `text` still grow into Vox that parses?

Errors are positional, so a prefix is viable when it parses, or when its first error sits at end of input
(an open block, call or string), possibly after the last token is cut back to a shorter spelling.

`PrefixChecker` gives the same verdicts for the successive prefixes of one answer at a fraction of the cost:
it remembers verdicts, and judges text that only grows a string, an identifier or trailing spaces of a prefix
it already accepted without lexing or parsing again.
"""

from __future__ import annotations

import re
import sys
from collections import OrderedDict
from dataclasses import dataclass

from mens.lang.vox import core, parse_decl_data, parse_decl_ui, parse_expr, parse_fn, parse_stmt, parse_types, parser
from mens.lang.vox import tokens as T
from mens.lang.vox.lexer import comment_offsets, lex, sloppy_offsets
from mens.lang.vox.parser import Parser
from mens.lang.vox.tokens import DECORATORS, KEYWORDS, PUNCTUATION

# Words the parser checks by spelling where they matter (they lex as plain identifiers).
_CONTEXTUAL = (
    "routes url state_machine partial terminal from any uses key depends_on as rust react style raw_css not_found "
    "error field on_submit success_redirect error_message required optional hidden label range max_len min_len "
    "pattern default kind fallback provider secret origins by class tier model query mutation server version path "
    "git rev branch loader pending color light dark spacing radius shadow font family"
).split()
# `//` starts a comment: a trailing `/` may be its first half.
_SPELLINGS = tuple(sorted(KEYWORDS | set(DECORATORS) | set(PUNCTUATION) | set(_CONTEXTUAL) | {"//"}))


def _growths(word: str) -> list[str]:
    """Spellings the parser treats specially that `word` is a proper prefix of (`t` of `to`, `-` of `->`).

    A rejected number or ordinary name can never become acceptable by growing, so it has none.
    """
    return [s for s in _SPELLINGS if len(s) > len(word) and s.startswith(word)]


def _first_error(text: str, reactive_module: bool) -> tuple[int, str] | None:
    """(token index, message) of the first error and the EOF index, or None when `text` parses."""
    parser = Parser(lex(text), reactive_module=reactive_module)
    parser.parse_module()
    if parser.first_error_pos is None:
        return None
    first = next(d for d in parser.diags if d.severity == "error")
    return parser.first_error_pos - parser.last, first.message


# Continuations that move or fix an error caused only by the input ending early. An error that stays the
# same whatever follows (`@endpoint(kind: )`, reported at the end after `)` was consumed) is not such an error.
_PROBES = (" x", " |", " (", " {", " 0", ' "s"', "\n}", ")", " =", ":")
_SPELLING_SET = frozenset(_SPELLINGS)


def _message_probes(message: str) -> list[str]:
    """Probes for the keywords an error message says are expected, which no fixed probe spells: `fn` after `pub`,
    `state` after `terminal`, the `to` of a route."""
    words = re.findall(r"`([^`\s]+)`", message) + re.findall(r"@?[A-Za-z_][A-Za-z0-9_.]*", message)
    return [" " + w for w in dict.fromkeys(words) if w in _SPELLING_SET]


def _error_at_end(text: str, reactive_module: bool) -> bool | None:
    """True: parses, or fails only because it ended; False: fails earlier; None: the parser itself broke."""
    try:
        err = _first_error(text, reactive_module)
        if err is None:
            return True
        if err[0] != 0:  # not at EOF
            return False
        for probe in (*_PROBES, *_message_probes(err[1])):
            after = _first_error(text + probe, reactive_module)
            # Fixed, changed, or again stuck at the (later) end: the probe was taken, so the end was the problem.
            if after is None or after[1] != err[1] or after[0] == 0:
                return True
        return False
    except Exception:  # noqa: BLE001 - never raise from the decoding hot path
        return None


_STRINGS_AND_COMMENTS = re.compile(r'''//[^\n]*|#[^\n]*|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|["']''')


def _open_quote(text: str) -> str | None:
    """What closes a string literal left open at the end of `text`, or None when none is open.

    The lexer drops a quote that opens no complete literal; here the first such quote starts a literal still
    being written, and everything after it (comment marks, the other quote) is its content. A trailing
    unfinished escape (`"a\\`) is finished before the quote.
    """
    for m in _STRINGS_AND_COMMENTS.finditer(text):
        quote = m.group()
        if quote in ('"', "'"):
            body = text[m.end():]
            return ("x" if (len(body) - len(body.rstrip("\\"))) % 2 else "") + quote
    return None


def _in_comment(text: str) -> bool:
    """True when `text` ends inside a line comment: a `(` appended there adds no token."""
    return len(lex(text + "(")) == len(lex(text))


_WORD_END = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
_DIGIT_DOT = re.compile(r"(?<![A-Za-z_0-9])[0-9]+\.$")
_PARTIAL_END = re.compile(r"@[A-Za-z_.]*$")


def _judge(text: str, reactive_module: bool) -> str | None:
    """How `text` is viable: "string" (judged with its open string closed), "strong" (it parses or fails only
    at its end as it stands), "grown" (only once its last token grows or a newline ends its comment), or None."""
    quote = _open_quote(text)
    if quote:  # an open string swallows what follows until it closes: judge the text with the string closed
        return "string" if _error_at_end(text + quote, reactive_module) else None
    if text and _in_comment(text):  # whatever comes next starts after the comment's newline
        return "grown" if _judge(text + "\n", reactive_module) else None
    if _error_at_end(text, reactive_module):
        return "strong"
    # The last token may be an unfinished longer token (`-` of `->`, `@te` of `@test`, a half keyword).
    if text and not text[-1].isspace():
        toks = lex(text)
        start = toks.offsets[-2] if len(toks) >= 2 else len(text)
        partial = _PARTIAL_END.search(text)  # `@sear`, `@mcp.`: a dropped `@` and the start of a decorator name
        if partial is not None:
            start = min(start, partial.start())
        # Only growths that the parser would accept right here count: `gi` could become `git`, but not at top level.
        # A grown `//` opens a comment, after which only a new line can continue.
        if start < len(text) and any(_error_at_end(text[:start] + (grown if grown != "//" else "//\n"), reactive_module)
                                     for grown in _growths(text[start:])):
            return "grown"
        # A keyword or a word the parser reads by spelling may be the start of a plain name (`is` of
        # `is_leap_year`, `style` of `styles`); `_0` makes any such word an ordinary identifier of the same case.
        word = _WORD_END.search(text)
        if word and word.start() == start and _error_at_end(text + "_0", reactive_module):
            return "grown"
        # `0.` may be the start of a float.
        if _DIGIT_DOT.search(text) and _error_at_end(text + "0", reactive_module):
            return "grown"
        # A final `@` or `!` lexes as a dropped character, but may be the start of a decorator or of `!=`.
        if text[-1] in "@!" and _error_at_end(text[:-1], reactive_module):
            return "grown"
    return None


def viable_prefix(text: str, reactive_module: bool = False) -> bool:
    """True when `text` parses, or fails only because it ended early (an open block, call or string, a half
    token) so that some continuation parses."""
    return _judge(text, reactive_module) is not None


_PARTIAL_AT = re.compile(r"@[A-Za-z_.]*")


def _clean(text: str) -> tuple[bool, bool]:
    """(clean, has an unfinished `@`/`!` at its end) for `clean_viable_prefix`; an open string is judged closed."""
    quote = _open_quote(text)
    closed = text + quote if quote else text
    if comment_offsets(closed):
        return False, False
    partial = False
    for i in sloppy_offsets(closed):
        last = i == len(closed) - 1
        unfinished = (closed[i] == "!" and last) or (closed[i] == "@" and _PARTIAL_AT.fullmatch(closed, i))
        if not unfinished:
            return False, False
        partial = True
    return True, partial


def clean_viable_prefix(text: str, reactive_module: bool = False) -> bool:
    """A viable prefix with nothing the lexer would drop (`&&`, `;`, backticks, comments), so constrained
    answers are clean Vox; a final `@` or `!` may still become a decorator or `!=`, and an open string may
    hold anything.

    Comments are refused too: they never make code parse, and a model can loop on them until the token budget
    is spent (measured: `@scheduled // Run every hour` then sixty `// No cleanup()` lines, which no repair
    can close); refused, it has to continue the code.
    """
    clean, partial = _clean(text)
    if not clean:
        return False
    return _partial_viable(text, reactive_module) if partial else viable_prefix(text, reactive_module)


def _partial_viable(text: str, reactive_module: bool) -> bool:
    """A text ending in an unfinished `@name` or `!`: viable only as a decorator or `!=` in the making (the
    lexer drops the unfinished part, so the text as it stands says nothing about what may follow)."""
    if text.endswith("!"):
        return bool(_error_at_end(text + "=", reactive_module))
    m = _PARTIAL_END.search(text)
    return m is not None and any(_error_at_end(text[:m.start()] + grown, reactive_module)
                                 for grown in _growths(m.group()))


def _value_words() -> frozenset[str]:
    """Every word the parser could compare a token's spelling with: the words of all string constants and
    tables in its modules (keywords, contextual words, view tags, metadata keys; message words come along,
    which only makes the set larger). A name outside this set is read by its kind alone."""
    words: set[str] = {"_"}

    def add(value: object) -> None:
        if isinstance(value, str):
            words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", value))
        elif isinstance(value, (frozenset, set, tuple, list)):
            for item in value:
                add(item)
        elif isinstance(value, dict):
            for key, item in value.items():
                add(key)
                add(item)
        elif hasattr(value, "co_consts"):
            for const in value.co_consts:
                add(const)

    for module in (core, parser, parse_decl_data, parse_decl_ui, parse_expr, parse_fn, parse_stmt, parse_types, T,
                   sys.modules[__name__]):
        for name, value in vars(module).items():
            if name.startswith("__"):  # builtins, module metadata
                continue
            if isinstance(value, type):
                for member in vars(value).values():
                    add(getattr(member, "__code__", member))
            else:
                add(getattr(value, "__code__", value))
    return frozenset(words)


_SPECIAL_WORDS = _value_words()
_SAFE_AFTER_WORD = re.compile(r"[A-Za-z0-9_]+")
_SPACES = re.compile(r"[ \t]+")


@dataclass(frozen=True, slots=True)
class _Accepted:
    """How an accepted text was judged, for the fast paths of its extensions."""

    how: str
    """`_judge`'s answer: "string", "strong" or "grown"."""
    partial: bool
    """It ends with an unfinished `@` or `!` (clean only while nothing follows)."""
    word: str | None
    """The ordinary (not parser-read) name it ends with, when it is strong and ends inside one."""
    quote: str | None = None
    """The quote of the string it ends inside, when that string is closed by the quote alone."""


class PrefixChecker:
    """`clean_viable_prefix` (or `viable_prefix` with `clean=False`) for the successive prefixes of one answer.

    The verdicts are the same (tests compare them prefix by prefix on real programs); the work is not. Every
    verdict is remembered by text, and a text that extends a recently accepted one by characters that cannot
    change the verdict is accepted without lexing or parsing:
    - more characters inside an open string (neither its quote nor a backslash: the string stays open and its
      content is never read by the parser);
    - more letters of an ordinary name the accepted text ends with (same token kind, and neither spelling is
      one the parser compares names with);
    - spaces or tabs after a text that was viable as it stands (the tokens do not change).
    Everything else is judged in full.
    """

    RECENT = 8
    """How many recently accepted texts are kept as bases for the fast paths."""

    def __init__(self, reactive_module: bool = False, clean: bool = True, memo_size: int = 4096):
        self.reactive_module = reactive_module
        self.clean = clean
        self.memo_size = memo_size
        self._verdicts: OrderedDict[str, bool] = OrderedDict()
        self._accepted: OrderedDict[str, _Accepted] = OrderedDict()
        self.counts = {"memo": 0, "fast": 0, "full": 0}
        """How each verdict was reached (a benchmark reports them)."""

    def __call__(self, text: str) -> bool:
        verdict = self._verdicts.get(text)
        if verdict is not None:
            self.counts["memo"] += 1
            if verdict and text in self._accepted:
                self._accepted.move_to_end(text)
            return verdict
        accepted = self._fast(text)
        if accepted is not None:
            self.counts["fast"] += 1
        else:
            self.counts["full"] += 1
            accepted = self._full(text)
        self._verdicts[text] = accepted is not None
        if len(self._verdicts) > self.memo_size:
            self._verdicts.popitem(last=False)
        if accepted is not None:
            self._accepted[text] = accepted
            if len(self._accepted) > self.RECENT:
                self._accepted.popitem(last=False)
        return accepted is not None

    def _fast(self, text: str) -> _Accepted | None:
        for base in reversed(self._accepted):
            if len(base) < len(text) and text.startswith(base):
                return self._extend(base, self._accepted[base], text[len(base):])
        return None

    @staticmethod
    def _extend(base: str, how: _Accepted, more: str) -> _Accepted | None:
        """The judgement of `base + more` when `more` cannot change it, else None (judge in full)."""
        if how.how == "string":
            return how if how.quote is not None and how.quote not in more and "\\" not in more else None
        if how.how != "strong" or how.partial:
            return None
        if how.word is not None and _SAFE_AFTER_WORD.fullmatch(more):
            grown = how.word + more
            return _Accepted("strong", False, grown) if grown not in _SPECIAL_WORDS else None
        if _SPACES.fullmatch(more):
            return _Accepted("strong", False, None)
        return None

    def _full(self, text: str) -> _Accepted | None:
        partial = False
        if self.clean:
            clean, partial = _clean(text)
            if not clean:
                return None
        if partial:
            return _Accepted("grown", True, None) if _partial_viable(text, self.reactive_module) else None
        how = _judge(text, self.reactive_module)
        if how is None:
            return None
        if how == "string":
            closer = _open_quote(text)
            return _Accepted(how, partial, None, closer if closer in ('"', "'") else None)
        word = None
        if how == "strong" and not partial:
            m = _WORD_END.search(text)
            # A whole name only: not the tail of a number (`12de` may become `12dec`) or of a dropped `@`.
            if m and (m.start() == 0 or text[m.start() - 1] not in "0123456789@") and m.group() not in _SPECIAL_WORDS:
                word = m.group()
        return _Accepted(how, partial, word)
