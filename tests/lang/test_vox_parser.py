"""Targeted Vox parser tests: newline rules, the `->` warning, tombstones, view-calls, modes, the interface."""

from __future__ import annotations

from mens.lang import get_language
from mens.lang.base import Language
from mens.lang.vox import VOX, parse, parse_file_text


def test_interface():
    assert isinstance(VOX, Language)
    assert get_language("vox") is VOX
    assert VOX.base_kind("fn[pub+async]") == "fn" and VOX.base_kind("endpoint[query]") == "endpoint"
    assert ".vox.ui" in VOX.file_extensions and VOX.fence_tags == ("vox",)
    assert "state_machine" in VOX.construct_kinds


def test_statements_need_no_separator():
    assert parse("fn main(){let x=10 return x}").ok


def test_infix_operator_does_not_continue_across_lines():
    assert parse("fn f() {\n let x = 1 +\n 2\n}").first_error.message == "Unexpected token in expression: <newline>"
    res = parse("fn f() {\n let x = 1\n + 2\n}")
    assert res.first_error.line == 3


def test_body_brace_must_be_on_header_line_but_else_may_move():
    assert parse("fn f()\n{ }").first_error.message == "Expected {, found <newline>"
    assert parse("fn f() {\n if a { 1 }\n else { 2 }\n}").ok


def test_arrow_return_type_is_a_warning():
    res = parse("fn f() -> int { return 1 }")
    assert res.ok and res.decls == [("fn", "f")]
    assert [d.severity for d in res.diagnostics] == ["warning"]
    assert not parse("fn f() { match x { 1 -> 2 } }").ok


def test_tombstones():
    for src, tok in (("http get \"/\" to T {}", "http"), ("@component fn A() {}", "@component")):
        err = parse(src).first_error
        assert err.cls == "Tombstoned" and f"`{tok}`" in err.message


def test_view_calls():
    src = ("component C() {\n view: column(gap=2) {\n  text() { \"hi\" }\n"
           "  button(on_click=fn() { n = n + 1 }) { \"+\" }\n }\n}")
    assert parse(src).decls == [("component", "C")]
    # The trap: a view-call in an `if` condition takes the `{` as its children.
    assert not parse("fn f() { if text(a=1) { return 1 } }").ok
    assert parse("fn f() { if check(1) { return 1 } }").ok


def test_decl_spellings():
    src = ("pub fn a() {}\nasync fn b() {}\n@endpoint(kind: query) fn c() {}\ntype P { x: int }\ntype E = | A | B\n"
           "@table type T { x: int }\nimport a/b as { X, Y }\nroutes { \"/\" to Home }\n@back_button { on_press: go }")
    assert parse(src).decls == [
        ("fn[pub]", "a"), ("fn[async]", "b"), ("endpoint[query]", "c"), ("type_struct", "P"), ("type_adt", "E"),
        ("table", "T"), ("import", "a.b.X,a.b.Y"), ("routes", "1 entries"), ("back_button", ""),
    ]


def test_script_mode_and_reactive_modules():
    assert not parse("let x = 1\nprint(x)").ok
    assert parse("let x = 1\nprint(x)", mode="script").ok
    ui = "state count: int = 0\nfn inc() { count = count + 1 }"
    assert not parse(ui).ok
    assert parse_file_text(ui, "counter.vox.ui").decls == [("reactive_module", ""), ("fn", "inc")]
    assert VOX.parse(ui, kind="reactive_module").ok


def test_diagnostic_positions_are_one_based():
    err = parse("fn f() {\n  let = 1\n}").first_error
    assert (err.line, err.col, err.cls) == (2, 7, "Statement")
    assert err.to_json()["class"] == "Statement"
