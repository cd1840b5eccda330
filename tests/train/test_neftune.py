"""NEFTune: noise on the input embeddings while training, none in eval mode, recorded in preflight and manifest."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from train_tiny import tiny_config

from mens.model.load import load_base
from mens.model.lora import attach_lora
from mens.train.preflight import Preflight
from mens.train.run import add_embedding_noise, run_training


def test_noise_only_in_training_mode_and_bounded(tiny_model_dir, tmp_path):
    model = attach_lora(load_base(tiny_model_dir, backend="lora", device="cpu"), r=4, alpha=8, dropout=0.0)
    emb = model.get_input_embeddings()
    ids = torch.tensor([[5, 17, 33, 2, 90, 41, 7, 8]])
    clean = emb(ids).detach()
    add_embedding_noise(model, 5.0, Preflight(tmp_path, write=False))
    model.eval()
    assert torch.equal(emb(ids), clean)
    model.train()
    noisy = emb(ids).detach()
    bound = 5.0 / (ids.shape[1] * clean.shape[-1]) ** 0.5
    diff = (noisy - clean).abs()
    assert 0 < diff.max().item() <= bound * (1 + 1e-6)
    assert diff.mean().item() > bound / 4  # uniform on [-bound, bound]: mean |noise| = bound / 2


def test_run_with_noise_trains_differently_and_records_it(data_dir, tmp_path, tiny_model_dir):
    plain, noisy = tmp_path / "plain", tmp_path / "noisy"
    run_training(tiny_config(data_dir, plain, tiny_model_dir, save_every=0))
    s = run_training(tiny_config(data_dir, noisy, tiny_model_dir, save_every=0, neftune_alpha=10.0))
    a, b = load_file(str(plain / "adapter_model.safetensors")), load_file(str(noisy / "adapter_model.safetensors"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) > 0
    assert s["val_loss"] is not None
    man = json.loads((noisy / "training_manifest.json").read_text())
    assert man["config"]["neftune_alpha"] == 10.0
    checks = json.loads((noisy / "training-preflight.json").read_text())["checks"]
    assert any(c["check"] == "embedding noise" and "alpha 10" in c["detail"] for c in checks)
