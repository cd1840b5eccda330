"""Pairs: clean reparsed responses, natural varied prompts (deterministic by seed), tool traces, multi-turn."""

from __future__ import annotations

import json
from pathlib import Path

from mens.corpus.extract import extract_to_file
from mens.corpus.pairs import build_pairs
from mens.corpus.records import SCHEMA_VERSION, TrainPair, read_pairs
from mens.corpus.tool_trace import TOOL_PROMPT
from mens.corpus.validate import validate_file
from mens.lang import get_language

SRC = """// ---
// title: "Math"
// training_eligible: true
// ---
// @training_prompt: Write Vox helpers for integer math.
// ANCHOR: display
fn add(a: int, b: int) to int {
    return a + b
}

// Multiplies two integers.
fn mul(a: int, b: int) to int {
    return a * b
}
// ANCHOR_END: display
"""


def _pairs(tmp_path: Path, seed: int = 0, **kw) -> list[dict]:
    (tmp_path / "math.vox").write_text(SRC)
    extract_to_file([tmp_path / "math.vox"], tmp_path / "u.jsonl")
    validate_file(tmp_path / "u.jsonl", tmp_path / "v.jsonl")
    build_pairs(tmp_path / "v.jsonl", tmp_path / f"t{seed}.jsonl", seed=seed, **kw)
    return [json.loads(x) for x in (tmp_path / f"t{seed}.jsonl").read_text().splitlines()]


def test_responses_are_clean_code_that_parses(tmp_path: Path):
    rows = _pairs(tmp_path)
    vox = get_language("vox")
    for r in rows:
        assert r["schema_version"] == SCHEMA_VERSION and 1 <= r["rating"] <= 5 and r["lane"] == "vox_codegen"
        assert r["task_family"] == "vox_codegen"
        assert "@training_prompt" not in r["response"] and "ANCHOR" not in r["response"]
        assert "title:" not in r["response"] and vox.parse(r["response"]).has_code
        assert r["constructs"] == ["fn"] and r["source"].startswith(str(tmp_path))
        TrainPair.model_validate(r)


def test_prompts_are_natural_and_varied(tmp_path: Path):
    rows = _pairs(tmp_path)
    prompts = [r["prompt"] for r in rows]
    assert "Write Vox helpers for integer math." in prompts
    decl_prompts = [p for p, r in zip(prompts, rows, strict=True) if r["category"] == "vox_fn"]
    assert any("`add(a: int, b: int) to int`" in p for p in decl_prompts)
    assert any("Multiplies two integers." in p for p in decl_prompts)
    assert len(set(prompts)) == len(prompts) >= 6


def test_phrasing_is_deterministic_by_seed(tmp_path: Path):
    a, b = _pairs(tmp_path, seed=1), _pairs(tmp_path, seed=1)
    assert a == b
    c = _pairs(tmp_path, seed=7)
    assert [r["prompt"] for r in a] != [r["prompt"] for r in c]


def test_multi_turn_messages_end_with_parsing_assistant_turn(tmp_path: Path):
    rows = [r for r in _pairs(tmp_path, multi_turn=True) if "messages" in r]
    assert len(rows) == 1
    msgs = rows[0]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert get_language("vox").parse(msgs[-1]["content"]).decls == [("fn", "add"), ("fn", "mul")]


def test_tool_traces_and_aliases(tmp_path: Path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"task_prompt": "list files", "tool_name": "ls", "arguments_json": '{"dir": "."}',
                               "result_json": '["a"]', "success": True, "session_id": "s1"}) + "\n"
                   + json.dumps({"instruction": "say hi", "output": "fn hi() to str {\n    return \"hi\"\n}\n"}) + "\n")
    rep = build_pairs(inp, tmp_path / "t.jsonl")
    assert rep.n_used == 2
    rows = [p for _, p in read_pairs(tmp_path / "t.jsonl")]
    tool = rows[0]
    assert tool.prompt == TOOL_PROMPT.format(task="list files") and tool.category == "tool_trace"
    assert json.loads(tool.response) == {"tool_name": "ls", "arguments": {"dir": "."}, "result": ["a"],
                                         "success": True}
    assert tool.source == "tool_trace:s1" and tool.lane == "vox_tooling"
    assert rows[1].prompt == "say hi" and rows[1].response.startswith("fn hi")


def test_docs_option_adds_doc_context_pairs(tmp_path: Path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "page.md").write_text("# Page\n\n## Greeting\n\nGreet a user by name.\n\n```vox\n"
                                  "fn greet(n: str) to str {\n    return \"hi \" + n\n}\n```\n")
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt": "p", "response": "fn f() to int {\n    return 1\n}\n"}) + "\n")
    rep = build_pairs(inp, tmp_path / "t.jsonl", docs=[docs])
    rows = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    doc_rows = [r for r in rows if r["category"] == "documentation"]
    assert rep.n_doc_units == 1 and doc_rows and any("Greet a user by name." in r["prompt"] for r in doc_rows)
