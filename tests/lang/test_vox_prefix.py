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
