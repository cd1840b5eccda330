"""The held-out split: training pairs that copy a held-out answer or prompt are dropped, and said why."""

from __future__ import annotations

import json

import pytest

from mens.dogfood.heldout import PROMPT_NEAR_DUP, code_hash, decontaminate, heldout_tasks, split_training_data
from mens.errors import UsageError
from mens.evaluate.bench import load_bench, load_references

HELD = "fn-count-positive"
"""A task of the held-out split."""


def test_code_hash_ignores_comments_and_layout():
    a = "fn add(a: int, b: int) to int {\n    return a + b\n}\n"
    b = "// adds\nfn add(a: int,   b: int) to int { return a + b }"
    assert code_hash(a) == code_hash(b)
    assert code_hash(a) != code_hash(a.replace("a + b", "a - b"))


def test_every_default_task_has_a_reference_answer():
    tasks, refs = heldout_tasks(None, "heldout")
    assert len(tasks) >= 40 and set(refs) == {t.id for t in tasks}
    assert len(load_references()) == len(load_bench())


def test_decontaminate_drops_same_code_and_near_duplicate_prompts():
    tasks, refs = heldout_tasks(None, "heldout")
    task = next(t for t in tasks if t.id == HELD)
    rows = [
        {"prompt": "Count some ints in Vox.", "response": "// copy\n" + refs[HELD]},  # same code, other prompt
        {"prompt": task.prompt + " Please.", "response": "fn plus(x: int) to int {\n    return x\n}\n"},
        {"prompt": "Write a Vox struct for a sensor.", "response": "type Sensor {\n    id: int\n}\n"},
        {"messages": [{"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "```vox\n" + refs[HELD] + "```"}]},
    ]
    kept, rep = decontaminate(rows, tasks, refs)
    assert kept == [rows[2]]
    reasons = [(d["row"], d["reason"], d["task"]) for d in rep.dropped]
    assert reasons == [(0, "same code as held-out answer", HELD), (1, "near-duplicate prompt", HELD),
                       (3, "same code as held-out answer", HELD)]
    assert rep.rows_in == rep.kept + len(rep.dropped)
    assert rep.max_prompt_similarity < PROMPT_NEAR_DUP


def test_split_writes_bench_references_and_clean_data(tmp_path):
    mixed = tmp_path / "mixed.jsonl"
    refs = load_references()
    rows = [{"prompt": "Count the positive numbers in Vox.", "response": refs[HELD]},
            {"prompt": "Declare a Vox type Point with x and y.", "response": "type Point {\n    x: int\n}\n"}]
    mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = split_training_data(mixed, tmp_path / "train.jsonl", None, "heldout", tmp_path / "bench" / "heldout.jsonl",
                              tmp_path / "split.json")
    assert rep.kept == 1 and len(rep.dropped) == 1
    bench = load_bench(tmp_path / "bench" / "heldout.jsonl")
    assert {t.split for t in bench} == {"heldout"} and len(bench) == rep.heldout_tasks
    assert load_references(tmp_path / "bench" / "heldout.jsonl")[HELD] == refs[HELD]
    assert json.loads((tmp_path / "split.json").read_text())["dropped"] == 1


def test_dogfood_corpus_stages_take_a_users_vox_checkout(tmp_path, shared_vox):
    """`--corpus PATH` adds a real checkout (here the shared examples and docs) to the embedded corpus; every
    unit ends kept or rejected with a reason, and the held-out split still removes overlaps."""
    from mens.dogfood import stages
    from mens.dogfood.pipeline import Context, DogfoodConfig

    cfg = DogfoodConfig(output_dir=tmp_path / "df", corpus=[shared_vox / "examples", shared_vox / "docs"], quick=True)
    cfg.output_dir.mkdir()
    ctx = Context(cfg, log=lambda _: None)
    for stage in (stages.extract, stages.validate, stages.pairs, stages.generate, stages.mix, stages.heldout):
        stage(ctx)
    report = json.loads((cfg.output_dir / "corpus/validate_report.json").read_text())
    assert report["reconciled"] and report["total_input_records"] > 300  # far more than the 100 embedded units
    sources = {json.loads(line)["source"].split("/")[0] for line in (cfg.output_dir / "corpus/units.jsonl").open()}
    assert len(sources) > 1
    split = json.loads((cfg.output_dir / "data/heldout_split.json").read_text())
    assert split["kept"] + split["dropped"] == split["rows_in"] and split["kept"] > 1000


def test_dev_pairs_are_the_dev_split_and_never_a_heldout_task():
    from mens.dogfood.heldout import dev_pairs
    from mens.dogfood.pipeline import DogfoodConfig

    rows = dev_pairs(None, "vox")
    dev, _ = heldout_tasks(None, "dev")
    held, held_refs = heldout_tasks(None, "heldout")
    assert len(rows) == len(dev) > 0 and all(r["source"].startswith("bench-dev:") for r in rows)
    assert {r["prompt"] for r in rows}.isdisjoint(t.prompt for t in held)
    assert {code_hash(r["response"]) for r in rows}.isdisjoint(code_hash(a) for a in held_refs.values())
    _, split = decontaminate(rows, held, held_refs)  # the same check dogfood runs over every training row
    assert split.kept == len(rows)
    assert DogfoodConfig(output_dir="x").dev_pairs  # one round: the dev split is training data
    assert not DogfoodConfig(output_dir="x", rounds=2).dev_pairs  # two rounds: it is round 2's probe


def test_renamed_repeats_keep_the_mix_size_and_rename_only_repeats(tmp_path):
    """--renamed-dev changes names in the dev split's repeats, never how many rows the mix holds; the first copy
    of each dev pair stays as written, and every renamed row parses."""
    from mens.dogfood import stages
    from mens.dogfood.pipeline import Context, DogfoodConfig
    from mens.lang import get_language

    def mixed(name: str, **flags) -> list[dict]:
        cfg = DogfoodConfig(output_dir=tmp_path / name, quick=True, **flags)
        cfg.output_dir.mkdir()
        ctx = Context(cfg, log=lambda _: None)
        for stage in (stages.extract, stages.validate, stages.pairs, stages.generate, stages.mix):
            stage(ctx)
        return [json.loads(line) for line in (cfg.output_dir / "corpus/mixed.jsonl").open()]

    plain, renamed = mixed("plain"), mixed("renamed", renamed_dev=True)
    assert len(renamed) == len(plain)
    assert [r["source"] for r in renamed] == [r["source"] for r in plain]
    changed = [(a, b) for a, b in zip(plain, renamed, strict=True) if a != b]
    assert changed and all(b.get("renamed") for _, b in changed)
    vox = get_language("vox")
    assert all(vox.parse(b["response"]).ok for _, b in changed)
    dev_sources = {r["source"] for r in plain if r["source"].startswith("bench-dev:")}
    first_dev = {}
    for a, b in zip(plain, renamed, strict=True):
        if a["source"] in dev_sources and a["source"] not in first_dev:
            first_dev[a["source"]] = (a, b)
    assert all(a == b for a, b in first_dev.values())  # each dev pair's first copy is as written
    assert all(b["source"].startswith("bench-dev:") for _, b in changed)
    with pytest.raises(UsageError, match="--renamed-dev"):
        DogfoodConfig(output_dir=tmp_path / "none", renamed_dev=True, dev_pairs=False)
