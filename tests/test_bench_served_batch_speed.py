"""bench/served_batch_speed.py: both arms each round in alternating order, and the summary of their times and
answers."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import served_batch_speed  # noqa: E402


def test_arms_alternate_and_the_summary_compares_them():
    asked = []

    def serve(max_batch):
        asked.append(max_batch)
        return ["a", "b", "c"] if max_batch == 1 else ["a", "b", "x"]

    runs = served_batch_speed.run_arms(["t1", "t2", "t3"], 3, serve,
                                       lambda served: {"same_result": 3, "same_text": served.count("x") and 2 or 3})
    assert asked == [1, 3, 3, 1, 1, 3]  # one at a time first in even rounds, batched first in odd ones
    assert [r["arm"] for r in runs[:2]] == ["one_at_a_time", "batched"] and runs[1]["same_text"] == 2
    for r, wall in zip(runs, [6.0, 2.0, 3.0, 5.0, 7.0, 2.5], strict=True):
        r["wall_s"] = wall
    out = served_batch_speed.summary(runs)
    assert out["wall_s"] == {"one_at_a_time": [6.0, 5.0, 7.0], "batched": [2.0, 3.0, 2.5]}
    assert out["median_wall_s"] == {"one_at_a_time": 6.0, "batched": 2.5} and out["speedup"] == 2.4
    assert out["arms_same_answers"] == 2
