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


def _bound_lora():
    import torch
    import transformers

    from mens.model.lora import attach_lora
    from mens.train import bf16_base

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = attach_lora(transformers.LlamaForCausalLM(cfg), r=2, alpha=4, dropout=0.0)
    return model, bf16_base.bind(model)


def test_the_bf16_base_switch_swaps_the_bound_weights_for_their_exact_f32_copies():
    """BF16_BASE is read once per run, so its other side is made on the bound model's weights."""
    import torch

    model, swapped = _bound_lora()
    switch, seen = ab.knob_switch("mens.train.bf16_base", "BF16_BASE", "off")
    assert seen == "auto" and len(swapped) == 7
    held = {base: base.weight for base, _ in swapped}
    switch("other", model)
    assert all(base.weight.dtype == torch.float32 and torch.equal(base.weight, w.float()) for base, w in held.items())
    switch("tree", model)
    assert all(base.weight is w for base, w in held.items())
    switch("other", model)
    switch("tree", None)  # after the run: no model at hand, the same weights go back
    assert all(base.weight is w for base, w in held.items())
    with pytest.raises(ValueError, match="'auto' against 'off'"):
        ab.knob_switch("mens.train.bf16_base", "BF16_BASE", "auto")


def test_the_bf16_base_switch_refuses_a_run_that_did_not_bind():
    import torch

    model, swapped = _bound_lora()
    for base, w in swapped:
        base.weight = w
    switch, _ = ab.knob_switch("mens.train.bf16_base", "BF16_BASE", "off")
    with pytest.raises(RuntimeError, match="did not bind"):
        switch("other", model)
    assert all(base.weight.dtype == torch.float32 for base, _ in swapped)
