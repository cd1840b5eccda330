"""bench/step_ab.py: a knob is MODULE:NAME=VALUE, its switch sets the other value and puts the tree's back, and a
malformed or unknown knob is an error instead of a comparison of a setting with itself."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

ab = pytest.importorskip("step_ab")


def test_a_knob_parses_to_module_name_and_a_python_value():
    assert ab.parse_knob("mens.train.segment_attention:F32_ATTENTION_MAX_TOKENS=0") == (
        "mens.train.segment_attention", "F32_ATTENTION_MAX_TOKENS", 0)
    assert ab.parse_knob("mens.train.loss:FUSED_CE='off'")[2] == "off"
    assert ab.parse_knob("mens.train.loss:FUSED_CE=off")[2] == "off"
    for bad in ("mens.train.loss:FUSED_CE", "FUSED_CE=off", "mens.train.loss:not a name=1"):
        with pytest.raises(ValueError, match="MODULE:NAME=VALUE"):
            ab.parse_knob(bad)


def test_the_switch_sets_the_other_value_and_restores_the_trees():
    from mens.train import segment_attention

    tree = segment_attention.F32_ATTENTION_MAX_TOKENS
    switch, seen = ab.knob_switch("mens.train.segment_attention", "F32_ATTENTION_MAX_TOKENS", 0)
    try:
        assert seen == tree
        switch("other")
        assert segment_attention.F32_ATTENTION_MAX_TOKENS == 0
    finally:
        switch("tree")
    assert segment_attention.F32_ATTENTION_MAX_TOKENS == tree
    with pytest.raises(ValueError, match="has no"):
        ab.knob_switch("mens.train.segment_attention", "NO_SUCH_KNOB", 1)
