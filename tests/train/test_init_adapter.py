"""A second round of training starts from the first round's adapter (`init_adapter`), not from a fresh init."""

from __future__ import annotations

import pytest
from train_tiny import tiny_config

from mens.errors import ModelError
from mens.train.run import run_training


def _tensors(run):
    from safetensors.torch import load_file

    return load_file(str(run / "adapter_model.safetensors"))


def test_second_round_starts_from_the_first_rounds_adapter(data_dir, tiny_model_dir, tmp_path):
    first = tmp_path / "r1"
    run_training(tiny_config(data_dir, first, tiny_model_dir, save_every=0))
    a = _tensors(first)
    # a step with a vanishing learning rate leaves the start point visible in the saved adapter
    second = tmp_path / "r2"
    run_training(tiny_config(data_dir, second, tiny_model_dir, save_every=0, max_steps=1, learning_rate=1e-12,
                             init_adapter=str(first), seed=7))
    b = _tensors(second)
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
    fresh = tmp_path / "fresh"
    run_training(tiny_config(data_dir, fresh, tiny_model_dir, save_every=0, max_steps=1, learning_rate=1e-12, seed=7))
    assert max(float((a[k] - _tensors(fresh)[k]).abs().max()) for k in a) > 1e-3  # without it: a new init


def test_init_adapter_with_another_rank_is_refused(data_dir, tiny_model_dir, tmp_path):
    first = tmp_path / "r1"
    run_training(tiny_config(data_dir, first, tiny_model_dir, save_every=0, max_steps=1))
    with pytest.raises(ModelError, match="same base, rank"):
        run_training(tiny_config(data_dir, tmp_path / "r2", tiny_model_dir, r=8, init_adapter=str(first)))
    with pytest.raises(ModelError, match="no adapter_model"):
        run_training(tiny_config(data_dir, tmp_path / "r3", tiny_model_dir, init_adapter=str(tmp_path)))
