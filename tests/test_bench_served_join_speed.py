"""bench/served_join_speed.py: requests are sent one gap apart, each from its own thread, and the summary compares
the arms' latencies."""

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import served_join_speed  # noqa: E402


def test_requests_are_sent_a_gap_apart_and_timed_from_their_own_sending():
    sent = {}

    def ask(i):
        sent[i] = time.perf_counter()
        time.sleep(0.05 * (3 - i))
        return f"answer {i}"

    got = served_join_speed.staggered(ask, 3, 0.1)
    assert [text for text, _ in got] == ["answer 0", "answer 1", "answer 2"]
    assert 0.08 < sent[1] - sent[0] < 0.2 and 0.08 < sent[2] - sent[1] < 0.2
    assert got[0][1] > got[1][1] > got[2][1]  # each timed from its own sending: 0.15, 0.1 and 0.05 s


def test_a_failed_request_is_raised():
    def ask(i):
        if i == 1:
            raise RuntimeError("boom")
        return "ok"

    with pytest.raises(RuntimeError, match="boom"):
        served_join_speed.staggered(ask, 2, 0.0)


def test_summary_takes_medians_per_arm_and_the_ratio():
    runs = [{"arm": "join", "mean_latency_s": 2.0, "max_latency_s": 4.0, "wall_s": 10.0},
            {"arm": "next_batch", "mean_latency_s": 5.0, "max_latency_s": 9.0, "wall_s": 12.0},
            {"arm": "next_batch", "mean_latency_s": 7.0, "max_latency_s": 11.0, "wall_s": 14.0},
            {"arm": "join", "mean_latency_s": 3.0, "max_latency_s": 6.0, "wall_s": 10.0}]
    out = served_join_speed.summary(runs)
    assert out["arms"]["join"] == {"mean_latency_s": 2.5, "max_latency_s": 5.0, "wall_s": 10.0}
    assert out["next_batch_over_join"] == {"mean_latency_s": 2.4, "max_latency_s": 2.0, "wall_s": 1.3}
