"""micro_batch: auto merges a step's passes where memory allows (the same rows, loss and update), measured from one
row's backward; CPU runs and several processes keep batch_size."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from safetensors.torch import load_file
from train_tiny import tiny_config

from mens.train import micro_batch
from mens.train.micro_batch import choose_micro_batch, fit_micro_batch, step_passes
from mens.train.run import run_training
from mens.train.text import Example


@pytest.mark.parametrize(("row_bytes", "budget", "want"), [
    (100, 10_000, 8),   # all 8 rows in one pass
    (100, 450, 4),      # the largest divisor of 8 that fits (5 would fit but leaves a ragged pass)
    (100, 150, 1),      # only the configured size
    (100, 50, 1),       # not even that: the setting stands
    (100, -5, 1),       # no budget at all (memory unknown)
])
def test_largest_divisor_that_fits(row_bytes, budget, want):
    assert choose_micro_batch(1, 8, row_bytes=row_bytes, budget_bytes=budget) == want


def test_a_fixed_cost_per_pass_counts_once():
    assert choose_micro_batch(1, 8, row_bytes=100, fixed_bytes=500, budget_bytes=950) == 4
    assert choose_micro_batch(1, 8, row_bytes=100, fixed_bytes=500, budget_bytes=550) == 1


def test_configured_size_is_the_floor():
    assert choose_micro_batch(2, 8, row_bytes=100, budget_bytes=150) == 2
    assert choose_micro_batch(2, 12, row_bytes=100, budget_bytes=650) == 6


def _row(n: int):
    return [Example(ids=list(range(n)), labels=[-100] + list(range(1, n)))]


def test_merged_passes_take_rows_longest_first_and_keep_every_row():
    rows = [_row(n) for n in (3, 9, 5, 7)]
    assert step_passes(rows, 2, merged=False) == [rows[:2], rows[2:]]
    merged = step_passes(rows, 2, merged=True)
    assert [[len(r[0].ids) for r in p] for p in merged] == [[9, 7], [5, 3]]


@pytest.mark.parametrize(("setting", "device", "world", "accum"), [
    ("fixed", "cuda", 1, 4), ("auto", "cpu", 1, 4), ("auto", "cuda", 2, 4), ("auto", "cuda", 1, 1)])
def test_batch_size_stands_where_merging_does_not_apply(setting, device, world, accum, monkeypatch):
    monkeypatch.setattr(micro_batch, "measure_pass", lambda *a, **k: pytest.fail("nothing to measure here"))
    n, why = fit_micro_batch(setting, model=None, rows=[_row(4)], batch_size=2, grad_accum=accum, world=world,
                             device=device, memory_gb=16.0, pad_id=0, autocast=contextlib.nullcontext)
    assert n == 2 and f"2 rows x {accum} passes" in why


def test_merged_run_trains_the_same_adapter(data_dir, tmp_path, tiny_model_dir, monkeypatch):
    """The loop with merged passes (forced here on CPU) ends with the adapter of the 1-row passes, and the run
    records how it split its steps."""
    outs = []
    for merged in (False, True):
        if merged:
            monkeypatch.setattr("mens.train.run.fit_micro_batch",
                                lambda *a, **k: (4, "4 rows x 1 passes (merged from 1 x 4: test)"))
        out = tmp_path / f"m{merged}"
        run_training(tiny_config(data_dir, out, tiny_model_dir, max_steps=3, batch_size=1, grad_accum=4,
                                 save_every=0, pack=False, lora_dropout=0.0))
        outs.append(load_file(str(out / "adapter_model.safetensors")))
        steps = json.loads((out / "training_manifest.json").read_text())["steps"]
        assert steps["micro_batch_rows"] == (4 if merged else 1) and steps["passes_per_step"] == (1 if merged else 4)
    diff = max((outs[0][k] - outs[1][k]).abs().max().item() for k in outs[0])
    assert diff < 1e-5, diff


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_measured_row_on_cuda(tiny_model_dir):
    from mens.model.load import load_base
    from mens.model.lora import attach_lora

    model = attach_lora(load_base(tiny_model_dir, backend="lora", device="cuda"), r=4, alpha=8, dropout=0.0)
    m = micro_batch.measure_pass(model, [_row(64)], pad_id=0, device="cuda", autocast=contextlib.nullcontext)
    assert m["pass"] > 0 and m["grads"] > 0 and all(p.grad is None for p in model.parameters())
    n, why = fit_micro_batch("auto", model=model, rows=[_row(64), _row(48), _row(32)], batch_size=1, grad_accum=4,
                             world=1, device="cuda", memory_gb=8.0, pad_id=0, autocast=contextlib.nullcontext)
    assert n == 4 and "two" in why and "merged from 1 x 4" in why
