"""Viable-prefix check (constrained decoding): what can still become Vox, and what never can."""

from __future__ import annotations

import pytest

from mens.lang import get_language

VOX = get_language("vox")


@pytest.mark.parametrize("text", [
    "", "fn", "fn f() t", "fn f() -", "@te", "@sear", "rou", "fn f(a: int) to int {\n  return a +",
    'fn f() { let s = "abc', "type T = | A\n  | B(x: ", "@endpoint(kind: que", "component C() {\n  view: column(",
])
def test_viable(text):
    assert VOX.viable_prefix(text)


@pytest.mark.parametrize("text", [
    "fn 3", "fn 33", "fn f(3", "fn f() {\n return 1\n}\n}", "fn f() { x = }", "def f():", "x",
    "fn f() to int {\n  return a +\n", "fn f() {\n  a\n  + b", "@component fn F() {",
])
def test_not_viable(text):
    assert not VOX.viable_prefix(text)


def test_complete_programs_are_viable_prefixes():
    assert VOX.viable_prefix("fn add(a: int, b: int) to int {\n    return a + b\n}\n")


@pytest.mark.parametrize("text, clean", [
    ("@scheduled", True),
    ("@scheduled //", False),  # a comment: constrained decoding must continue the code instead
    ("fn f() to int {\n    // later\n", False),
    ("fn f() { # x", False),
    ('let s = "a // b # c"', True),  # inside a string it is text, not a comment
    ("fn half(x: int) to int {\n    return x / 2", True),
])
def test_clean_viable_prefix_refuses_comments(text, clean):
    from mens.lang.vox.prefix import clean_viable_prefix

    assert clean_viable_prefix(text) is clean
