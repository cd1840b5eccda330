"""Closing a budget-truncated Vox answer so that it parses."""

from __future__ import annotations

import pytest

from mens.lang import get_language

VOX = get_language("vox")
GOLDEN_LIKE = """@endpoint(kind: query)
fn get_items(limit: int) to list[int] {
    let xs = [1, 2, 3]
    if limit > 2 {
        return xs
    } else {
        return [limit, 2]
    }
}

component Row(label: str) {
    state open: bool = false
    view: row(class="p-2") {
        text() { label }
        button(on_click=fn() { open = not open }) { "toggle" }
    }
}
"""


@pytest.mark.parametrize("text", ["fn f(a: int) to int {\n    return a +", 'fn f() {\n  let s = "abc', "fn f(a",
                                  "type T {\n  a: int", "component C() {\n  view: column() {\n    text() { \"hi\""])
def test_unfinished_prefixes_get_closed(text):
    suffix = VOX.completion_suffix(text)
    assert suffix is not None and VOX.parse(text + suffix).has_code


def test_most_cuts_of_a_real_program_can_be_closed():
    cuts = [c for c in range(10, len(GOLDEN_LIKE)) if VOX.viable_prefix(GOLDEN_LIKE[:c])]
    closed = sum(VOX.completion_suffix(GOLDEN_LIKE[:c]) is not None for c in cuts)
    assert closed / len(cuts) >= 0.85, closed / len(cuts)  # best effort: a half keyword cannot be closed
