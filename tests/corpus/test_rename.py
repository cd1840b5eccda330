"""Renamed copies of training pairs (mens.corpus.rename): names change alike in request and answer, only names the
answer declares and the request spells out, never prose or string text, and the copy always parses."""

import random

from mens.corpus.rename import WORDS, fresh_name, renamed_copies, renamed_pair
from mens.lang import get_language

VOX = get_language("vox")

COMPONENT = ("Write a Contact page (component Contact with a heading) and routes sending \"/contact\" to it.",
             'component Contact() {\n    view: heading(level=1) { "Contact us" }\n}\n\nroutes {\n'
             '    "/contact" to Contact\n}\n')


def test_renames_alike_in_prompt_and_answer_but_not_string_text():
    prompt, response, mapping = renamed_pair(*COMPONENT, VOX, random.Random(0))
    new = mapping["Contact"]
    assert new != "Contact" and new[0].isupper() and "_" not in new
    assert f"component {new}() " in response and f'"/contact" to {new}' in response
    assert '"Contact us"' in response  # the heading's text is prose
    assert prompt == COMPONENT[0].replace("Contact", new)
    assert VOX.parse(response).decls[0] == ("component", new)


def test_a_plain_word_is_renamed_only_where_the_prompt_writes_it_as_code():
    code = "fn add(a: int, b: int) to int {\n    return a + b\n}\n"
    prompt, response, mapping = renamed_pair("Write add(a: int, b: int) to int.", code, VOX, random.Random(1))
    assert list(mapping) == ["add"] and mapping["add"] in prompt and f"fn {mapping['add']}(" in response
    # "add" is also the prose verb here: renaming it would change what is asked, so the pair is left alone
    assert renamed_pair("Write a function add that will add a and b.", code, VOX, random.Random(1)) is None


def test_member_calls_and_undeclared_names_are_kept():
    code = ("@table type Post {\n    title: str\n}\n\n@endpoint(kind: query)\nfn count_posts() to int {\n"
            "    return len(db.Post.all())\n}\n")
    prompt = "Write a query endpoint count_posts() to int over the Post table, using len()."
    new_prompt, response, mapping = renamed_pair(prompt, code, VOX, random.Random(2))
    assert set(mapping) == {"Post", "count_posts"}
    assert f"db.{mapping['Post']}.all()" in response and "len(" in response and "len()" in new_prompt
    assert VOX.parse(response).ok


def test_nothing_to_rename_or_an_answer_that_does_not_parse_gives_none():
    assert renamed_pair("Write a greeting function.", 'fn hello() to str {\n    return "hi"\n}\n', VOX,
                        random.Random(0)) is None
    assert renamed_pair("Write fn broken_one().", "fn broken_one( {", VOX, random.Random(0)) is None


def test_fresh_names_keep_the_shape_and_avoid_taken_names():
    rng = random.Random(3)
    for name in ("normalize_tag", "abs_never_negative", "SearchBox", "User", "clamp"):
        new = fresh_name(name, rng, {"normalize_tag"})
        assert new and new != name and new.isidentifier()
        assert new[0].isupper() == name[0].isupper() and ("_" in new) == (not name[0].isupper())
    every = {f"{w}_clamp" for w in WORDS} | {f"clamp_{w}" for w in WORDS}
    assert fresh_name("clamp", random.Random(0), every) is None


def test_copies_are_deterministic_pass_by_pass_and_keep_unrenamable_rows():
    rows = [{"prompt": COMPONENT[0], "response": COMPONENT[1], "source": "a"},
            {"prompt": "Write a greeting function.", "response": 'fn hello() to str {\n    return "hi"\n}\n',
             "source": "b"}]
    out, n = renamed_copies(rows, 2, seed=7, lang=VOX)
    assert n == 2 and [r["source"] for r in out] == ["a", "b", "a", "b"]
    assert out[1] == rows[1] and out[3] == rows[1] and "renamed" not in out[1]
    assert out[0]["renamed"] and out[2]["renamed"]
    again, _ = renamed_copies(rows, 2, seed=7, lang=VOX)
    assert again == out
    other, _ = renamed_copies(rows, 2, seed=8, lang=VOX)
    assert [r["prompt"] for r in other] != [r["prompt"] for r in out]
