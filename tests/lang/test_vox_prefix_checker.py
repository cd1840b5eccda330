"""The incremental prefix checker: the same verdicts as `clean_viable_prefix`, most of them without a parse; and
the verdicts constrained decoding depends on (strings, names that start like keywords, style blocks)."""

from __future__ import annotations

import random
import re

import pytest

from mens.lang import get_language
from mens.lang.vox.prefix import PrefixChecker, clean_viable_prefix, viable_prefix

VOX = get_language("vox")

PROGRAMS = [
    'fn is_leap_year(year: int) to bool {\n    if year % 4 == 0 {\n        return year % 100 != 0\n    }\n'
    '    return false\n}\n',
    'fn check_username(name: str) to Result[str] {\n    if len(name) < 3 {\n        return Error("too short, it\'s '
    '#1 // not a comment")\n    }\n    return Ok(name)\n}\n',
    "fn greet(who: str) to str {\n    let s = 'hi ' + who\n    return s\n}\n",
    'component Card(title: str) {\n    state open: bool = false\n    view: column(raw_class="card") {\n'
    '        text() { title }\n    }\n}\nstyle {\n    .card {\n        color: "red"\n        margin: "0"\n    }\n}\n'
    'raw_css {\n    .x { color: "blue" }\n}\n',
    "@endpoint(kind: query)\nfn get_item(id: int) to str {\n    return \"item\"\n}\n",
]
# Pieces shaped like BPE tokens (a word with its space, digits, runs of spaces, one character), and odd candidates a
# sampler might try next.
_PIECES = re.compile(r" ?[A-Za-z_]+|[0-9]+|[ \t]+|\n|.")
_ODD = [" ", "x", "_y", "is", "in", "\n", "(", ")", "{", "}", '"', "'", "//", "#", "@", "!", "1", ".", ";", "style"]


def _decode_like(checker, programs, seed=0):
    """Feed each program's growing prefixes, and an odd candidate before each real one, as a decoder would."""
    rng = random.Random(seed)
    for prog in programs:
        text = ""
        for piece in _PIECES.findall(prog):
            for cand in (text + rng.choice(_ODD), text + piece[: max(1, len(piece) // 2)], text + piece):
                yield cand, checker(cand)
            text += piece


def test_checker_verdicts_equal_the_reference_on_every_prefix():
    checker = PrefixChecker()
    seen = 0
    for text, verdict in _decode_like(checker, PROGRAMS):
        assert verdict == clean_viable_prefix(text), repr(text)
        seen += 1
    assert seen > 600
    assert checker.counts["fast"] + checker.counts["memo"] > checker.counts["full"] / 4  # many skip the parser


def test_checker_agrees_on_real_programs(shared_vox):
    programs = [p.read_text(encoding="utf-8", errors="replace")[:1500]
                for p in sorted((shared_vox / "examples" / "golden").rglob("*.vox"))[:12]]
    for text, verdict in _decode_like(PrefixChecker(), programs, seed=1):
        assert verdict == clean_viable_prefix(text), repr(text[-80:])


def test_growing_a_string_or_a_name_needs_no_parse():
    checker = PrefixChecker()
    assert checker('fn f() to str {\n    return "')
    full = checker.counts["full"]
    for i in range(1, 30):
        assert checker('fn f() to str {\n    return "' + "a b,c" * i)
    assert checker("fn count")
    full_after_string = checker.counts["full"]
    assert full_after_string == full + 1  # the name's first spelling only
    for tail in ("_p", "_po", "_pos", "_positive"):
        assert checker("fn count" + tail)
    assert checker.counts["full"] == full_after_string


@pytest.mark.parametrize("text", [
    'fn f() to str {\n    return "',  # an open string may hold anything: the lexer only drops an unclosed quote
    'fn f() to str {\n    return Error("too',
    "fn f() to str {\n    return 'it",
    "fn is",  # a keyword can be the start of a name: `is_leap_year`
    "fn in",
    "fn f(a: int) to int {\n    let mut",
    'component A() {\n    view: column() { "a" }\n}\nstyle',  # a style block may follow a component
    'component A() {\n    view: column() { "a" }\n}\nstyle {\n    .card {\n        color: "red"\n',
])
def test_viable_and_clean(text):
    assert viable_prefix(text) and clean_viable_prefix(text) and PrefixChecker()(text)


@pytest.mark.parametrize("text", [
    "@v0!",  # `!=` cannot follow `@v0`, and a lone `!` is dropped by the lexer: a dead end
    "fn f() {\n    x ;",
    "fn f() {\n    // note",
])
def test_not_clean(text):
    assert not clean_viable_prefix(text) and not PrefixChecker()(text)


def test_a_rule_written_inside_a_rule_parses_as_upstream_reads_it():
    """Upstream's style parser reads a rule inside a rule as the next rule, and the outer rule's `}` then closes
    the block; anything unexpected ends the block quietly. The frontend refused this; constrained decoding with
    it could not write a valid style block."""
    head = 'component A() {\n    view: column(raw_class="card") { "hello" }\n}\n'
    nested = (head + 'style {\n    .card {\n        color: "red"\n        .title { color: "blue" }\n}\n'
              "fn f() to int {\n    return 1\n}\n")
    result = VOX.parse(nested)
    assert result.ok and result.decls == [("component", "A"), ("fn", "f")]
    assert VOX.parse(head + "style\n").ok  # `style` with no block: upstream takes the word and moves on
    # what upstream refuses stays refused: the same rule nested with balanced braces leaves a `}` at top level
    assert not VOX.parse(head + 'style {\n    .card {\n        .title { color: "blue" }\n    }\n}\n').ok
    assert not VOX.parse(head + "style {\n    .card { color: red }\n}\n").ok  # values are strings
    checker = PrefixChecker()
    assert all(checker(nested[:i]) for i in range(len(nested) + 1))


@pytest.mark.parametrize("text", [
    'routes {\n    "',  # a route's path string: then `to` (a keyword no fixed probe spells)
    "pub", "async", "state_machine S {\n    state A\n    terminal",  # keywords that must be followed by a keyword
    "fn f() to float {\n    return 0.",  # the start of a float
    'fn f() to str {\n    return "https://example.com/#top',  # comment marks inside a string are its text
    'fn f() to str {\n    return "a\\',  # an escape being written
    "@mcp.",
])
def test_prefixes_of_valid_code_that_were_refused(text):
    assert viable_prefix(text) and clean_viable_prefix(text) and PrefixChecker()(text)


@pytest.mark.slow
def test_every_prefix_of_the_corpus_that_parses_is_viable(shared_vox):
    """No valid Vox is forbidden: each token-like prefix of every parsing corpus file is viable (clean-viable where
    the file has nothing the lexer drops), so constrained decoding can write any of them."""
    import json

    from mens.lang.vox.lexer import comment_offsets, sloppy_offsets

    refused = []
    for line in (shared_vox / "expected_parse_results.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["kind"] != "file" or not row["parse_ok"] or row["path"].endswith(".vox.ui"):
            continue
        prog = (shared_vox / row["path"]).read_text(encoding="utf-8", errors="replace")[:2500]
        if not VOX.parse(prog).ok:
            continue
        clean = not comment_offsets(prog) and not sloppy_offsets(prog)
        check = PrefixChecker(clean=clean)
        text = ""
        for piece in _PIECES.findall(prog):
            text += piece
            if not check(text):
                refused.append(f"{row['path']}: {text[-60:]!r}")
                break
    assert refused == []
