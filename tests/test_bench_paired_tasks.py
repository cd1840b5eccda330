"""bench/paired_tasks.py: two dogfood records paired task by task, per split and summed over seeds."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import paired_tasks  # noqa: E402

import dogfood as dogfood_bench  # noqa: E402


def _rec(seed, heldout, features=None):
    rec = {"seed": seed, "failed_tasks": heldout}
    if features is not None:
        rec["features"] = {"failed_tasks": features}
    return rec


def test_sign_test_is_exact_and_two_sided():
    assert paired_tasks.sign_test_p(0, 0) == 1.0
    assert paired_tasks.sign_test_p(3, 3) == 1.0
    assert paired_tasks.sign_test_p(5, 0) == pytest.approx(2 / 32)  # all five moves one way
    assert paired_tasks.sign_test_p(0, 5) == paired_tasks.sign_test_p(5, 0)
    assert paired_tasks.sign_test_p(6, 1) == pytest.approx(2 * (1 + 7) / 128)


def test_pairs_name_the_tasks_gained_and_lost_and_sum_over_seeds(tmp_path, capsys):
    paths = []
    for name, rec in [("b0", _rec(0, {"a": "name", "b": "parse"}, {"f1": "contents"})),
                      ("a0", _rec(0, {"b": "parse", "c": "kind"}, {})),
                      ("b2", _rec(2, {"a": "name"}, {"f1": "contents", "f2": "parse"})),
                      ("a2", _rec(2, {}, {"f2": "parse"}))]:
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(rec))
        paths.append(str(p))
    out = tmp_path / "cmp.json"
    result = paired_tasks.main([*paths, "--json", str(out)])
    seed0, seed2 = result["pairs"]
    assert seed0["heldout"]["gained"] == ["a"] and seed0["heldout"]["lost"] == ["c"] and seed0["heldout"]["net"] == 0
    assert seed0["features"] == {"gained": ["f1"], "lost": [], "net": 1, "sign_test_p": 1.0}
    assert seed2["heldout"]["net"] == 1 and seed2["features"]["gained"] == ["f1"]
    assert result["summed"]["heldout"] == {"gained": 2, "lost": 1, "net": 1, "sign_test_p": 1.0}
    assert result["summed"]["features"]["gained"] == 2 and result["summed"]["features"]["lost"] == 0
    assert json.loads(out.read_text()) == result
    assert "seed 0 heldout: net +0 (gained 1: a; lost 1: c)" in capsys.readouterr().out


def test_unpaired_or_unlisted_records_are_refused_with_what_to_pass(tmp_path):
    a, b, old = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "old.json"
    a.write_text(json.dumps(_rec(0, {})))
    b.write_text(json.dumps(_rec(2, {})))
    old.write_text(json.dumps({"seed": 0, "failures_by_category": {}}))
    with pytest.raises(SystemExit, match="pair runs of the same seed"):
        paired_tasks.main([str(a), str(b)])
    with pytest.raises(SystemExit, match="before it listed them"):
        paired_tasks.main([str(a), str(old)])
    with pytest.raises(SystemExit, match="cannot read"):
        paired_tasks.main([str(a), str(tmp_path / "missing.json")])
    with pytest.raises(SystemExit):
        paired_tasks.main([str(a)])  # an odd count is a usage error


def test_dogfood_records_list_failed_tasks_except_on_the_confirmation_split(tmp_path, monkeypatch):
    out, run = tmp_path / "df", tmp_path / "df" / "run"
    out.mkdir(parents=True)
    (out / "dogfood_state.json").write_text(json.dumps({"config": {"modes": ["greedy"], "max_new_tokens": 200}}))
    (out / "dogfood_summary.json").write_text(json.dumps({"run": str(run)}))
    (out / "data").mkdir()
    (out / "data" / "train.jsonl").write_text("")
    ok = {"pass": True, "failures": []}
    bad = {"pass": False, "failures": [{"category": "name", "reason": "expected fn 'f'"}]}
    results = [{"id": "t2", "samples": [bad]}, {"id": "t1", "samples": [ok]}]

    def fake_run(cmd, **kw):
        Path(cmd[cmd.index("-o") + 1]).parent.mkdir(parents=True, exist_ok=True)
        Path(cmd[cmd.index("-o") + 1]).write_text(json.dumps(
            {"metrics": {"tasks": 2, "nonempty_parse_rate": 1.0, "pass_at_1": 0.5}, "modes": {}, "results": results}))

    monkeypatch.setattr(dogfood_bench.subprocess, "run", fake_run)
    assert dogfood_bench.split_eval(out, {}, dogfood_bench.FEATURES, "features")["failed_tasks"] == {"t2": "name"}
    assert "failed_tasks" not in dogfood_bench.split_eval(out, {}, dogfood_bench.CONFIRM, "confirm")
    assert dogfood_bench.failed_tasks({"results": results}) == {"t2": "name"}
    # pass@1 is the first answer's: a task whose later sample failed is not listed, one whose first did is
    assert dogfood_bench.failed_tasks({"results": [{"id": "t3", "samples": [ok, bad]},
                                                   {"id": "t4", "samples": [bad, ok]}]}) == {"t4": "name"}
