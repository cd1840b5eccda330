"""Unit tests of the Vox lexer: longest match, keywords, decorators, dropped characters, literals, comments."""

from __future__ import annotations

from mens.lang.vox import lex
from mens.lang.vox import tokens as T


def kinds(text: str) -> list[str]:
    return lex(text).kinds[:-1]


def test_longest_match_and_keyword_vs_ident():
    toks = lex("is_empty empty fn fnx _ _x Foo")
    assert toks.kinds[:-1] == [T.IDENT, "empty", "fn", T.IDENT, "_", T.IDENT, T.TYPE_IDENT]
    assert toks.values[0] == "is_empty"


def test_multichar_punctuation():
    assert kinds("-> => |> == != <= >= += </>") == ["->", "=>", "|>", "==", "!=", "<=", ">=", "+=", "</>"]
    assert kinds("a||b") == [T.IDENT, "|", "|", T.IDENT]


def test_decorators_are_single_tokens_and_unknown_at_is_dropped():
    assert kinds("@mcp.tool @test @server") == ["@mcp.tool", "@test", T.IDENT]
    assert kinds("@testing") == ["@test", T.IDENT]


def test_unknown_characters_are_dropped():
    assert kinds("a && b; !c `d` $ ~") == [T.IDENT, T.IDENT, T.IDENT, T.IDENT]
    assert kinds("é") == []


def test_numbers():
    toks = lex("1 1.5 19.99dec 2dec 1. .5 1_000 1e5")
    assert toks.kinds[:-1] == [T.INT, T.FLOAT, T.DEC, T.DEC, T.INT, ".", ".", T.INT, T.INT, T.IDENT, T.INT, T.IDENT]
    assert toks.values[2] == "19.99"


def test_int_overflow_is_dropped():
    assert kinds("99999999999999999999 1") == [T.INT]


def test_strings_span_lines_and_keep_line_numbers():
    toks = lex('"a\nb" x\n\'c\' "unterminated')
    assert toks.kinds[:-1] == [T.STR, T.IDENT, T.NEWLINE, T.SSTR, T.IDENT]
    assert toks.values[0] == "a\nb"
    assert toks.lines[1] == 2 and toks.lines[3] == 3
    assert lex(r'"a\"b\n"').values[0] == 'a"b\n'


def test_comments():
    assert kinds("x // c\n# c2\ny") == [T.IDENT, T.NEWLINE, T.NEWLINE, T.IDENT]
    assert kinds("/* x */") == ["/", "*", T.IDENT, "*", "/"]


def test_crlf_and_eof_position():
    toks = lex("a\r\nb")
    assert toks.kinds == [T.IDENT, T.NEWLINE, T.IDENT, T.EOF]
    assert toks.offsets[-1] == 4 and toks.lines[-1] == 2
    assert toks.col(2) == 1
