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


@pytest.mark.parametrize("text, suffix", [
    ("fn f(x: int) to int {\n    return x", "\n}"),
    ("fn f() {\n    let y = x +", " 0\n}"),
    ('fn f() to str {\n    return "ab', '"\n}'),
    ("fn f(a", ") {}"),
    ("fn f() {\n    if x", " {}\n}"),
    ("fn ad", None),  # a half-written name: no closing in a few parses (constrained decoding streams it later)
])
def test_closing_suffix_is_found_in_a_few_parses(text, suffix):
    assert VOX.closing_suffix(text) == suffix
    if suffix is not None:
        assert VOX.parse(text + suffix).has_code


def test_decorators_with_nothing_to_decorate_are_given_a_function():
    """An answer of decorators alone (a model looping on `@search(...)` until the budget) has no head to cut back
    to: the last resort closes it and adds the function they need, so it parses."""
    text = '@search("Severity")\n' * 3 + '@search("Sev'
    finished = VOX.finish_text(text)
    assert finished.startswith(text) and VOX.parse(finished).has_code


@pytest.mark.parametrize("text, suffix", [
    ("@require(x > 0)\n", "\nfn f() {}"),             # decorators waiting for their function
    ("fn f() to int {\n    let total", " = 0\n}"),    # a let waiting for its value
    ("fn f() {\n    foo.", "x\n}"),                   # a member waiting for its name
    ("fn f(x: int) to int {\n    return x", "\n}"),   # what closing_suffix closes, it closes the same way
])
def test_stream_closing_closes_more_prefixes_with_placeholders(text, suffix):
    assert VOX.stream_closing_suffix(text) == suffix and VOX.parse(text + suffix).has_code
    if not suffix.startswith("\n}"):
        assert VOX.closing_suffix(text) is None  # the narrow closing (when a model may stop) stays narrow


def test_stream_closing_leaves_fewer_cuts_of_a_real_program_waiting():
    cuts = range(1, len(GOLDEN_LIKE))
    narrow = sum(VOX.closing_suffix(GOLDEN_LIKE[:c]) is None for c in cuts)
    wide = sum(VOX.stream_closing_suffix(GOLDEN_LIKE[:c]) is None for c in cuts)
    assert wide < 0.8 * narrow, (wide, narrow)
