"""data.pack_shuffle: packing in a seeded random order spreads a request's phrasings over rows."""

from __future__ import annotations

import json

from train_tiny import tiny_config

from mens.train.data import packing_order
from mens.train.preflight import Preflight
from mens.train.run import prepare_inputs
from mens.train.text import IGNORE


def _answer(ex) -> tuple[int, ...]:
    return tuple(t for t in ex.labels if t != IGNORE)


def _inputs(tmp_path, model_dir, shuffle: bool, seed: int = 0):
    cfg = tiny_config(tmp_path / "data", tmp_path / f"out-{shuffle}-{seed}", model_dir, seq_len=256,
                      pack_shuffle=shuffle, seed=seed)
    return prepare_inputs(cfg, Preflight(tmp_path / "pf", write=False), world=1)


def test_packing_order_is_a_seeded_permutation():
    items = list(range(50))
    assert sorted(packing_order(items, 3)) == items
    assert packing_order(items, 3) == packing_order(items, 3)
    assert packing_order(items, 3) != packing_order(items, 4) != items


def test_pack_shuffle_packs_the_same_examples_with_phrasings_apart(tmp_path, tiny_model_dir):
    # three phrasings of each program, next to each other as dogfood writes them
    rows = [{"prompt": f"Phrasing {k}: write a function f{i} that adds {i}.",
             "response": f"fn f{i}(a: int) -> int {{\n    return a + {i}\n}}"} for i in range(20) for k in range(3)]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    def repeats(inp) -> int:  # examples that share their row with another phrasing of the same program
        return sum(len(row) - len({_answer(ex) for ex in row}) for row in inp.rows)

    def packed(inp) -> list[tuple]:
        return sorted((ex.ids, ex.labels) for row in inp.rows for ex in row)

    in_file_order, shuffled = _inputs(tmp_path, tiny_model_dir, False), _inputs(tmp_path, tiny_model_dir, True)
    assert packed(shuffled) == packed(in_file_order)  # the same training examples, only grouped differently
    assert repeats(in_file_order) > 2 * repeats(shuffled)
    assert in_file_order.val == shuffled.val  # the validation split does not depend on the packing order
    again = _inputs(tmp_path, tiny_model_dir, True)
    assert [[ex.ids for ex in row] for row in again.rows] == [[ex.ids for ex in row] for row in shuffled.rows]
    other_seed = _inputs(tmp_path, tiny_model_dir, True, seed=1)
    assert [[ex.ids for ex in row] for row in other_seed.rows] != [[ex.ids for ex in row] for row in shuffled.rows]
